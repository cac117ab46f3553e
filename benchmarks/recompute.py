"""Activation recompute in the training graph (`actor_config.recompute`): the memory an update
holds and the time it takes, with and without, on the Qwen2.5-0.5B shape cut to a few layers.

    python -m benchmarks.recompute [--layers 2 4] [--vocab 151936] [--updates 3]

Each (layers, recompute) side runs in its own process (peak RSS is per process): it builds the
policy (random weights), its gradient buffers and AdamW, then runs `PolicyUpdater.update` on the
issue-20 workload's experience (4 prompts of 157, 118, 149 and 127 tokens x G = 4, 128 response
tokens each, micro-batches of 4 rows, beta 0.04 with given reference log-probs): the first update
compiles, the next ones are measured. The sides run one after the other (two at once need twice
the memory). Per side: resident memory after the build, the first update's peak (compile and run),
a later update's peak, what stays resident after it, the process's peak, and the median seconds of
the later updates. Two layer counts give each figure as fixed + per layer x layers.
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.harness import RESULTS, code_version, run_stamp, write_results
from benchmarks.update_sides import BETA, G, MICRO_BATCH, PROMPT_LENGTHS, RESPONSE, experience, measure, per_layer, table

SIDES = {"off": {"recompute": False}, "on": {"recompute": True}}


def markdown(res: dict) -> str:
    lines = ["# Activation recompute in the training graph (actor_config.recompute)", "",
             f"Date {res['date']}; machine: {res['machine']}; load average {res['load_average']} "
             f"(other jobs shared the machine; sides ran one after the other, so the time ratios are rough).", "",
             f"Command (from the repo root): `{res['command']}`; library code: {res['code']}.", "",
             "Workload: the Qwen2.5-0.5B shape (hidden 896, intermediate 4864, 14 / 2 heads, tied) cut to the "
             f"given layers, vocabulary {res['vocab']}; 16 rows (prompts {list(PROMPT_LENGTHS)} x G = {G}, "
             f"{RESPONSE} response tokens, S = {res['seq_len']}), micro-batches of {MICRO_BATCH} rows, beta {BETA}; "
             "`PolicyUpdater.update` (forward, loss, backward per micro-batch, then AdamW): one compiling update, "
             "then the median of the later ones. Peaks are resident memory (VmHWM) in GB = 10^9 bytes; "
             "held: resident after an update (the runtime keeps the graph's buffers).", ""]
    lines += table(res, "recompute", "off", "same losses", lambda r, base: r["losses"] == base["losses"])
    if len(res["layers"]) >= 2:
        lines += ["", "Process peak = fixed + per layer x layers (from the smallest and largest layer counts), "
                  "and at the 24 layers of Qwen2.5-0.5B:", ""]
        for name in ("off", "on"):
            fixed, slope = per_layer(res, "process_peak_gb", name)
            lines.append(f"- recompute {name}: {fixed:.2f} GB + {slope:.3f} GB/layer -> {fixed + 24 * slope:.1f} GB "
                         "at 24 layers")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--updates", type=int, default=3, help="measured updates per side, after the compiling one")
    ap.add_argument("--output", default=os.path.join(RESULTS, "recompute.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.recompute", argv), code=code_version(), vocab=args.vocab,
               seq_len=int(experience(args.vocab).input_ids.shape[1]), layers={})
    for layers in args.layers:
        res["layers"][str(layers)] = measure(layers, args.vocab, args.updates, PROMPT_LENGTHS, SIDES)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
