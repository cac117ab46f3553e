"""Where the memory of a GRPO step goes at the Qwen2.5-0.5B shape: each part built or run in turn,
with the resident memory it adds and the peak it reaches.

    python -m benchmarks.memory [--layers 2 4] [--vocab 151936] [--recompute] [--chunk 0]

One process per layer count (the shape's hidden 896, intermediate 4864, 14 / 2 heads, tied, its
full vocabulary), on the issue-20 workload: 4 prompts of 157, 118, 149 and 127 tokens (the GSM8K
prompts' lengths under the qwen_r1 template; random ids) x G = 4, 128 forced new tokens, micro-
batches of 4 rows, beta 0.04. In the order a run builds and runs them:

    policy            the policy's fp32 parameters
    inference         the inference model (a second copy) and its first sync from the policy
    generate (1st)    the rollout engine built and its first call: prefill / copy / decode graphs
                      compiled, the KV cache and the fused copies of the layer weights made
    generate (2nd)    a second call on the same shapes
    reference         the reference model's parameters
    reference scoring (1st, 2nd)   the scoring graph over the reference, micro-batch by micro-batch
    grads + AdamW     the gradient buffers and the two moments (PolicyUpdater)
    update (1st, 2nd) forward, loss, backward per micro-batch, then AdamW
    sync              the inference copy from the policy (same layout)

Per part: resident memory before and after (held: CPU memory pools keep what a graph used) and the
peak while it ran (VmHWM, reset before each part), in GB = 10^9 bytes. Two layer counts give every
part as fixed + per layer x layers, extrapolated to the 24 layers of Qwen2.5-0.5B, beside what
`scripts/plan_memory.py` plans for it on the same workload (`PLANNED`: its groups per part).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from benchmarks.harness import RESULTS, code_version, rss_gb, run_stamp, write_results
from benchmarks.update_sides import (BETA, G, MICRO_BATCH, PROMPT_LENGTHS, RESPONSE, make_engine, make_updater,
                                     model_config, part_recorder, step_workload)
from benchmarks.workers import Workers

FULL_LAYERS = 24  # Qwen2.5-0.5B


def side(conn, layers: int, vocab: int, recompute: bool, chunk: int) -> None:
    """A `benchmarks.workers` side: every part in turn; sends one record per part, then "done"."""
    import mindspore as ms

    from mindgrpo.grpo.actor import Scorer
    from mindgrpo.grpo.experience import pack
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM
    from mindgrpo.parallel.weight_sync import WeightSync

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg, positions, prompts, params, rng = step_workload(layers, vocab)
    state = {}
    part = part_recorder(conn)

    def experience():
        done = state["completions"]
        exp = pack([prompts[i // G] for i in range(len(done))], [c.token_ids for c in done],
                   rng.standard_normal(len(done)).astype(np.float32))
        state["exp"] = exp

    def score():
        state["exp"].ref_logp = state["scorer"](state["exp"])

    conn.send({"part": "start", "seconds": 0.0, "before_gb": rss_gb(), "peak_gb": rss_gb(), "after_gb": rss_gb()})
    part("policy", lambda: state.update(policy=Qwen2ForCausalLM(cfg, seed=0, max_positions=positions)))

    def inference():
        state["inference"] = Qwen2ForCausalLM(cfg, seed=1, max_positions=positions)
        state["sync"] = WeightSync(state["policy"], state["inference"])
        state["sync"]()

    part("inference", inference)

    def first_generate():
        state["engine"] = make_engine(state["inference"], prompts)
        state["completions"] = state["engine"].generate(prompts, params)

    part("generate (1st)", first_generate)
    part("generate (2nd)", lambda: state.update(completions=state["engine"].generate(prompts, params)))
    experience()

    def reference():
        state["reference"] = ref = Qwen2ForCausalLM(cfg, seed=0, max_positions=positions)
        for p in ref.get_parameters():
            p.requires_grad = False
        state["scorer"] = Scorer(ref, MICRO_BATCH, chunk=chunk)

    part("reference", reference)
    part("reference scoring (1st)", score)
    part("reference scoring (2nd)", score)
    part("grads + AdamW", lambda: state.update(updater=make_updater(state["policy"], chunk=chunk,
                                                                    recompute=recompute)))
    part("update (1st)", lambda: state["updater"].update(state["exp"], lr=1e-6))
    part("update (2nd)", lambda: state["updater"].update(state["exp"], lr=1e-6))
    part("sync", lambda: state["sync"]())
    conn.send("done")


def measure(layers: int, vocab: int, recompute: bool, chunk: int) -> list:
    with Workers() as sides:
        worker = sides.start(side, layers, vocab, recompute, chunk)
        parts = []
        while True:
            msg = worker.recv()
            if msg == "done":
                break
            parts.append(msg)
            print(f"  layers {layers}: {msg['part']:24s} {msg['seconds']:7.1f} s  held {msg['after_gb']:6.2f} GB "
                  f"(+{msg['after_gb'] - msg['before_gb']:5.2f})  peak {msg['peak_gb']:6.2f} GB", flush=True)
        worker.recv()  # its peak
    return parts


def fit(res: dict) -> dict:
    """part -> (fixed, per layer) of what it adds to the resident memory and of its peak above the
    memory before it, from the smallest and largest layer counts."""
    counts = sorted(int(k) for k in res["layers"])
    lo, hi = res["layers"][str(counts[0])], res["layers"][str(counts[-1])]
    out = {}
    for a, b in zip(lo, hi):
        name = a["part"]
        pairs = {"adds": (a["after_gb"] - a["before_gb"], b["after_gb"] - b["before_gb"]),
                 "peak_over_before": (a["peak_gb"] - a["before_gb"], b["peak_gb"] - b["before_gb"]),
                 "peak": (a["peak_gb"], b["peak_gb"])}
        out[name] = {}
        for key, (x, y) in pairs.items():
            slope = (y - x) / (counts[-1] - counts[0])
            out[name][key] = {"fixed": x - slope * counts[0], "per_layer": slope,
                              "at_24": x + slope * (FULL_LAYERS - counts[0])}
    return out


# what mindgrpo/memory/plan.py counts for each part (its groups, bytes)
PLANNED = {"policy": ("policy",), "inference": ("inference model", "transient"), "generate (1st)": ("fused", "kv_cache"),
           "reference": ("reference",), "reference scoring (1st)": (), "grads + AdamW": ("grads", "optimizer"),
           "update (1st)": ("activations",)}


def planned(vocab: int, layers: int = FULL_LAYERS) -> dict:
    """part -> GB that `scripts/plan_memory.py` plans for it, on this workload (one device, fp32)."""
    from mindgrpo.config import GRPOConfig, load_config
    from mindgrpo.memory.plan import inference_copy_bytes, piece_bytes, plan
    from mindgrpo.parallel.layout import ParallelLayout

    cfg = load_config(GRPOConfig, overrides=[
        f"rl_config.batch_size={len(PROMPT_LENGTHS)}", f"rl_config.num_generations={G}", f"rl_config.beta={BETA}",
        f"generate_config.max_prompt_length={max(PROMPT_LENGTHS)}", f"generate_config.max_tokens={RESPONSE}",
        f"generate_config.max_num_seqs={len(PROMPT_LENGTHS) * G}", f"actor_config.micro_batch_size={MICRO_BATCH}"])
    mcfg = model_config(layers, vocab)
    p = plan(cfg, mcfg)
    one = ParallelLayout()
    groups = dict(p.groups, activations=p.activations, fused=inference_copy_bytes(mcfg, one))
    groups["inference model"] = piece_bytes(mcfg, one)
    return {part: sum(groups[g] for g in names) / 1e9 for part, names in PLANNED.items()}


def markdown(res: dict) -> str:
    counts = sorted(int(k) for k in res["layers"])
    lines = ["# Where the memory of a GRPO step goes (Qwen2.5-0.5B shape)", "",
             f"Date {res['date']}; machine: {res['machine']}; load average {res['load_average']} "
             "(other jobs shared the machine: the seconds are rough).", "",
             f"Command (from the repo root): `{res['command']}`; library code: {res['code']}.", "",
             f"Workload: hidden 896, intermediate 4864, 14 / 2 heads, tied, vocabulary {res['vocab']}, at "
             f"{' and '.join(map(str, counts))} layers; 4 prompts ({list(PROMPT_LENGTHS)} tokens) x G = {G}, "
             f"{RESPONSE} forced new tokens, micro-batches of {MICRO_BATCH} rows, beta {BETA}, recompute "
             f"{res['recompute']}, logprob_chunk_size {res['chunk']}. Resident memory in GB (10^9 bytes): held = "
             "after the part (CPU memory pools keep what a graph used); peak = while it ran.", ""]
    head = "| part | " + " | ".join(f"{n} layers: s, +held, peak" for n in counts) + \
        " | +held = fixed + per layer | at 24 layers: +held | peak over before at 24 | plan_memory at 24 |"
    lines += [head, "|" + "---|" * (2 + len(counts) + 3)]
    plans = res.get("planned_gb_at_24", {})
    fits = fit(res) if len(counts) >= 2 else {}
    for i, first in enumerate(res["layers"][str(counts[0])]):
        cells = []
        for n in counts:
            r = res["layers"][str(n)][i]
            cells.append(f"{r['seconds']:.1f}, {r['after_gb'] - r['before_gb']:+.2f}, {r['peak_gb']:.2f}")
        f = fits.get(first["part"])
        tail = (f"{f['adds']['fixed']:+.2f} {f['adds']['per_layer']:+.3f}/layer | {f['adds']['at_24']:+.2f} | "
                f"{f['peak_over_before']['at_24']:.2f}") if f else " | | "
        plan_cell = f"{plans[first['part']]:.2f}" if first["part"] in plans else ""
        lines.append(f"| {first['part']} | " + " | ".join(cells) + f" | {tail} | {plan_cell} |")
    if fits:
        held = sum(f["adds"]["at_24"] for f in fits.values())
        peak = max(f["peak"]["at_24"] for f in fits.values())
        lines += ["", f"Extrapolated to 24 layers: held at the end {held:.1f} GB, the largest peak {peak:.1f} GB "
                  "(each part's peak extrapolated on its own)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--recompute", action="store_true", help="actor_config.recompute in the update")
    ap.add_argument("--chunk", type=int, default=0, help="actor_config.logprob_chunk_size (0: the dense head)")
    ap.add_argument("--output", default=os.path.join(RESULTS, "memory.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.memory", argv), code=code_version(), vocab=args.vocab,
               recompute=args.recompute, chunk=args.chunk, layers={})
    for layers in args.layers:  # one process at a time: never two memory-hungry sides at once
        res["layers"][str(layers)] = measure(layers, args.vocab, args.recompute, args.chunk)
    if len(args.layers) >= 2:
        res["fit"] = fit(res)
    res["planned_gb_at_24"] = planned(args.vocab)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
