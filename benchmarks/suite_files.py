"""What test files cost at two commits: wall and CPU seconds of `pytest FILE ...` (its processes and every
child they wait for: msrun, its workers, the subprocesses of a fixture), each commit's tree exported
(`git archive`) beside the other and run in turn (A B A B: the machine's load falls on both sides).

    python -m benchmarks.suite_files --commits 9dcdb7b HEAD --files tests/parallel/test_msrun.py [--rounds 1]

CPU seconds are the better measure on a shared machine: the suite runs on two pytest-xdist workers that
keep both cores busy (DEVELOPERS.md), so its wall time follows its CPU time, while one file's wall time
follows the machine's load. Each side's pytest runs with `-p no:cacheprovider` (nothing written into the
tree) and its tests' outcome line is recorded; a side whose tests fail is reported as failed.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import RESULTS, REPO, SHARED, load_average, median, run_stamp, write_results


def short(commit: str) -> str:
    return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", commit], capture_output=True, text=True,
                          check=True).stdout.strip()


def export(sha: str, root: str, name: str) -> str:
    """The tree of commit `sha` under root/name; root/shared points at the shared data (tests that need it)."""
    dest = os.path.join(root, name)
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", REPO, "archive", sha], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    if os.path.isdir(SHARED) and not os.path.exists(os.path.join(root, "shared")):
        os.symlink(SHARED, os.path.join(root, "shared"))
    return dest


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_files(tree: str, files, extra, env=None) -> dict:
    """pytest on `files` in `tree` (in `env`, default this process's): wall, CPU of it and its waited-for
    descendants, the outcome line."""
    return run_command([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *files], tree,
                       dict(env if env is not None else os.environ, PYTHONPATH=tree))


def run_command(cmd, cwd: str, env, outcome: str = r"\d+ (passed|failed|error)") -> dict:
    """`cmd` in `cwd`: wall, CPU of it and its waited-for descendants, its last output line matching `outcome`
    (by default pytest's count of tests)."""
    cpu0, wall0, load0 = children_cpu(), time.perf_counter(), load_average()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - wall0, children_cpu() - cpu0
    lines = [ln for ln in proc.stdout.splitlines() if re.search(outcome, ln)]
    return {"wall_s": wall, "cpu_s": cpu, "returncode": proc.returncode, "outcome": lines[-1] if lines else "",
            "load_start": load0, "load_end": load_average(), "tail": proc.stdout.splitlines()[-40:]}


def markdown(res: dict) -> str:
    base = res["commits"][0]
    lines = [f"# Test files at two commits: {', '.join(res['files'])}", "",
             f"Command: `{res['command']}`", "",
             f"Date {res['date']}. Machine: {res['machine']}; load average {res['load_start']} at the start, "
             f"{res['load_end']} at the end (other jobs shared the machine). {res['rounds']} round(s), the commits "
             f"alternating; medians. CPU: pytest and every process it waited for (msrun, its workers).", "",
             "| commit | wall (s) | vs first | CPU (s) | vs first | outcome |", "|---|---|---|---|---|---|"]
    return "\n".join(lines + ratio_rows(res["sides"], res["commits"], base)) + "\n"


def ratio_rows(sides: dict, order, base: str) -> list:
    """One markdown row per side (wall and CPU seconds, each as a ratio to the base side's, the outcome)."""
    b = sides[base]
    return [f"| {k} | {sides[k]['wall_s']:.0f} | {sides[k]['wall_s'] / b['wall_s']:.2f}x | {sides[k]['cpu_s']:.0f} | "
            f"{sides[k]['cpu_s'] / b['cpu_s']:.2f}x | {sides[k]['outcome']} |" for k in order]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", nargs=2, required=True, help="the baseline commit, then the other")
    ap.add_argument("--files", nargs="+", required=True, help="test files (or node ids), relative to the repo")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pytest_args", nargs="*", default=[], help="more pytest arguments, e.g. -n 2")
    ap.add_argument("--out", default=os.path.join(RESULTS, "suite_files.json"))
    args = ap.parse_args(argv)
    res = {**run_stamp("benchmarks.suite_files", argv), "files": args.files, "rounds": args.rounds,
           "load_start": load_average()}
    with tempfile.TemporaryDirectory(prefix="suite_files_") as root:
        trees = {}
        for i, c in enumerate(args.commits):  # "A 9dcdb7b", "B 1a2b3c4" (the same commit twice: an A/A check)
            name = f"{'AB'[i]} {short(c)}"
            trees[name] = export(short(c), root, name.replace(" ", "_"))
        res["commits"] = list(trees)
        runs = {c: [] for c in trees}
        for r in range(args.rounds):
            for c, tree in trees.items():
                runs[c].append(run_files(tree, args.files, args.pytest_args))
                print(f"round {r + 1} {c}: {runs[c][-1]}", flush=True)
    res["load_end"] = load_average()
    res["runs"] = runs
    res["sides"] = {c: {"wall_s": median([x["wall_s"] for x in rs]), "cpu_s": median([x["cpu_s"] for x in rs]),
                        "outcome": rs[-1]["outcome"]} for c, rs in runs.items()}
    failed = [c for c, rs in runs.items() if any(x["returncode"] for x in rs)]
    res["failed"] = failed
    write_results(args.out, res, markdown(res))
    print(markdown(res))
    if failed:
        print(f"suite_files: the tests failed at {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
