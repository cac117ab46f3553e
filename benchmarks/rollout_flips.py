"""Does a sample's output depend on how many slots the engine decodes at once? Each sample draws
from its own random stream, so any difference comes from its logits depending on the batch it sits
in (MindSpore's CPU kernels may sum in another order for another batch shape).

    python -m benchmarks.rollout_flips [--configs tiny-small-vocab] [--slots 512 64 16] [--prompts 64]

The longtail workload of benchmarks/rollout.py (same weights, prompts, stop ids and seed), generated
once per slot count. For each sample against the first slot count: identical or not, the first
token that differs, and the largest difference of the scaled log-probs over the tokens before it.
Writes benchmarks/results/rollout_flips.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from benchmarks.harness import RESULTS, run_stamp, write_results
from benchmarks.rollout import workload
from benchmarks.tiny_models import CONFIGS, hf_model


def compare(base, other) -> dict:
    same, first, logp_diff, tokens = 0, [], 0.0, 0
    for a, b in zip(base, other):
        tokens += len(a.token_ids)
        if a.token_ids == b.token_ids:
            same += 1
            n = len(a.token_ids)
        else:
            n = next(i for i, (x, y) in enumerate(zip(a.token_ids + [-1], b.token_ids + [-1])) if x != y)
            first.append(n)
        if n:
            logp_diff = max(logp_diff, float(np.abs(a.logprobs[:n] - b.logprobs[:n]).max()))
    return {"samples": len(base), "identical": same, "first_difference_at": sorted(first),
            "tokens": tokens, "max_logprob_difference_before": logp_diff}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["tiny-small-vocab"], choices=list(CONFIGS))
    ap.add_argument("--slots", type=int, nargs="+", default=[512, 64, 16])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max_tokens", type=int, default=512)
    ap.add_argument("--output", default=os.path.join(RESULTS, "rollout_flips.json"))
    args = ap.parse_args(argv)
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.models.checkpoint import load_model

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    res = {**run_stamp("benchmarks.rollout_flips", argv), "configs": {}}
    lines = ["# Sampled tokens across slot counts (per-sample streams; logits may depend on the batch)", "",
             f"    {res['command']}", "", f"Date {res['date']}, {res['machine']}. The longtail workload of "
             f"benchmarks/rollout.py: {args.prompts} prompts x G={args.group}, at most {args.max_tokens} tokens, "
             f"temperature 1; each slot count against {args.slots[0]} slots.", "",
             "| config | slots | samples identical | first differing token of the others | tokens | "
             "max scaled log-prob difference before it |", "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            weights = os.path.join(tmp, name)
            hf_model(name, seed=0).save_pretrained(weights, safe_serialization=True)
            lm = load_model(weights)
            prompts, params = workload(CONFIGS[name]["vocab_size"], "longtail", args.prompts, args.group,
                                       args.max_tokens)
            longest = max(len(p) for p in prompts)
            runs = {}
            for slots in args.slots:
                engine = RolloutEngine(lm, max_num_seqs=slots, max_model_len=longest + params.max_tokens)
                runs[slots] = engine.generate(prompts, params)
                print(f"{name} {slots} slots: {engine.last_stats['new_tokens']} tokens, "
                      f"{engine.last_stats['seconds']:.0f}s", flush=True)
            res["configs"][name] = {s: compare(runs[args.slots[0]], runs[s]) for s in args.slots[1:]}
            for s, r in res["configs"][name].items():
                lines.append(f"| {name} | {s} | {r['identical']} of {r['samples']} | "
                             f"{r['first_difference_at'] or '-'} | {r['tokens']} | "
                             f"{r['max_logprob_difference_before']:.1e} |")
    text = "\n".join(lines) + "\n"
    write_results(args.output, res, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
