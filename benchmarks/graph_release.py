"""Releasing a phase's compiled graphs (`rl_config.release_graphs`): the resident memory of GRPO steps
on the Qwen2.5-0.5B shape cut to a few layers, with each phase's graphs kept (the default) or dropped
when the phase ends, and what compiling them again every step costs.

    python -m benchmarks.graph_release [--layers 2] [--vocab 151936] [--steps 2]

MindSpore 2.10's CPU runtime keeps the buffers of a compiled graph after it ran, until the cell that
compiled it is deleted (then they are freed: the resident memory drops at once; `ms_memory_recycle`
and `malloc_trim` free nothing more). So a process that runs the rollout's graphs, the reference's
scoring graph and the update graph holds all their buffers at once; released at the end of each
phase, it holds one phase's at a time.

Two sides, each in its own process, one after the other (both at once would not fit beside other
jobs): `keep` and `release`. Each builds the policy, the inference copy (with its weight sync), the
reference, the rollout engine, the reference scorer and the policy's updater, then runs `--steps`
steps of the issue-20 workload (4 prompts of 157, 118, 149 and 127 tokens, random ids, x G = 4, 128
forced new tokens, micro-batches of 4 rows, beta 0.04): generate, reference scoring, update, sync,
releasing the engine, the scorer, the updater and the weight sync after their phases on the
`release` side (`RolloutEngine.release`, `Scorer.release`, `PolicyUpdater.release`,
`WeightSync.release`). Per part:
seconds, resident memory after it and its peak (VmHWM, reset before each part), in GB = 10^9 bytes.
The two sides' losses must agree exactly (the same graphs compiled again).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from benchmarks.harness import RESULTS, code_version, run_stamp, stamp_lines, write_results
from benchmarks.update_sides import (BETA, G, MICRO_BATCH, PROMPT_LENGTHS, RESPONSE, make_engine, make_updater,
                                     part_recorder, step_workload)
from benchmarks.workers import Workers

SIDES = ("keep", "release")


def side(conn, layers: int, vocab: int, steps: int, release: bool) -> None:
    """A `benchmarks.workers` side: builds, then runs the steps; one record per part, then "done"."""
    import mindspore as ms

    from mindgrpo.grpo.actor import Scorer
    from mindgrpo.grpo.experience import pack
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM
    from mindgrpo.parallel.weight_sync import WeightSync

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg, positions, prompts, params, rng = step_workload(layers, vocab)
    advantages = rng.standard_normal(len(prompts) * G).astype(np.float32)
    part = part_recorder(conn)

    def build():
        policy = Qwen2ForCausalLM(cfg, seed=0, max_positions=positions)
        inference = Qwen2ForCausalLM(cfg, seed=1, max_positions=positions)
        sync = WeightSync(policy, inference)
        reference = Qwen2ForCausalLM(cfg, seed=0, max_positions=positions)
        for p in reference.get_parameters():
            p.requires_grad = False
        engine, updater = make_engine(inference, prompts), make_updater(policy)
        return engine, Scorer(reference, MICRO_BATCH), updater, sync

    engine, scorer, updater, sync = part("build", build)
    part("sync 0", sync)
    if release:
        part("release sync 0", sync.release)
    losses = []
    for step in range(1, steps + 1):
        done = part(f"generate {step}", lambda: engine.generate(prompts, params))
        if release:
            part(f"release engine {step}", engine.release)
        exp = pack([prompts[i // G] for i in range(len(done))], [c.token_ids for c in done], advantages)
        exp.ref_logp = part(f"reference {step}", lambda: scorer(exp))
        if release:
            part(f"release scorer {step}", scorer.release)
        losses.append(part(f"update {step}", lambda: updater.update(exp, lr=1e-6))["loss"])
        if release:
            part(f"release updater {step}", updater.release)
        part(f"sync {step}", sync)
        if release:
            part(f"release sync {step}", sync.release)
    conn.send({"losses": losses})
    conn.send("done")


def measure(layers: int, vocab: int, steps: int) -> dict:
    out = {}
    for name in SIDES:  # one after the other: never two memory-hungry sides at once
        with Workers() as sides:
            worker = sides.start(side, layers, vocab, steps, name == "release")
            parts = []
            while True:
                msg = worker.recv()
                if msg == "done":
                    break
                if "losses" in msg:
                    losses = msg["losses"]
                    continue
                parts.append(msg)
                print(f"  {name:7s} {msg['part']:20s} {msg['seconds']:7.1f} s  held {msg['after_gb']:6.2f} GB  "
                      f"peak {msg['peak_gb']:6.2f} GB", flush=True)
            peak_gb = worker.recv()
        out[name] = {"parts": parts, "losses": losses, "process_peak_gb": peak_gb}
    return out


def summary(res: dict) -> dict:
    """Per side: the process peak, what it holds at the end, and each step's seconds (the release
    side's include compiling every graph again)."""
    out = {}
    for name, r in res["sides"].items():
        steps = {}
        for p in r["parts"]:
            step = int(p["part"].rsplit(" ", 1)[1]) if p["part"] != "build" else 0
            if step > 0:  # not the build and the first sync
                steps[step] = steps.get(step, 0.0) + p["seconds"]
        out[name] = {"process_peak_gb": r["process_peak_gb"], "held_at_end_gb": r["parts"][-1]["after_gb"],
                     "step_seconds": [steps[k] for k in sorted(steps)]}
    return out


def markdown(res: dict) -> str:
    keep, rel = res["sides"]["keep"], res["sides"]["release"]
    s = res["summary"]
    lines = ["# Releasing each phase's compiled graphs (rl_config.release_graphs)", "",
             *stamp_lines(res, " (other jobs shared the machine: seconds are rough)"),
             f"Workload: the Qwen2.5-0.5B shape (hidden 896, intermediate 4864, 14 / 2 heads, tied) cut to "
             f"{res['layers']} layers, vocabulary {res['vocab']}; 4 prompts ({list(PROMPT_LENGTHS)} tokens) x G = "
             f"{G}, {RESPONSE} forced new tokens, micro-batches of {MICRO_BATCH} rows, beta {BETA}; each side in its "
             "own process, one after the other. Resident memory in GB (10^9 bytes): held = after the part, "
             "peak = while it ran (VmHWM).", "",
             "| part | keep: s | keep: held | keep: peak | release: s | release: held | release: peak |",
             "|---|---|---|---|---|---|---|"]
    kept = {p["part"]: p for p in keep["parts"]}
    for p in rel["parts"]:
        k = kept.get(p["part"])
        left = f"{k['seconds']:.1f} | {k['after_gb']:.2f} | {k['peak_gb']:.2f}" if k else " | | "
        lines.append(f"| {p['part']} | {left} | {p['seconds']:.1f} | {p['after_gb']:.2f} | {p['peak_gb']:.2f} |")
    lines += ["", f"Process peak: keep {s['keep']['process_peak_gb']:.2f} GB, release "
              f"{s['release']['process_peak_gb']:.2f} GB "
              f"({s['release']['process_peak_gb'] / s['keep']['process_peak_gb']:.2f}x); held at the end: keep "
              f"{s['keep']['held_at_end_gb']:.2f} GB, release {s['release']['held_at_end_gb']:.2f} GB.",
              "Seconds per step (generate, reference, update, sync and the releases): keep "
              + ", ".join(f"{x:.1f}" for x in s["keep"]["step_seconds"]) + "; release "
              + ", ".join(f"{x:.1f}" for x in s["release"]["step_seconds"])
              + f" (a later step: {s['release']['step_seconds'][-1] / s['keep']['step_seconds'][-1]:.2f}x, "
              "the cost of compiling every graph again).",
              f"Losses the same on both sides: {keep['losses'] == rel['losses']} ({keep['losses']})."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--output", default=os.path.join(RESULTS, "graph_release.json"))
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (a later step shows the cost of compiling again)")
    res = dict(run_stamp("benchmarks.graph_release", argv), code=code_version(), layers=args.layers, vocab=args.vocab)
    res["sides"] = measure(args.layers, args.vocab, args.steps)
    res["summary"] = summary(res)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
