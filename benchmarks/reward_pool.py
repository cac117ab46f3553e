"""What the reward worker pool costs: its start-up, and scoring a step's completions in the pool (2 workers)
against in the trainer's process, side by side in rounds (A B A B: the machine is shared).

    python -m benchmarks.reward_pool [--rows 256 1024] [--rounds 5] [--output benchmarks/results/reward_pool.json]

Workload: R1-format completions (<think>...</think><answer>\\boxed{N}</answer>, half of them right, some in
words) scored by accuracy + format, the GSM8K recipe's rewards; 256 rows is the tiny default's step (32 prompts
x 8), 1024 a 7B recipe's.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from benchmarks.harness import RESULTS, alternate, median, run_stamp, time_calls, write_results


def workload(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    completions, solutions = [], []
    for i in range(rows):
        a, b = (int(x) for x in rng.integers(10, 999, size=2))
        answer = a + b if i % 2 == 0 else a + b + 1
        body = f"{a} plus {b}: first the ones, then the tens and the hundreds, carrying when needed. " * 4
        tail = f"\\boxed{{{answer}}}" if i % 3 else f"the answer is {answer} dollars"
        completions.append(f"<think>{body}</think><answer>{tail}</answer>")
        solutions.append(str(a + b))
    return completions, {"solution": solutions}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--output", default=os.path.join(RESULTS, "reward_pool.json"))
    args = ap.parse_args(argv)
    from mindgrpo.rewards import RewardSet

    names, weights = ["accuracy", "format"], [1.0, 1.0]
    pools = []

    def start_pool():  # a new pool, until its first (one-completion) call returns
        pools.append(RewardSet(names, weights, num_workers=2, timeout_s=10.0))
        pools[-1](["\\boxed{1}"], solution=["1"])

    starts = []
    for _ in range(args.rounds):
        starts += time_calls(start_pool, 1)
        pools.pop().close()

    here = RewardSet(names, weights)
    pool = RewardSet(names, weights, num_workers=2, timeout_s=10.0)
    res = {"stamp": run_stamp("benchmarks.reward_pool", argv), "pool_workers": 2,
           "pool_start_s": median(starts), "pool_start_all_s": starts, "rows": {}}
    try:
        for rows in args.rows:
            completions, columns = workload(rows)
            expected = here(completions, **columns)[0]
            np.testing.assert_array_equal(pool(completions, **columns)[0], expected)  # warm-up, same scores
            times = alternate({"in_process": lambda: here(completions, **columns),
                               "pool": lambda: pool(completions, **columns)}, args.rounds)
            med = {k: median(v) for k, v in times.items()}
            res["rows"][str(rows)] = {"in_process_s": med["in_process"], "pool_s": med["pool"],
                                      "pool_over_in_process": med["pool"] / med["in_process"], "all": times}
    finally:
        pool.close()

    lines = ["# Reward worker pool", "",
             f"`{res['stamp']['command']}` (from the repo root) on {res['stamp']['machine']}, {res['stamp']['date']}, "
             f"load average {res['stamp']['load_average']}.", "",
             f"Start-up of a 2-worker pool until its first call returns: {res['pool_start_s']:.2f} s "
             f"(median of {args.rounds}); once per run, started after the build, before the first rollout.", "",
             "| rows | in process | pool (2 workers) | pool / in process |", "|---:|---:|---:|---:|"]
    for rows, r in res["rows"].items():
        lines.append(f"| {rows} | {r['in_process_s'] * 1e3:.1f} ms | {r['pool_s'] * 1e3:.1f} ms | "
                     f"{r['pool_over_in_process']:.2f} |")
    lines += ["", "Medians of alternating rounds; accuracy + format on R1-format completions (see the docstring)."]
    write_results(args.output, res, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
