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
`PolicyUpdater.update` on one micro-batch of the issue-20 workload (the 157-token prompt x G = 4, 128
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

from benchmarks.harness import (RESULTS, code_version, median, peak_since_reset_gb, reset_peak_rss, rss_gb, run_stamp,
                                time_calls, write_results)
from benchmarks.recompute import BETA, G, MICRO_BATCH, PROMPT_LENGTHS, RESPONSE
from benchmarks.workers import Workers

SIDES = ("whole", "layerwise")


def experience(vocab: int):
    """One micro-batch: the first prompt's G = 4 rows, random ids, advantages and reference log-probs."""
    from mindgrpo.grpo.experience import pack

    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab, PROMPT_LENGTHS[0]).tolist()] * G
    responses = [rng.integers(1, vocab, RESPONSE).tolist() for _ in prompts]
    exp = pack(prompts, responses, rng.standard_normal(len(prompts)).astype(np.float32))
    exp.ref_logp = (-3.0 + 0.1 * rng.standard_normal(exp.labels.shape)).astype(np.float32) * exp.mask
    return exp


def side(conn, layers: int, vocab: int, layerwise: bool) -> None:
    """A `benchmarks.workers` side: builds, then runs one update per "update" message."""
    import mindspore as ms

    from mindgrpo.grpo.actor import PolicyUpdater
    from mindgrpo.grpo.ms_objective import GRPOLoss
    from mindgrpo.models.presets import preset_config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg = preset_config("qwen2_5_0_5b", num_hidden_layers=layers, vocab_size=vocab)
    exp = experience(vocab)
    lm = Qwen2ForCausalLM(cfg, seed=0, max_positions=exp.input_ids.shape[1])
    updater = PolicyUpdater(lm, GRPOLoss(beta=BETA, kl_kind="k3"), micro_batch_size=MICRO_BATCH, detach_old=True,
                            use_ref=True, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                            layerwise=layerwise)
    conn.send({"built_gb": rss_gb(), "params": int(sum(p.size for p in updater.params))})
    while conn.recv() == "update":
        before = rss_gb()
        reset_peak_rss()
        out = {}
        secs = time_calls(lambda: out.update(updater.update(exp, lr=1e-6)), 1)[0]
        conn.send({"seconds": secs, "before_gb": before, "peak_gb": peak_since_reset_gb(), "after_gb": rss_gb(),
                   "loss": out["loss"], "grad_norm": out["grad_norm"]})


def measure(layers: int, vocab: int, updates: int) -> dict:
    out = {}
    for name in SIDES:  # one after the other: never two memory-hungry sides at once
        with Workers() as sides:
            worker = sides.start(side, layers, vocab, name == "layerwise")
            built = worker.recv()
            runs = [worker.ask("update") for _ in range(updates + 1)]
            peak_gib = worker.ask("stop")
        first, later = runs[0], runs[1:]
        out[name] = {**built, "first_update_s": first["seconds"], "first_update_peak_gb": first["peak_gb"],
                     "update_s": median([r["seconds"] for r in later]),
                     "update_peak_gb": max(r["peak_gb"] for r in later),
                     "held_after_update_gb": later[-1]["after_gb"],
                     "process_peak_gb": peak_gib * 2 ** 30 / 1e9,
                     "losses": [r["loss"] for r in runs], "grad_norms": [r["grad_norm"] for r in runs]}
        print(f"layers {layers} {name}: update {out[name]['update_s']:.1f} s, process peak "
              f"{out[name]['process_peak_gb']:.2f} GB, held {out[name]['held_after_update_gb']:.2f} GB", flush=True)
    return out


def per_layer(res: dict, key: str, name: str):
    """(fixed, per layer) of a figure from the smallest and largest layer counts measured."""
    counts = sorted(int(k) for k in res["layers"])
    lo, hi = res["layers"][str(counts[0])][name][key], res["layers"][str(counts[-1])][name][key]
    slope = (hi - lo) / (counts[-1] - counts[0])
    return lo - slope * counts[0], slope


def close(a, b) -> bool:
    return bool(np.allclose(a, b, rtol=1e-6, atol=0))


def markdown(res: dict) -> str:
    lines = ["# The layerwise update against the whole-model training graph (actor_config.layerwise_update)", "",
             f"Date {res['date']}; machine: {res['machine']}; load average {res['load_average']} at the start, "
             f"{res['load_average_end']:.1f} at the end (other jobs shared the machine; the sides ran one after the "
             "other, so the time ratios are rough).", "",
             f"Command (from the repo root): `{res['command']}`; library code: {res['code']}.", "",
             "Workload: the Qwen2.5-0.5B shape (hidden 896, intermediate 4864, 14 / 2 heads, tied) cut to the given "
             f"layers, vocabulary {res['vocab']}; one micro-batch of {MICRO_BATCH} rows ({PROMPT_LENGTHS[0]} prompt + "
             f"{RESPONSE} response tokens, S = {res['seq_len']}), beta {BETA}; `PolicyUpdater.update` (forward, loss, "
             "backward, then AdamW): one compiling update, then the median of the later ones. Resident memory in GB "
             "(10^9 bytes); held: after an update (the runtime keeps the graphs' buffers).", "",
             "| layers | side | params | built | first update s | first update peak | update s | update peak | held | "
             "process peak | time / whole | peak / whole | losses and grad norms agree (1e-6) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for layers, sides in res["layers"].items():
        whole = sides["whole"]
        for name, r in sides.items():
            agree = close(r["losses"], whole["losses"]) and close(r["grad_norms"], whole["grad_norms"])
            lines.append(f"| {layers} | {name} | {r['params'] / 1e6:.0f} M | {r['built_gb']:.2f} | "
                         f"{r['first_update_s']:.1f} | {r['first_update_peak_gb']:.2f} | {r['update_s']:.1f} | "
                         f"{r['update_peak_gb']:.2f} | {r['held_after_update_gb']:.2f} | {r['process_peak_gb']:.2f} | "
                         f"{r['update_s'] / whole['update_s']:.2f}x | "
                         f"{r['process_peak_gb'] / whole['process_peak_gb']:.2f}x | {agree} |")
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
               seq_len=int(experience(args.vocab).input_ids.shape[1]), layers={})
    for layers in args.layers:
        res["layers"][str(layers)] = measure(layers, args.vocab, args.updates)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
