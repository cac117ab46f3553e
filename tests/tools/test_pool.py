"""The tool pool and the python sandbox against hostile tools: each misbehaviour is one counted error the model
sees, the calls after it still run, and nothing is left behind (processes, scratch directories, files)."""

import glob
import os
import tempfile
import time
from pathlib import Path

import pytest

from mindgrpo.tools import ToolCall, ToolPool, ToolPoolError, check_call, load_tool_plugin
from mindgrpo.tools.sandbox import SandboxLimits, run_python

HOSTILE = str(Path(__file__).with_name("hostile_tools.py"))
OUTSIDE = os.path.join(tempfile.gettempdir(), f"mindgrpo-escape-{os.getpid()}")


def children_of(pid):
    """Every live descendant of pid (from /proc). Tests compare it with its value before they start: other tests
    in the same pytest worker may have live children of their own (module fixtures' pools, say)."""
    parents = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        parents.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return [p for p in out if Path(f"/proc/{p}/stat").read_text().split(") ")[1][0] != "Z"]


HOSTILE_CODE = {  # python tool calls and what each must give
    "sleeps": ("import time\ntime.sleep(60)", "timeout", "no result within"),
    # a spin ends at its CPU-time limit (an error) or, on a loaded machine, at the wall-clock one (a timeout)
    "spins": ("while True:\n    pass", ("timeout", "error"), ""),
    "crashes": ("import faulthandler\nfaulthandler._sigsegv()", "error", "SIGSEGV"),
    "floods": ("print('x' * (10 << 20))", "error", "output over 65536 bytes"),
    "network": ("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)", "error", "does not allow socket"),
    "writes outside": (f"open({OUTSIDE!r}, 'w').write('x')", "error", "only inside its scratch directory"),
    "removes outside": (f"import os\nos.remove({OUTSIDE!r})", "error", "only inside its scratch directory"),
    "spawns": ("import subprocess\nsubprocess.run(['sleep', '100'])", "error", "does not allow subprocess.Popen"),
    "raises": ("1 / 0", "error", "ZeroDivisionError: division by zero"),
    "eats memory": ("x = bytearray(4 << 30)", "error", "MemoryError"),
    "well behaved": ("import os\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read(), os.listdir('.'))", "ok",
                     "hi ['a.txt']"),
}


def test_the_sandbox_alone_refuses_each_and_leaves_nothing(tmp_path):
    limits = SandboxLimits(cpu_s=2, wall_s=4.0, memory_mb=512)
    before = set(children_of(os.getpid()))
    Path(OUTSIDE + ".keep").write_text("mine")
    for name, (code, status, needle) in HOSTILE_CODE.items():
        result = run_python(code, limits, scratch_root=str(tmp_path))
        assert result.status in status and needle in result.output, (name, result)
        assert result.seconds < limits.wall_s + 60, name  # a hang guard: killed at its bound, not left running
        assert os.listdir(tmp_path) == [], name  # its scratch directory is gone
    assert not os.path.exists(OUTSIDE)
    assert set(children_of(os.getpid())) - before == set()
    os.remove(OUTSIDE + ".keep")


@pytest.fixture(scope="module")
def pool():
    load_tool_plugin(HOSTILE)
    tools = {"calculator": {}, "python": {"cpu_s": 2, "wall_s": 4.0, "memory_mb": 512}, "sleeper": {},
             "crasher": {}, "flood": {}, "raiser": {}, "echo": {"scale": 10}}
    with ToolPool(tools, num_workers=2, timeout_s=6.0, max_chars=1000) as p:
        yield p


def test_hostile_calls_in_the_pool_each_an_error_and_the_rest_still_runs(pool):
    allowed = set(pool.setup[0])
    before = set(children_of(os.getpid())) - {w.proc.pid for w in pool.workers}
    calls = [check_call(ToolCall("python", {"code": code}), allowed) for code, _, _ in HOSTILE_CODE.values()]
    calls += [check_call(ToolCall(name), allowed) for name in ("sleeper", "crasher", "flood", "raiser")]
    calls += [check_call(c, allowed) for c in (ToolCall("calculator", {"expression": "123+456+789"}),
                                               ToolCall("calculator", {"expr": "1"}), ToolCall("nope"),
                                               ToolCall("echo", {"n": 4}))]
    start = time.monotonic()
    results = pool.run(calls)
    expected = [(s, n) for _, s, n in HOSTILE_CODE.values()] + [
        ("timeout", "no result within 6 s"), ("error", "the tool crashed (its process ended with code 7)"),
        ("error", "the output is over 1000 characters (10485760)"), ("error", "KeyError: 'missing thing'"),
        ("ok", "1368"), ("error", "'expression' is a required property"), ("error", "unknown tool 'nope'"),
        ("ok", '"n": 40')]
    for call, result, (status, needle) in zip(calls, results, expected):
        assert result.status in status and needle in result.text, (call, result)
        assert result.response().startswith("error: ") == (status != "ok")
    assert len(results[-7].text) < 1100  # the 10 MB answer comes back cut
    assert pool.replaced == 2  # the sleeper's worker (killed at the timeout) and the crasher's
    assert time.monotonic() - start < 60
    assert not os.path.exists(OUTSIDE)
    # after the replacements the pool still answers, and nothing of the dead workers remains
    assert pool.run([ToolCall("calculator", {"expression": "2*21"})])[0].text == "42"
    assert set(children_of(os.getpid())) - before == {w.proc.pid for w in pool.workers} | {pool.scratch.keeper_pid}
    assert sorted(os.listdir(pool.root)) == sorted(os.path.basename(w.tmp) for w in pool.workers)
    assert all(os.listdir(w.tmp) == [] for w in pool.workers)  # no scratch directory left in any


def test_submit_and_poll_while_other_work_goes_on(pool):
    pool.submit("slow", ToolCall("python", {"code": "import time\ntime.sleep(1.0)\nprint('late')"}))
    pool.submit("bad", ToolCall("calculator", error="the tool call is not valid JSON"))
    pool.submit("fast", ToolCall("calculator", {"expression": "1+1"}))
    first = pool.poll(0.0)
    assert ("bad", ("error", "the tool call is not valid JSON")) in [(k, (r.status, r.text)) for k, r in first]
    got = dict(first)
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        got.update(pool.poll(0.05))  # a decode step would run here
    assert got["fast"].text == "2" and got["slow"].text == "late\n" and pool.pending == 0


def test_close_leaves_nothing(tmp_path):
    p = ToolPool({"calculator": {}}, num_workers=2, timeout_s=5.0)
    assert p.run([ToolCall("calculator", {"expression": "3*3"})])[0].text == "9"
    root, pids = p.root, [w.proc.pid for w in p.workers]
    p.close()
    assert not os.path.exists(root) and all(not os.path.exists(f"/proc/{pid}/cmdline") or
                                            children_of(os.getpid()).count(pid) == 0 for pid in pids)


# a rank whose collective watchdog fires while its tool worker runs a python call: os._exit, no atexit, no close()
WATCHED_RANK = """
import glob, os, sys
from mindgrpo.parallel.watchdog import Watchdog
from mindgrpo.tools import ToolCall, ToolPool
from mindgrpo.utils import heartbeat

pool = ToolPool({"python": {"wall_s": 60.0, "cpu_s": 60}}, num_workers=1, timeout_s=120.0)
pool.submit("sleeps", ToolCall("python", {"code": "import time\\nopen('f', 'w').write('x')\\ntime.sleep(60)"}))
while not glob.glob(os.path.join(pool.root, "worker-*", "mindgrpo-python-*", "f")):  # the sandbox runs the call
    pool.poll(0.1)
print(pool.root, flush=True)
heartbeat.reset()
Watchdog(0, timeout_s=0.5, compile_timeout_s=0.5, poll_s=0.1).start()
pool.poll(None)  # stuck here, as a rank in a collective is
"""


def test_a_process_ended_by_the_watchdog_leaves_no_tool_folder(tmp_path):
    """The pool's folder, its workers' and their sandboxes' go also when the process ends by os._exit (the
    watchdog's exit): no close() runs there, and the folder's keeper removes it."""
    import subprocess
    import sys

    from mindgrpo.parallel.watchdog import EXIT_CODE

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "-c", WATCHED_RANK], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2], env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == EXIT_CODE and "no progress in phase" in proc.stderr, proc.stderr[-2000:]
    root = proc.stdout.strip()
    assert root.startswith(str(tmp / "mindgrpo-tools-"))
    deadline = time.monotonic() + 30
    while (os.listdir(tmp) or _processes_with_tmpdir(str(tmp))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert os.listdir(tmp) == [] and _processes_with_tmpdir(str(tmp)) == []  # the keeper too is gone


def _processes_with_tmpdir(tmp):
    """Live processes whose TMPDIR is under `tmp` (the workers, their sandboxes, the folder's keeper)."""
    out = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            env = Path(path).read_bytes().split(b"\0")
            state = Path(path).with_name("stat").read_text().split(") ")[1][0]
        except OSError:
            continue
        if state != "Z" and any(e.startswith(b"TMPDIR=" + tmp.encode()) for e in env):
            out.append(int(path.split("/")[2]))
    return out


def test_a_close_that_interrupts_the_start_reaps_every_worker_started(monkeypatch):
    """The run's SIGTERM handler calls close() between any two bytecodes, start() included: here it runs right
    after the second worker's process starts, before start() returns. Every process started must be gone and
    the folders removed (before workers were listed as they started, close() found none and both lived on)."""
    from mindgrpo.utils.workers import WorkerProcess

    p = ToolPool({"calculator": {}}, num_workers=3, timeout_s=5.0)
    started, roots, spawn = [], set(), WorkerProcess.spawn

    def spawn_then_maybe_close(self, setup):
        spawn(self, setup)
        started.append(self.proc.pid)
        roots.add(os.path.dirname(self.tmp))
        if len(started) == 2:
            p.close()
            raise KeyboardInterrupt  # the handler ends the process; here it ends start()

    before = children_of(os.getpid())
    monkeypatch.setattr(WorkerProcess, "spawn", spawn_then_maybe_close)
    with pytest.raises(KeyboardInterrupt):
        p.start()
    assert len(started) == 2 and p.workers == [] and len(roots) == 1 and not os.path.exists(roots.pop())
    assert not [pid for pid in started if pid in children_of(os.getpid()) and pid not in before]


def test_bad_settings_fail_at_construction_and_a_broken_plugin_at_start(tmp_path):
    with pytest.raises(ValueError, match="tool 'python' has no setting"):
        ToolPool({"python": {"timeout": 3}}, num_workers=1, timeout_s=5.0)
    with pytest.raises(KeyError, match="unknown tool 'absent'"):
        ToolPool({"absent": {}}, num_workers=1, timeout_s=5.0)
    plugin = tmp_path / "breaks_in_workers.py"
    plugin.write_text("import os\nfrom mindgrpo.tools import register_tool\n"
                      "if os.environ.get('TMPDIR', '').find('mindgrpo-tools-') >= 0:\n    raise RuntimeError('no')\n"
                      "register_tool('brk', description='', parameters={'type': 'object'})(lambda: 'x')\n")
    load_tool_plugin(str(plugin))
    with ToolPool({"brk": {}}, num_workers=1, timeout_s=5.0) as p:
        with pytest.raises(ToolPoolError, match="could not load the tools"):
            p.run([ToolCall("brk")])
