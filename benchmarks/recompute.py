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

import numpy as np

from benchmarks.harness import (RESULTS, code_version, median, peak_since_reset_gb, reset_peak_rss, rss_gb, run_stamp,
                                time_calls, write_results)
from benchmarks.workers import Workers

PROMPT_LENGTHS = (157, 118, 149, 127)  # the 4 GSM8K prompts under the qwen_r1 template (Qwen2.5 tokens)
G, RESPONSE, MICRO_BATCH, BETA = 4, 128, 4, 0.04


def experience(vocab: int):
    """The workload's experience: B = 16 rows, random token ids, advantages and reference log-probs."""
    from mindgrpo.grpo.experience import pack

    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab, n).tolist() for n in PROMPT_LENGTHS for _ in range(G)]
    responses = [rng.integers(1, vocab, RESPONSE).tolist() for _ in prompts]
    exp = pack(prompts, responses, rng.standard_normal(len(prompts)).astype(np.float32))
    exp.ref_logp = (-3.0 + 0.1 * rng.standard_normal(exp.labels.shape)).astype(np.float32) * exp.mask
    return exp


def side(conn, layers: int, vocab: int, recompute: bool) -> None:
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
                            recompute=recompute)
    conn.send({"built_gb": rss_gb(), "params": int(sum(p.size for p in updater.params))})
    while conn.recv() == "update":
        before = rss_gb()
        reset_peak_rss()
        out = {}
        secs = time_calls(lambda: out.update(updater.update(exp, lr=1e-6)), 1)[0]
        conn.send({"seconds": secs, "before_gb": before, "peak_gb": peak_since_reset_gb(), "after_gb": rss_gb(),
                   "loss": out["loss"], "grad_norm": out["grad_norm"]})


def measure(layers: int, vocab: int, updates: int) -> dict:
    """Both sides of one layer count, one after the other (two at once would not fit beside other jobs)."""
    out = {}
    for name in ("off", "on"):
        with Workers() as sides:
            worker = sides.start(side, layers, vocab, name == "on")
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
    return out


def per_layer(res: dict, key: str, name: str):
    """(fixed, per layer) of a figure from the smallest and largest layer counts measured."""
    counts = sorted(int(k) for k in res["layers"])
    lo, hi = res["layers"][str(counts[0])][name][key], res["layers"][str(counts[-1])][name][key]
    slope = (hi - lo) / (counts[-1] - counts[0])
    return lo - slope * counts[0], slope


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
             "held: resident after an update (the runtime keeps the graph's buffers).", "",
             "| layers | recompute | params | built | first update s | first update peak | update s | update peak | "
             "held | process peak | time on/off | peak on/off | same losses |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for layers, sides in res["layers"].items():
        off = sides["off"]
        for name, r in sides.items():
            lines.append(f"| {layers} | {name} | {r['params'] / 1e6:.0f} M | {r['built_gb']:.2f} | "
                         f"{r['first_update_s']:.1f} | {r['first_update_peak_gb']:.2f} | {r['update_s']:.1f} | "
                         f"{r['update_peak_gb']:.2f} | {r['held_after_update_gb']:.2f} | {r['process_peak_gb']:.2f} | "
                         f"{r['update_s'] / off['update_s']:.2f}x | {r['process_peak_gb'] / off['process_peak_gb']:.2f}x | "
                         f"{r['losses'] == off['losses']} |")
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
        res["layers"][str(layers)] = sides = measure(layers, args.vocab, args.updates)
        for name, r in sides.items():
            print(f"layers {layers} recompute {name}: update {r['update_s']:.1f} s, process peak "
                  f"{r['process_peak_gb']:.2f} GB, held {r['held_after_update_gb']:.2f} GB, losses {r['losses']}",
                  flush=True)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
