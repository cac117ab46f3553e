"""The issue-20 update workload on the Qwen2.5-0.5B shape, shared by the memory benchmarks: its
constants, its experience, and one side per process that builds the policy with given
`PolicyUpdater` options and runs updates on request (`benchmarks/recompute.py`), and the parts of a whole
step (`benchmarks/memory.py`, `prefill_budget.py`, `layerwise_generate.py`).

Workload: 4 GSM8K prompts of 157, 118, 149 and 127 tokens (the qwen_r1 template, Qwen2.5 tokens)
x G = 4, 128 response tokens each, micro-batches of 4 rows, beta 0.04 with given reference log-probs.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.harness import median, peak_since_reset_gb, reset_peak_rss, rss_gb
from benchmarks.workers import Workers

PROMPT_LENGTHS = (157, 118, 149, 127)  # the 4 GSM8K prompts under the qwen_r1 template (Qwen2.5 tokens)
G, RESPONSE, MICRO_BATCH, BETA = 4, 128, 4, 0.04


def experience(vocab: int, prompt_lengths=PROMPT_LENGTHS):
    """G rows per prompt: random token ids, advantages and reference log-probs."""
    from mindgrpo.grpo.experience import pack

    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab, n).tolist() for n in prompt_lengths for _ in range(G)]
    responses = [rng.integers(1, vocab, RESPONSE).tolist() for _ in prompts]
    exp = pack(prompts, responses, rng.standard_normal(len(prompts)).astype(np.float32))
    exp.ref_logp = (-3.0 + 0.1 * rng.standard_normal(exp.labels.shape)).astype(np.float32) * exp.mask
    return exp


def model_config(layers: int, vocab: int):
    """The Qwen2.5-0.5B shape with the given decoder layers and vocabulary."""
    from mindgrpo.models.presets import preset_config

    return preset_config("qwen2_5_0_5b", num_hidden_layers=layers, vocab_size=vocab)


def step_workload(layers: int, vocab: int):
    """A whole step's inputs: the model config, the positions its models hold, the prompts' token ids,
    the sampling parameters (G samples of RESPONSE forced tokens) and the random generator that made
    the prompts (the caller draws its advantages from it)."""
    from mindgrpo.inference.sampling import SamplingParams

    cfg = model_config(layers, vocab)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab, n).tolist() for n in PROMPT_LENGTHS]
    params = SamplingParams(max_tokens=RESPONSE, n=G, ignore_stop=True, seed=0)
    return cfg, max(PROMPT_LENGTHS) + RESPONSE + 64, prompts, params, rng


def make_engine(inference, prompts):
    """The rollout engine for the workload: a slot per sample."""
    from mindgrpo.inference.engine import RolloutEngine

    return RolloutEngine(inference, max_num_seqs=len(prompts) * G, max_model_len=max(PROMPT_LENGTHS) + RESPONSE)


def make_updater(policy, chunk: int = 0, recompute: bool = False):
    """The workload's PolicyUpdater (GRPO loss with a k3 KL to given reference log-probs, AdamW)."""
    from mindgrpo.grpo.actor import PolicyUpdater
    from mindgrpo.grpo.ms_objective import GRPOLoss
    from mindgrpo.grpo.packing import Batching
    from mindgrpo.memory.policy import MemoryPolicy

    return PolicyUpdater(policy, GRPOLoss(beta=BETA, kl_kind="k3"), Batching(MICRO_BATCH), detach_old=True,
                         use_ref=True, chunk=chunk, memory=MemoryPolicy(recompute=recompute))


def measured(fn):
    """(what fn returns, {its seconds, the resident memory before and after it, its peak in between})."""
    before = rss_gb()
    reset_peak_rss()
    t0 = time.perf_counter()
    out = fn()
    return out, {"seconds": time.perf_counter() - t0, "before_gb": before, "peak_gb": peak_since_reset_gb(),
                 "after_gb": rss_gb()}


def part_recorder(conn):
    """part(name, fn): runs fn and sends the part's `measured` figures; returns what fn returns."""
    def part(name, fn):
        out, figures = measured(fn)
        conn.send({"part": name, **figures})
        return out
    return part


def side(conn, layers: int, vocab: int, prompt_lengths, options: dict) -> None:
    """A `benchmarks.workers` side: builds the policy, its gradient buffers and AdamW with the given
    PolicyUpdater options, then runs one update per "update" message."""
    import mindspore as ms

    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg = model_config(layers, vocab)
    exp = experience(vocab, prompt_lengths)
    lm = Qwen2ForCausalLM(cfg, seed=0, max_positions=exp.input_ids.shape[1])
    updater = make_updater(lm, **options)
    conn.send({"built_gb": rss_gb(), "params": int(sum(p.size for p in updater.params))})
    while conn.recv() == "update":
        out, figures = measured(lambda: updater.update(exp, lr=1e-6))
        conn.send({**figures, "loss": out["loss"], "grad_norm": out["grad_norm"]})


def measure(layers: int, vocab: int, updates: int, prompt_lengths, sides: dict) -> dict:
    """Each side (name -> PolicyUpdater options) in its own process, one after the other (two at once
    would not fit beside other jobs): a compiling update, then `updates` measured ones."""
    out = {}
    for name, options in sides.items():
        with Workers() as workers:
            worker = workers.start(side, layers, vocab, prompt_lengths, options)
            built = worker.recv()
            runs = [worker.ask("update") for _ in range(updates + 1)]
            peak_gb = worker.ask("stop")
        first, later = runs[0], runs[1:]
        out[name] = {**built, "first_update_s": first["seconds"], "first_update_peak_gb": first["peak_gb"],
                     "update_s": median([r["seconds"] for r in later]),
                     "update_peak_gb": max(r["peak_gb"] for r in later),
                     "held_after_update_gb": later[-1]["after_gb"],
                     "process_peak_gb": peak_gb,
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


def table(res: dict, side_header: str, baseline: str, same_header: str, same) -> list:
    """The per-(layers, side) markdown table of `measure`'s figures, time and peak as ratios to the
    `baseline` side; the last column is same(side, baseline) (do the two agree?)."""
    lines = [f"| layers | {side_header} | params | built | first update s | first update peak | update s | "
             f"update peak | held | process peak | time / {baseline} | peak / {baseline} | {same_header} |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for layers, sides in res["layers"].items():
        base = sides[baseline]
        for name, r in sides.items():
            lines.append(f"| {layers} | {name} | {r['params'] / 1e6:.0f} M | {r['built_gb']:.2f} | "
                         f"{r['first_update_s']:.1f} | {r['first_update_peak_gb']:.2f} | {r['update_s']:.1f} | "
                         f"{r['update_peak_gb']:.2f} | {r['held_after_update_gb']:.2f} | {r['process_peak_gb']:.2f} | "
                         f"{r['update_s'] / base['update_s']:.2f}x | "
                         f"{r['process_peak_gb'] / base['process_peak_gb']:.2f}x | {same(r, base)} |")
    return lines
