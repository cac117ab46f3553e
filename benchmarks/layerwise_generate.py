"""The rollout engine's graphs whole or one decoder layer at a time (generate_config.layerwise): what the
first generate call keeps resident at the Qwen2.5-0.5B shape, and what the layer graphs cost in time.

    python -m benchmarks.layerwise_generate [--layers 2 4] [--tiny-rounds 5] [--groups 0 1 4] [--output PATH]

The sides: `whole` (the whole-model graphs) and, for each nonzero --groups k, `layers of k` (layerwise, k
decoder layers in a decode graph: generate_config.decode_layers_per_graph).

memory   The 0.5B shape (hidden 896, intermediate 4864, 14 / 2 heads, tied, vocabulary 151,936) at each
         --layers, the issue-20 rollout: 4 prompts of 157, 118, 149 and 127 random tokens x G = 4, 128
         forced new tokens, 16 slots of 285 positions, generating with the policy model itself. Each
         (layers, side) in its own process, one after the other: the model, then the engine built and its
         first call (prefill, copy and decode graphs compiled, the fused copies refreshed), then a second
         call. Resident memory after each and its peak (VmHWM) in GB = 10^9 bytes; fixed + per layer from
         the smallest and largest layer counts (with two or more), extrapolated to 24. The sides' tokens and
         log-probs must be equal bit for bit.
tiny     The tiny default's rollout (32 prompts of 20 to 60 random tokens x G = 8, 40 forced tokens at
         temperature 0.7, 256 slots) on tiny_qwen2 (4 layers, hidden 128, vocabulary 512) and on its 2-layer
         cut with an MLP of 256 (the tiny default's model on main since 5374cc1), each in its own process:
         each side's first call (compiles), then --tiny-rounds rounds of one call per side, alternating
         (0: none).

MindSpore 2.10's CPU runtime keeps the buffers of every compiled graph after it ran: the whole-model
prefill and decode graphs and the fused-weight refresh keep every layer's intermediates; the layer graphs
(`mindgrpo/inference/graphs.py`: PrefillLayer run for every layer, DecodeLayers for every k layers) keep one
layer's (k layers' for decode). A graph call costs milliseconds, and the decode step's are paid at every token.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.harness import (RESULTS, code_version, median, rss_gb, run_stamp, stamp_lines, values_differ,
                                write_results)
from benchmarks.update_sides import G, PROMPT_LENGTHS, RESPONSE, measured, step_workload
from benchmarks.workers import Workers



def side_name(group: int) -> str:
    return "whole" if group == 0 else f"layers of {group}"


def make_engine(lm, group: int, **kw):
    from mindgrpo.inference.engine import RolloutEngine

    return RolloutEngine(lm, layerwise=group > 0, decode_layers_per_graph=max(group, 1), **kw)
FULL_LAYERS = 24


def memory_side(conn, layers: int, group: int) -> None:
    """A `benchmarks.workers` side: the model, the engine's first and second call; their figures (the second
    call's decode seconds too), then the samples' tokens and log-probs."""
    import mindspore as ms

    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg, positions, prompts, params, _ = step_workload(layers, 151936)
    lm, model = measured(lambda: Qwen2ForCausalLM(cfg, seed=0, max_positions=positions))
    engine = make_engine(lm, group, max_num_seqs=len(prompts) * G, max_model_len=max(PROMPT_LENGTHS) + RESPONSE)
    out, first = measured(lambda: engine.generate(prompts, params))
    first["before_gb"] = model["after_gb"]  # the engine's construction counts with its first call
    _, second = measured(lambda: engine.generate(prompts, params))
    second["decode_s"] = engine.last_stats["decode_seconds"]
    conn.send({"model": model, "first": first, "second": second, "graphs": engine.compiled_graphs,
               "tokens": [c.token_ids for c in out], "logprobs": [c.logprobs.tolist() for c in out],
               "sampling_logprobs": [c.sampling_logprobs.tolist() for c in out]})


def measure_memory(layer_counts, groups) -> dict:
    res = {}
    for layers in layer_counts:
        res[str(layers)] = {}
        for group in groups:  # one process at a time
            name = side_name(group)
            with Workers() as workers:
                r = workers.start(memory_side, layers, group).recv()
            res[str(layers)][name] = r
            print(f"layers {layers} {name}: first call {r['first']['seconds']:.1f} s, +"
                  f"{r['first']['after_gb'] - r['first']['before_gb']:.2f} GB held, peak {r['first']['peak_gb']:.2f}"
                  f"; second {r['second']['seconds']:.1f} s", flush=True)
        sides = [side_name(g) for g in groups]
        res[str(layers)]["compared"] = [compare(a, b, res[str(layers)][a], res[str(layers)][b])
                                        for i, a in enumerate(sides) for b in sides[i + 1:]]
        res[str(layers)]["identical"] = all(c["identical"] for c in res[str(layers)]["compared"])
        for side in sides:
            for k in ("tokens", "logprobs", "sampling_logprobs"):
                del res[str(layers)][side][k]
    return res


def compare(a: str, b: str, ra: dict, rb: dict) -> dict:
    """Two sides' samples: the same tokens? how many log-probs (of each kind) differ, and by how much at most."""
    out = {"sides": [a, b], "same_tokens": ra["tokens"] == rb["tokens"]}
    for k in ("logprobs", "sampling_logprobs"):
        out[k] = values_differ(ra[k], rb[k])
    out["identical"] = out["same_tokens"] and all(out[k]["differ"] == 0 for k in ("logprobs", "sampling_logprobs"))
    return out


def fit(res: dict, side: str) -> dict:
    counts = sorted(int(k) for k in res)
    lo, hi = (res[str(counts[0])][side]["first"], res[str(counts[-1])][side]["first"])
    adds = [r["after_gb"] - r["before_gb"] for r in (lo, hi)]
    slope = (adds[1] - adds[0]) / (counts[-1] - counts[0])
    fixed = adds[0] - slope * counts[0]
    return {"fixed_gb": fixed, "per_layer_gb": slope, "at_24_gb": fixed + slope * FULL_LAYERS}


# tiny_qwen2, and the 2-layer model with an MLP of 256 that the tiny default trains on main since 5374cc1
TINY_MODELS = {"tiny_qwen2 (4 layers)": {}, "2 layers, MLP 256": {"num_hidden_layers": 2, "intermediate_size": 256}}


def tiny_timing(rounds: int, groups) -> dict:
    """Both sides on the tiny default's rollout, per tiny model, each model in its own process."""
    out = {}
    for name, overrides in TINY_MODELS.items():
        with Workers() as workers:
            out[name] = workers.start(_tiny_side, rounds, overrides, groups).recv()
    return out


def _tiny_side(conn, rounds: int, overrides: dict, groups) -> None:
    import mindspore as ms

    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.models.presets import preset_config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    lm = Qwen2ForCausalLM(preset_config("tiny_qwen2", **overrides), seed=0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 512, int(n)).tolist() for n in rng.integers(20, 61, 32)]
    params = SamplingParams(max_tokens=40, temperature=0.7, n=8, seed=1, ignore_stop=True)
    engines = {side_name(group): make_engine(lm, group, max_num_seqs=256, max_model_len=128 + 40)
               for group in groups}
    sides = list(engines)
    first, times, outs = {}, {name: [] for name in sides}, {}
    for name, e in engines.items():
        t0 = time.perf_counter()
        outs[name] = [c.token_ids for c in e.generate(prompts, params)]
        first[name] = time.perf_counter() - t0
    for _ in range(rounds):
        for name, e in engines.items():
            t0 = time.perf_counter()
            e.generate(prompts, params)
            times[name].append(time.perf_counter() - t0)
    conn.send({"first_s": first, "times_s": times, "median_s": {k: median(v) for k, v in times.items()},
               "same_tokens": all(outs[sides[0]] == outs[s] for s in sides[1:]), "rss_gb": rss_gb()})


def markdown(res: dict) -> str:
    mem, counts = res["memory"], sorted(int(k) for k in res["memory"])
    lines = ["# The rollout engine's graphs whole or a layer at a time (generate_config.layerwise)", "",
             *stamp_lines(res, " (the sides of the 0.5B shape ran one after the other; the tiny timing "
                                      "alternates the sides in one process)"),
             f"## Memory: the issue-20 rollout at the Qwen2.5-0.5B shape", "",
             f"4 prompts ({list(PROMPT_LENGTHS)} random tokens) x G = {G}, {RESPONSE} forced new tokens, 16 slots, "
             "the engine on the policy model itself; each (layers, side) in its own process. +held: what the "
             "engine and its first call left resident; GB = 10^9 bytes.", "",
             "| layers | side | first call s | +held | peak | second call s | its decode s | graphs "
             "| tokens and log-probs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n in counts:
        for side in res["sides"]:
            r = mem[str(n)][side]
            f = r["first"]
            lines.append(f"| {n} | {side} | {f['seconds']:.1f} | {f['after_gb'] - f['before_gb']:+.2f} | "
                         f"{f['peak_gb']:.2f} | {r['second']['seconds']:.1f} | "
                         f"{r['second']['decode_s']:.1f} | {r['graphs']} | "
                         f"{'all identical' if mem[str(n)]['identical'] else 'below'} |")
    lines += ["", "Each pair of sides (tokens; log-probs under softmax(logits / T), then under the sampled "
              "distribution: how many of the values differ, the largest difference):", ""]
    for n in counts:
        for c in mem[str(n)]["compared"]:
            parts = [f"{c[k]['differ']} of {c[k]['values']} differ (max {c[k]['max_abs']:.1e})"
                     if c[k]["differ"] is not None else "other lengths" for k in ("logprobs", "sampling_logprobs")]
            lines.append(f"- {n} layers, {c['sides'][0]} / {c['sides'][1]}: "
                         f"{'the same tokens' if c['same_tokens'] else 'OTHER TOKENS'}; {parts[0]}; {parts[1]}")
    lines.append("")
    for side in res["fit"]:  # a fit needs two layer counts
        f = res["fit"][side]
        lines.append(f"- {side}: +held = {f['fixed_gb']:.3f} + {f['per_layer_gb']:.3f} GB per layer -> "
                     f"{f['at_24_gb']:.2f} GB at 24 layers")
    if not res["tiny"]:  # --tiny-rounds 0
        return "\n".join(lines) + "\n"
    lines += ["", "## Time: the tiny default's rollout", "",
              "32 prompts of 20-60 random tokens x G = 8, 40 forced tokens at temperature 0.7, 256 slots (vocabulary "
              "512, hidden 128); each model in its own process, both sides in it: each side's first (compiling) call, "
              "then alternating rounds of one call each.", "",
              "| model | side | first call s | median later call s | ratio | same tokens |", "|---|---|---|---|---|---|"]
    for model, t in res["tiny"].items():
        for side in res["sides"]:
            lines.append(f"| {model} | {side} | {t['first_s'][side]:.2f} | {t['median_s'][side]:.3f} | "
                         f"{t['median_s'][side] / t['median_s'][res['sides'][0]]:.2f}x | {t['same_tokens']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tiny-rounds", type=int, default=5, help="0: no tiny timing")
    ap.add_argument("--groups", type=int, nargs="+", default=[0, 1],
                    help="0: the whole graphs (first, the reference); k > 0: layerwise, k layers per decode graph")
    ap.add_argument("--output", default=os.path.join(RESULTS, "layerwise_generate.json"))
    args = ap.parse_args(argv)
    groups = [0] + [g for g in args.groups if g > 0]
    res = dict(run_stamp("benchmarks.layerwise_generate", argv), code=code_version())
    res["sides"] = [side_name(g) for g in groups]
    res["tiny"] = tiny_timing(args.tiny_rounds, groups) if args.tiny_rounds > 0 else {}
    print(f"tiny: {[t['median_s'] for t in res['tiny'].values()]}", flush=True)
    res["memory"] = measure_memory(args.layers, groups)
    res["fit"] = {side: fit(res["memory"], side) for side in res["sides"]} if len(set(args.layers)) > 1 else {}
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
