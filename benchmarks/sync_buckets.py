"""The weight sync's buckets (`rl_config.weight_sync_bucket_mb`) on one device: a policy's weights into
an inference copy by one bucket per decoder layer (0) against buckets joined up to a budget in MiB.

    python -m benchmarks.sync_buckets [--model tiny_qwen2] [--layers N] [--budgets 0 512] [--rounds 3]

Each round builds, for every budget in turn (A B A B: the machine's load falls on both sides), a fresh
policy and inference copy (`--model`, a preset, cut to `--layers` decoder layers when given) and its
`WeightSync`, then times the first sync (it compiles one copy graph per bucket) and the median of three
warm syncs. Per side: buckets (= graphs compiled), the largest bucket, the first sync's seconds (median
over rounds) and the warm sync's; the copies must equal the policy bit for bit on every side.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys

from benchmarks.harness import RESULTS, code_version, median, run_stamp, time_calls, write_results


def side(model: str, layers: int, budget_mb: float) -> dict:
    import numpy as np

    from mindgrpo.models.checkpoint import model_state
    from mindgrpo.models.presets import preset_config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM
    from mindgrpo.parallel.weight_sync import WeightSync

    cfg = preset_config(model)
    if layers:
        cfg = dataclasses.replace(cfg, num_hidden_layers=layers)
    policy, inference = Qwen2ForCausalLM(cfg, seed=0), Qwen2ForCausalLM(cfg, seed=1)
    sync = WeightSync(policy, inference, bucket_bytes=int(budget_mb * 2 ** 20))
    first = time_calls(sync, 1)[0]
    warm = median(time_calls(sync, 3))
    want, got = model_state(policy), model_state(inference)
    exact = all(np.array_equal(want[n], got[n]) for n in want)
    return {"buckets": len(sync.buckets), "max_bucket_mib": sync.max_bucket_bytes / 2 ** 20,
            "total_mib": sync.total_bytes / 2 ** 20, "first_s": first, "warm_s": warm, "exact": exact}


def markdown(res: dict) -> str:
    base = res["sides"][f"{res['budgets'][0]:g}"]
    lines = [f"# Weight-sync buckets, one device ({res['model']}, {res['layers'] or 'all'} layers)", "",
             f"Command: `{res['command']}`", "",
             f"Date {res['date']}, library code at {res['code']}. Machine: {res['machine']}; load average "
             f"{res['load_start']} at the start, {res['load_end']} at the end. {res['rounds']} rounds, the budgets "
             f"alternating; medians.", "",
             "| budget (MiB) | buckets = graphs | largest bucket (MiB) | first sync, compiling (s) | vs first | "
             "warm sync (s) | vs first | bit-exact |", "|---|---|---|---|---|---|---|---|"]
    for b in res["budgets"]:
        s = res["sides"][f"{b:g}"]
        lines.append(f"| {b:g} | {s['buckets']} | {s['max_bucket_mib']:.1f} | {s['first_s']:.2f} | "
                     f"{s['first_s'] / base['first_s']:.2f}x | {s['warm_s']:.3f} | "
                     f"{s['warm_s'] / base['warm_s']:.2f}x | {s['exact']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny_qwen2", help="a preset of model_configs/")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (0: the preset's)")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0, 512], help="MiB; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(RESULTS, "sync_buckets.json"))
    args = ap.parse_args(argv)
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    gc.collect()
    gc.freeze()  # as the trainer: MindSpore's full collection before each compile skips what the imports made
    res = dict(run_stamp("benchmarks.sync_buckets", argv), model=args.model, layers=args.layers,
               budgets=args.budgets, rounds=args.rounds, code=code_version())
    res["load_start"] = res.pop("load_average")
    runs = {b: [] for b in args.budgets}
    for _ in range(args.rounds):
        for b in args.budgets:
            runs[b].append(side(args.model, args.layers, b))
            gc.collect()
    res["sides"] = {f"{b:g}": dict(r[-1], first_s=median([x["first_s"] for x in r]),
                                 warm_s=median([x["warm_s"] for x in r]), exact=all(x["exact"] for x in r))
                    for b, r in runs.items()}
    from benchmarks.harness import load_average

    res["load_end"] = load_average()
    write_results(args.out, res, markdown(res))
    print(markdown(res))
    return 0 if all(s["exact"] for s in res["sides"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
