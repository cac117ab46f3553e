"""What jemalloc saves (mindgrpo/utils/malloc.py): the same work with glibc's malloc and with jemalloc
preloaded, in turn (A B A B: the machine's load falls on both sides), CPU and wall seconds side by side.

    python -m benchmarks.malloc --files tests/models/test_qwen3_parity.py [--rounds 2] [--pytest_args -n 2]
    python -m benchmarks.malloc --tiny_default [--rounds 1]

--files: pytest on those test files, the allocator side with it preloaded (and tests/conftest.py gives it to every
process the tests start; the glibc side sets MINDGRPO_MALLOC=system). --tiny_default: `scripts/grpo_one_stage.py` with no
arguments (which runs itself again with the allocator; the glibc side sets MINDGRPO_MALLOC=system), its
held-out accuracy line kept: the allocator changes no arithmetic, so both sides should print the same.
CPU: the process and every process it waited for. Needs an allocator (scripts/setup_env.sh).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from benchmarks.harness import RESULTS, REPO, load_average, median, run_stamp, write_results
from benchmarks.suite_files import ratio_rows, run_command, run_files
from mindgrpo.utils.malloc import ENV, allocator, preloaded, with_allocator


def environments() -> dict:
    """side -> the environment it runs in: glibc's malloc, then the allocator found."""
    lib = allocator()
    if lib is None:
        raise SystemExit("benchmarks.malloc: no allocator to compare (scripts/setup_env.sh unpacks jemalloc into the "
                         f"venv; or set {ENV}=PATH)")
    base = dict(os.environ)
    kept = [p for p in preloaded(base) if p != lib]
    base.pop("LD_PRELOAD", None)
    if kept:
        base["LD_PRELOAD"] = " ".join(kept)
    return {"glibc": dict(base, **{ENV: "system"}), os.path.basename(lib): with_allocator(dict(base, **{ENV: lib}))}


def markdown(res: dict) -> str:
    sides = list(res["sides"])
    lines = [f"# glibc's malloc against {sides[1]}: {res['work']}", "", f"Command: `{res['command']}`", "",
             f"Date {res['date']}. Machine: {res['machine']}; load average {res['load_start']} at the start, "
             f"{res['load_end']} at the end. {res['rounds']} round(s), the sides alternating; medians. CPU: the "
             "process and every process it waited for.", "",
             "| allocator | wall (s) | vs glibc | CPU (s) | vs glibc | outcome |", "|---|---|---|---|---|---|"]
    return "\n".join(lines + ratio_rows(res["sides"], sides, sides[0])) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    work = ap.add_mutually_exclusive_group(required=True)
    work.add_argument("--files", nargs="+", help="test files (or node ids), relative to the repo")
    work.add_argument("--tiny_default", action="store_true", help="scripts/grpo_one_stage.py with no arguments")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pytest_args", nargs="*", default=[], help="more pytest arguments, e.g. -n 2")
    ap.add_argument("--out", default=os.path.join(RESULTS, "malloc.json"))
    args = ap.parse_args(argv)
    envs = environments()
    res = {**run_stamp("benchmarks.malloc", argv), "rounds": args.rounds, "load_start": load_average(),
           "work": " ".join(args.files) if args.files else "the tiny default (scripts/grpo_one_stage.py)"}
    runs = {name: [] for name in envs}
    with tempfile.TemporaryDirectory(prefix="malloc_") as tmp:
        for r in range(args.rounds):
            for name, env in envs.items():
                if args.files:
                    run = run_files(REPO, args.files, args.pytest_args, env)
                else:
                    cmd = [sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir",
                           os.path.join(tmp, f"{name}_{r}")]
                    run = run_command(cmd, REPO, env, outcome=r"final: val_accuracy")
                runs[name].append(run)
                print(f"round {r + 1} {name}: wall {run['wall_s']:.1f} s, CPU {run['cpu_s']:.1f} s, "
                      f"{run['outcome']}", flush=True)
    res["load_end"] = load_average()
    res["runs"] = runs
    res["sides"] = {n: {"wall_s": median([x["wall_s"] for x in rs]), "cpu_s": median([x["cpu_s"] for x in rs]),
                        "outcome": rs[-1]["outcome"]} for n, rs in runs.items()}
    res["failed"] = [n for n, rs in runs.items() if any(x["returncode"] for x in rs)]
    write_results(args.out, res, markdown(res))
    print(markdown(res))
    if res["failed"]:
        print(f"benchmarks.malloc: failed with {res['failed']}", file=sys.stderr)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
