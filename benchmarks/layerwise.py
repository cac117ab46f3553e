"""The layerwise update (`actor_config.layerwise_update`) against the whole-model training graph: the
resident memory an update holds and the time it takes, on the Qwen2.5-0.5B shape cut to a few layers.

    python -m benchmarks.layerwise [--layers 2 4] [--vocab 151936] [--updates 1]

MindSpore 2.10's CPU runtime keeps a compiled graph's buffers after it ran (`benchmarks/graph_release.py`):
the whole-model training graph holds every decoder layer's intermediates, about 0.7 GB per layer here
(`benchmarks/results/memory.md`). The layerwise update runs one compiled decoder-layer graph for every
layer (forward, then from the last layer to the first the layer again and its vector-Jacobian product;
`mindgrpo/grpo/layerwise.py`), so its graphs hold one layer's.

Each (layers, side) runs in its own process, one after the other (peak RSS is per process): it builds the
policy (random weights, the shape's full vocabulary, tied), its gradient buffers and AdamW, then runs
`PolicyUpdater.update` on one micro-batch of the issue-20 workload (G = 4 rows of 157 prompt tokens, 128
response tokens each: (4, 288) tokens, beta 0.04 with given reference log-probs): the first update
compiles, the later ones are timed. Per side: resident memory after the build, the first update's peak,
a later update's seconds and peak, what stays resident after it, the process's peak, and the losses and
gradient norms (both sides must agree). Two layer counts give each figure as fixed + per layer.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from benchmarks.harness import RESULTS, code_version, run_stamp, stamp_lines, write_results
from benchmarks.update_sides import BETA, MICRO_BATCH, PROMPT_LENGTHS, RESPONSE, experience, measure, per_layer, table

SIDES = {"whole": {"layerwise": False}, "layerwise": {"layerwise": True}}
ONE_MICRO_BATCH = PROMPT_LENGTHS[:1]  # the first prompt's G = 4 rows


def close(a, b) -> bool:
    return bool(np.allclose(a, b, rtol=1e-6, atol=0))


def markdown(res: dict) -> str:
    lines = ["# The layerwise update against the whole-model training graph (actor_config.layerwise_update)", "",
             *stamp_lines(res, " (other jobs shared the machine; the sides ran one after the other, so "
                                      "the time ratios are rough)"),
             "Workload: the Qwen2.5-0.5B shape (hidden 896, intermediate 4864, 14 / 2 heads, tied) cut to the given "
             f"layers, vocabulary {res['vocab']}; one micro-batch of {MICRO_BATCH} rows ({PROMPT_LENGTHS[0]} prompt + "
             f"{RESPONSE} response tokens, S = {res['seq_len']}), beta {BETA}; `PolicyUpdater.update` (forward, loss, "
             "backward, then AdamW): one compiling update, then the median of the later ones. Resident memory in GB "
             "(10^9 bytes); held: after an update (the runtime keeps the graphs' buffers).", ""]
    lines += table(res, "side", "whole", "losses and grad norms agree (1e-6)",
                   lambda r, base: close(r["losses"], base["losses"]) and close(r["grad_norms"], base["grad_norms"]))
    if len(res["layers"]) >= 2:
        lines += ["", "Fixed + per layer (from the smallest and largest layer counts), and at the 24 layers of "
                  "Qwen2.5-0.5B:", ""]
        for name in SIDES:
            for key, label in (("process_peak_gb", "process peak GB"), ("held_after_update_gb", "held GB"),
                               ("update_s", "update s")):
                fixed, slope = per_layer(res, key, name)
                lines.append(f"- {name}, {label}: {fixed:.2f} + {slope:.3f}/layer -> {fixed + 24 * slope:.1f} "
                             "at 24 layers")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--updates", type=int, default=1, help="timed updates per side, after the compiling one")
    ap.add_argument("--output", default=os.path.join(RESULTS, "layerwise.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.layerwise", argv), code=code_version(), vocab=args.vocab,
               seq_len=int(experience(args.vocab, ONE_MICRO_BATCH).input_ids.shape[1]), layers={})
    for layers in args.layers:
        res["layers"][str(layers)] = measure(layers, args.vocab, args.updates, ONE_MICRO_BATCH, SIDES)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
