"""Where the padded, token-budget and packed sides of `benchmarks.packing` hold their memory: the
resident memory after each graph call of two steps, one process per side.

    python -m benchmarks.packing_memory [--configs tiny-small-vocab] [--kinds longtail equal]
        [--sides padded budget packed] [--output benchmarks/results/packing_memory.json]

The workload, models and batching are `benchmarks.packing`'s (`build_side`). Each side runs two steps
(the reference log-probs, then one optimizer step over every sample) and reads its resident memory
(VmRSS, GB = 10^9 bytes) after the models are built, after every micro-batch's graph call (the first
call of a shape compiles it; MindSpore's CPU runtime keeps each compiled graph's buffers while its
cell lives) and after each step; the peak is VmHWM at the end (in GB here too). So a side's memory splits into
    models      both models' parameters (and the gradient buffers and AdamW moments once they are written)
    reference   what the reference pass's first step adds: its graphs, one per micro-batch shape
    update      what the update's first step adds: its graphs, the gradients and moments written first
    step 2      what the second step adds (nothing, when every shape is compiled and nothing leaks)
and per shape: what its first call added. Writes --output and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import os
from typing import List

from benchmarks.harness import RESULTS, code_version, peak_rss_gb, rss_gb, run_stamp, write_results
from benchmarks.packing import KINDS, LR, build_side, workload
from benchmarks.tiny_models import ALL_CONFIGS
from benchmarks.workers import Workers

SIDES = ("padded", "budget", "packed")


def side_worker(conn, name: str, side: str, kind: str, samples: int, max_len: int) -> None:
    """A `benchmarks.workers` side: two steps, the resident memory read after each graph call; sends
    the readings [(phase, step, micro-batch shape or None, GB)] and the peak (GB)."""
    from mindgrpo.grpo.packing import plan

    prompts, responses, adv = workload(kind, samples, max_len, ALL_CONFIGS[name]["vocab_size"])
    scorer, updater, exp = build_side(name, side, prompts, responses, adv)
    shapes = [mb.ids.shape + (len(mb.exp), len(mb.feed[-2]) if mb.packed else mb.feed[1].size)
              for mb in plan(exp, updater.batching)]  # (rows, S, samples, scored tokens) in the order they run
    readings: List[tuple] = [("models", 0, None, rss_gb())]
    step = [0]

    def reading_after(phase: str, graph):
        calls = [0]

        def call(*args):
            out = graph(*args)
            out[0].asnumpy()  # the call is done
            readings.append((phase, step[0], list(shapes[calls[0] % len(shapes)]), rss_gb()))
            calls[0] += 1
            return out
        return call

    scorer.graph = reading_after("reference", scorer.graph)  # one stage: the scorer calls `graph` per micro-batch
    updater.step_graph = reading_after("update", updater.step_graph)  # and the updater `step_graph`
    for step[0] in (1, 2):
        exp.ref_logp = scorer(exp)
        readings.append(("reference done", step[0], None, rss_gb()))
        updater.update(exp, lr=LR)
        readings.append(("update done", step[0], None, rss_gb()))
    conn.send((readings, peak_rss_gb()))


def split(readings: List[tuple]) -> dict:
    """The readings of one side -> GB held by models, reference (1st step), update (1st step), step 2,
    and per shape of each phase what its first call added."""
    at = {(phase, step): gb for phase, step, shape, gb in readings if shape is None}
    out = {"models_gb": at[("models", 0)],
           "reference_gb": at[("reference done", 1)] - at[("models", 0)],
           "update_gb": at[("update done", 1)] - at[("reference done", 1)],
           "step2_gb": at[("update done", 2)] - at[("update done", 1)], "per_shape": []}
    before, seen = at[("models", 0)], set()
    for phase, step, shape, gb in readings:
        if shape is not None and step == 1 and (phase, tuple(shape)) not in seen:
            seen.add((phase, tuple(shape)))
            out["per_shape"].append({"phase": phase, "shape": shape, "added_gb": gb - before})
        if phase != "models" and step == 1:
            before = gb
    return out


def markdown(res: dict) -> str:
    s = res["stamp"]
    lines = [f"# Where packed, token-budget and padded micro-batches hold memory ({s['date']})", "",
             f"`{s['command']}` on {s['machine']}, load average {s['load_average']}, {res['code']}.",
             "Resident memory (GB = 10^9 bytes) each side's process holds after its models are built, and what the "
             "first step's reference pass and update add (their compiled graphs; the update also writes the "
             "gradient buffers and AdamW's moments), what the second step adds, and the process peak (VmHWM).", "",
             "| config | workload | side | models | + reference | + update | + step 2 | held | peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, kinds in res["configs"].items():
        for kind, sides in kinds.items():
            for side, d in sides.items():
                held = d["models_gb"] + d["reference_gb"] + d["update_gb"] + d["step2_gb"]
                lines.append(f"| {name} | {kind} | {side} | {d['models_gb']:.3f} | {d['reference_gb']:+.3f} | "
                             f"{d['update_gb']:+.3f} | {d['step2_gb']:+.3f} | {held:.3f} | {d['peak_gb']:.3f} |")
    lines += ["", "What the first call of each micro-batch shape (rows, length, samples, scored tokens) added, GB:", ""]
    for name, kinds in res["configs"].items():
        for kind, sides in kinds.items():
            for side, d in sides.items():
                parts = ", ".join(f"{p['phase']} {tuple(p['shape'])} {p['added_gb']:+.3f}" for p in d["per_shape"])
                lines.append(f"- {name} {kind} {side}: {parts}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["tiny-small-vocab"], choices=list(ALL_CONFIGS))
    ap.add_argument("--kinds", nargs="+", default=["longtail"], choices=KINDS)
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--max_len", type=int, default=512)
    ap.add_argument("--output", default=os.path.join(RESULTS, "packing_memory.json"))
    args = ap.parse_args(argv)
    res = {"stamp": run_stamp("benchmarks.packing_memory", argv), "code": code_version(), "configs": {}}
    for name in args.configs:
        for kind in args.kinds:
            for side in args.sides:  # one at a time: a side's memory is the only one in its process
                with Workers() as sides:
                    w = sides.start(side_worker, name, side, kind, args.samples, args.max_len)
                    readings, peak = w.recv()
                    w.recv()  # the worker's own peak message as it ends
                d = dict(split(readings), peak_gb=peak, readings=readings)
                res["configs"].setdefault(name, {}).setdefault(kind, {})[side] = d
                print(name, kind, side, {k: round(v, 3) for k, v in d.items() if k.endswith("_gb")}, flush=True)
                write_results(args.output, res, markdown(res))
    return res


if __name__ == "__main__":
    main()
