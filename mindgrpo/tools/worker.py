"""A tool worker process: `python -m mindgrpo.tools.worker TASKS_FD RESULTS_FD PARENT_PID`.

Started by mindgrpo/tools/pool.py, never forked from the trainer; frames as mindgrpo/utils/frames.py writes them:

    <- ({name: (origin, settings)}, max_chars)   set-up: load each tool (its plugin file or module)
    -> ("ready",) | ("setup_error", message)
    <- (key, name, arguments)              one call (already checked against the tool's schema)
    -> (key, ToolResult)

Its temporary files (the python tool's scratch directories) go under $TMPDIR, a directory of its own that the
pool removes. It exits when TASKS_FD closes, and when its parent dies (parent-death signal).
"""

from __future__ import annotations

import functools
import json
import signal
import sys
import time

from mindgrpo.utils.frames import recv_frame, send_frame
from mindgrpo.utils.process import die_with_parent


def _load(spec: dict) -> dict:
    import importlib

    from mindgrpo.tools.registry import check_settings, get_tool, load_tool_plugin

    fns = {}
    for name, ((kind, where), settings) in spec.items():
        if kind == "plugin":
            load_tool_plugin(where)
        else:
            importlib.import_module(where)
        check_settings(name, settings)
        fns[name] = functools.partial(get_tool(name).fn, **settings)
    return fns


def run_tool(fn, arguments: dict, max_chars: int):
    """One call: a ToolResult, whatever the tool does short of killing the process; a response over
    max_chars characters is an error showing its first max_chars."""
    from mindgrpo.tools.calls import ToolResult
    from mindgrpo.tools.registry import ToolFailure, ToolTimeout

    start = time.monotonic()
    try:
        value = fn(**arguments)
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        if len(text) > max_chars:
            return ToolResult("error", f"the output is over {max_chars} characters ({len(text)}); its start:\n"
                              + text[:max_chars], time.monotonic() - start)
        return ToolResult("ok", text, time.monotonic() - start)
    except ToolTimeout as error:
        return ToolResult("timeout", str(error), time.monotonic() - start)
    except ToolFailure as error:
        return ToolResult("error", str(error), time.monotonic() - start)
    except Exception as error:  # noqa: BLE001 - a tool's bug is the model's error message, not the run's end
        return ToolResult("error", f"{type(error).__name__}: {error}", time.monotonic() - start)


def main(argv) -> int:
    tasks, results, parent = (int(a) for a in argv)
    die_with_parent(parent, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            spec, max_chars = recv_frame(tasks)
            fns = _load(spec)
        except Exception as error:  # noqa: BLE001 - reported to the parent, which stops the run with it
            send_frame(results, ("setup_error", f"{type(error).__name__}: {error}"))
            return 1
        send_frame(results, ("ready",))
        while True:
            task = recv_frame(tasks)
            if task is None:
                return 0
            key, name, arguments = task
            send_frame(results, (key, run_tool(fns[name], arguments, max_chars)))
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
