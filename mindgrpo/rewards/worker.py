"""A reward worker process: `python -m mindgrpo.rewards.worker TASKS_FD RESULTS_FD PARENT_PID`.

Started by mindgrpo/rewards/pool.py, never forked from the trainer. It reads pickled frames from TASKS_FD
and writes pickled frames to RESULTS_FD (stdout is free for the reward functions' prints):

    <- {name: (origin, parameters)}        set-up: load each reward (its plugin file or module), bind it
    -> ("ready",) | ("setup_error", message)
    <- (name, completions, columns)        one call
    -> Outcome                             mindgrpo.rewards.scoring.call_reward's result

It exits when TASKS_FD closes (the pool's close()), and on Linux also when its parent dies (parent-death
signal), so that a worker never outlives its trainer. Ctrl-C in a terminal reaches the whole process group:
the worker ignores SIGINT and leaves the shutdown to its parent.
"""

from __future__ import annotations

import signal
import sys

from mindgrpo.utils.frames import recv_frame, send_frame
from mindgrpo.utils.process import die_with_parent


def _load(spec: dict) -> dict:
    """{name: bound reward function} from the set-up message."""
    import importlib

    from mindgrpo.rewards.registry import get_reward, load_reward_plugin

    fns = {}
    for name, ((kind, where), params) in spec.items():
        if kind == "plugin":
            load_reward_plugin(where)
        else:
            importlib.import_module(where)
        fns[name] = get_reward(name, **params)
    return fns


def main(argv) -> int:
    tasks, results, parent = (int(a) for a in argv)
    die_with_parent(parent, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from mindgrpo.rewards.scoring import call_reward

    try:
        try:
            fns = _load(recv_frame(tasks))
        except Exception as error:  # noqa: BLE001 - reported to the parent, which stops the run with it
            send_frame(results, ("setup_error", f"{type(error).__name__}: {error}"))
            return 1
        send_frame(results, ("ready",))
        while True:
            task = recv_frame(tasks)
            if task is None:
                return 0
            name, completions, columns = task
            send_frame(results, call_reward(name, fns[name], completions, columns))
    except BrokenPipeError:  # the pool closed while this worker was starting or scoring
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
