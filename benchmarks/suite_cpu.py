"""Where a test run's CPU goes, by process: pytest on the given tests with a `sitecustomize.py` on PYTHONPATH
that has every Python process it starts (pytest's workers, the scripts, msrun and its ranks, their helpers)
write its own CPU seconds when it exits, with the test that was running when it started
(PYTEST_CURRENT_TEST, which a child inherits). Summed by test file and by kind of process.

    python -m benchmarks.suite_cpu                                 # the README's test command: -n 2, all tests
    python -m benchmarks.suite_cpu --tests tests/grpo/test_chaos.py --pytest_args '-n 0'

The suite keeps both cores busy, so its wall time follows its CPU seconds (DEVELOPERS.md): this says which
tests to make cheaper. A process killed by a signal writes nothing (the chaos test's killed runs), so the
sum is below the CPU seconds of pytest and everything it waited for, which are given beside it. A process
is named by its sys.argv when it exits: the ranks of a `tests/parallel/workers/several.py` job by the last
worker script they ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from collections import defaultdict
from typing import Dict, List

from benchmarks.harness import RESULTS, REPO, code_version, run_stamp, write_results
from benchmarks.suite_files import run_command

ACCOUNT = "MINDGRPO_SUITE_CPU_LOG"  # the file each process appends its line to
SITECUSTOMIZE = f'''import atexit, json, os, resource, sys, time
_start = time.time()
def _account():
    r = resource.getrusage(resource.RUSAGE_SELF)
    line = json.dumps({{"pid": os.getpid(), "argv": sys.argv[:3], "wall_s": time.time() - _start,
                       "cpu_s": r.ru_utime + r.ru_stime, "test": os.environ.get("PYTEST_CURRENT_TEST", "")}})
    with open(os.environ["{ACCOUNT}"], "a") as f:
        f.write(line + "\\n")
if os.environ.get("{ACCOUNT}"):
    atexit.register(_account)
'''


def kind(argv: List[str], test: str = "") -> str:
    """What a process was, from its first arguments (and the test running when it started): pytest or one of
    its xdist workers (`python -c`, started before any test), a script or module by name."""
    if not argv:
        return "?"
    if argv[0] == "-c":
        return "python -c" if test else "pytest"
    if argv[0].endswith("pytest/__main__.py"):
        return "pytest"
    if argv[0] == "-m" and len(argv) > 1:
        return argv[1]
    return os.path.relpath(argv[0], REPO) if argv[0].startswith(REPO) else os.path.basename(argv[0])


def summarise(lines: List[dict]) -> dict:
    """Per test file (the file of the test that ran when the process started; pytest's own processes apart) and
    per kind of process: processes, CPU seconds, sorted by CPU, largest first."""
    by_file: Dict[str, List[float]] = defaultdict(lambda: [0, 0.0])
    by_kind: Dict[str, List[float]] = defaultdict(lambda: [0, 0.0])
    for p in lines:
        k = kind(p["argv"], p["test"])
        # pytest and its workers start before any test; a pytest a test starts counts for that test's file
        f = p["test"].split("::")[0] or ("(pytest and its workers: the tests that run in them)" if k == "pytest"
                                         else "(no test)")
        for table, key in ((by_file, f), (by_kind, k)):
            table[key][0] += 1
            table[key][1] += p["cpu_s"]

    def rows(table):
        return [{"name": k, "processes": n, "cpu_s": c} for k, (n, c) in sorted(table.items(), key=lambda kv: -kv[1][1])]

    return {"processes": len(lines), "cpu_s": sum(p["cpu_s"] for p in lines), "by_file": rows(by_file),
            "by_kind": rows(by_kind), "each": lines}


def markdown(res: dict, top: int = 20) -> str:
    s, run = res["summary"], res["run"]
    out = ["# Where the tests' CPU goes, by process", "", f"Command: `{res['command']}`", "",
           f"Date {res['date']}. Machine: {res['machine']}; load average {run['load_start']} at the start, "
           f"{run['load_end']} at the end. Code: {res['code']}.", "",
           f"pytest: {run['outcome']}; {run['wall_s']:.0f} s wall, {run['cpu_s']:.0f} s of CPU (it and every process it "
           f"waited for). The processes' own accounts: {s['processes']} processes, {s['cpu_s']:.0f} s (killed ones "
           "write none).", "", "| test file (the test running when the process started) | processes | CPU (s) | share |",
           "|---|---|---|---|"]
    out += [f"| {r['name']} | {r['processes']} | {r['cpu_s']:.1f} | {r['cpu_s'] / s['cpu_s']:.1%} |"
            for r in s["by_file"][:top]]
    out += ["", "| process | processes | CPU (s) |", "|---|---|---|"]
    out += [f"| {r['name']} | {r['processes']} | {r['cpu_s']:.1f} |" for r in s["by_kind"][:top]]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", nargs="+", default=["tests"], help="test files, folders or node ids")
    ap.add_argument("--pytest_args", default="-n 2", help="pytest arguments, one string (default: '-n 2')")
    ap.add_argument("--out", default=os.path.join(RESULTS, "suite_cpu.json"))
    args = ap.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    res = {**run_stamp("benchmarks.suite_cpu", [shlex.quote(a) for a in given]), "code": code_version()}
    with tempfile.TemporaryDirectory(prefix="suite_cpu_") as folder:
        with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        log = os.path.join(folder, "processes.jsonl")
        paths = [folder, REPO, os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), **{ACCOUNT: log})
        res["run"] = run_command([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *shlex.split(args.pytest_args),
                                  *args.tests], REPO, env)
        lines = [json.loads(ln) for ln in open(log)] if os.path.exists(log) else []
    res["run"].pop("tail")
    res["summary"] = summarise(lines)
    write_results(args.out, res, markdown(res))
    print(markdown(res))
    return res["run"]["returncode"]


if __name__ == "__main__":
    sys.exit(main())
