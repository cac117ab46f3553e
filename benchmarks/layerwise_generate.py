"""The rollout engine's graphs whole or one decoder layer at a time (generate_config.layerwise): what the
first generate call keeps resident at the Qwen2.5-0.5B shape, and what the layer graphs cost in time.

    python -m benchmarks.layerwise_generate [--layers 2 4] [--tiny-rounds 5]

memory   The 0.5B shape (hidden 896, intermediate 4864, 14 / 2 heads, tied, vocabulary 151,936) at each
         --layers, the issue-20 rollout: 4 prompts of 157, 118, 149 and 127 random tokens x G = 4, 128
         forced new tokens, 16 slots of 285 positions, generating with the policy model itself. Each
         (layers, side) in its own process, one after the other: the model, then the engine built and its
         first call (prefill, copy and decode graphs compiled, the fused copies refreshed), then a second
         call. Resident memory after each and its peak (VmHWM) in GB = 10^9 bytes; fixed + per layer from
         the two layer counts, extrapolated to 24. The sides' tokens and log-probs must be equal bit for bit.
tiny     The tiny default's rollout (32 prompts of 20 to 60 random tokens x G = 8, 40 forced tokens at
         temperature 0.7, 256 slots) on tiny_qwen2 (4 layers, hidden 128, vocabulary 512) and on its 2-layer
         cut with an MLP of 256 (the tiny default's model on main since 5374cc1), each in its own process:
         each side's first call (compiles), then --tiny-rounds rounds of one call per side, alternating.

MindSpore 2.10's CPU runtime keeps the buffers of every compiled graph after it ran: the whole-model
prefill and decode graphs and the fused-weight refresh keep every layer's intermediates; the layer graphs
(`mindgrpo/inference/graphs.py`: PrefillLayer, DecodeLayer, run for every layer) keep one layer's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.harness import RESULTS, code_version, median, rss_gb, run_stamp, write_results
from benchmarks.update_sides import G, PROMPT_LENGTHS, RESPONSE, measured, step_workload
from benchmarks.workers import Workers

SIDES = ("whole", "layerwise")
FULL_LAYERS = 24


def memory_side(conn, layers: int, layerwise: bool) -> None:
    """A `benchmarks.workers` side: the model, the engine's first and second call; their figures, then the
    samples' tokens and log-probs."""
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg, positions, prompts, params, _ = step_workload(layers, 151936)
    lm, model = measured(lambda: Qwen2ForCausalLM(cfg, seed=0, max_positions=positions))
    engine = RolloutEngine(lm, max_num_seqs=len(prompts) * G, max_model_len=max(PROMPT_LENGTHS) + RESPONSE,
                           layerwise=layerwise)
    out, first = measured(lambda: engine.generate(prompts, params))
    first["before_gb"] = model["after_gb"]  # the engine's construction counts with its first call
    _, second = measured(lambda: engine.generate(prompts, params))
    conn.send({"model": model, "first": first, "second": second, "graphs": engine.compiled_graphs,
               "tokens": [c.token_ids for c in out], "logprobs": [c.logprobs.tolist() for c in out],
               "sampling_logprobs": [c.sampling_logprobs.tolist() for c in out]})


def measure_memory(layer_counts) -> dict:
    res = {}
    for layers in layer_counts:
        res[str(layers)] = {}
        for name in SIDES:  # one process at a time
            with Workers() as workers:
                r = workers.start(memory_side, layers, name == "layerwise").recv()
            res[str(layers)][name] = r
            print(f"layers {layers} {name}: first call {r['first']['seconds']:.1f} s, +"
                  f"{r['first']['after_gb'] - r['first']['before_gb']:.2f} GB held, peak {r['first']['peak_gb']:.2f}"
                  f"; second {r['second']['seconds']:.1f} s", flush=True)
        w, lw = res[str(layers)]["whole"], res[str(layers)]["layerwise"]
        res[str(layers)]["identical"] = all(w[k] == lw[k] for k in ("tokens", "logprobs", "sampling_logprobs"))
        for side in SIDES:
            for k in ("tokens", "logprobs", "sampling_logprobs"):
                del res[str(layers)][side][k]
    return res


def fit(res: dict, side: str) -> dict:
    counts = sorted(int(k) for k in res)
    lo, hi = (res[str(counts[0])][side]["first"], res[str(counts[-1])][side]["first"])
    adds = [r["after_gb"] - r["before_gb"] for r in (lo, hi)]
    slope = (adds[1] - adds[0]) / (counts[-1] - counts[0])
    fixed = adds[0] - slope * counts[0]
    return {"fixed_gb": fixed, "per_layer_gb": slope, "at_24_gb": fixed + slope * FULL_LAYERS}


# tiny_qwen2, and the 2-layer model with an MLP of 256 that the tiny default trains on main since 5374cc1
TINY_MODELS = {"tiny_qwen2 (4 layers)": {}, "2 layers, MLP 256": {"num_hidden_layers": 2, "intermediate_size": 256}}


def tiny_timing(rounds: int) -> dict:
    """Both sides on the tiny default's rollout, per tiny model, each model in its own process."""
    out = {}
    for name, overrides in TINY_MODELS.items():
        with Workers() as workers:
            out[name] = workers.start(_tiny_side, rounds, overrides).recv()
    return out


def _tiny_side(conn, rounds: int, overrides: dict) -> None:
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.models.presets import preset_config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    lm = Qwen2ForCausalLM(preset_config("tiny_qwen2", **overrides), seed=0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 512, int(n)).tolist() for n in rng.integers(20, 61, 32)]
    params = SamplingParams(max_tokens=40, temperature=0.7, n=8, seed=1, ignore_stop=True)
    engines = {name: RolloutEngine(lm, max_num_seqs=256, max_model_len=128 + 40, layerwise=name == "layerwise")
               for name in SIDES}
    first, times, outs = {}, {name: [] for name in SIDES}, {}
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
               "same_tokens": outs["whole"] == outs["layerwise"], "rss_gb": rss_gb()})


def markdown(res: dict) -> str:
    mem, counts = res["memory"], sorted(int(k) for k in res["memory"])
    lines = ["# The rollout engine's graphs whole or a layer at a time (generate_config.layerwise)", "",
             f"Date {res['date']}; machine: {res['machine']} (machine C: AVX-512); load average "
             f"{res['load_average']} at the start, {res['load_average_end']:.1f} at the end (other jobs shared the "
             "machine: seconds are rough, the tiny timing's ratio alternates the sides in one process).", "",
             f"Command (from the repo root): `{res['command']}`; library code: {res['code']}.", "",
             f"## Memory: the issue-20 rollout at the Qwen2.5-0.5B shape", "",
             f"4 prompts ({list(PROMPT_LENGTHS)} random tokens) x G = {G}, {RESPONSE} forced new tokens, 16 slots, "
             "the engine on the policy model itself; each (layers, side) in its own process. +held: what the "
             "engine and its first call left resident; GB = 10^9 bytes.", "",
             "| layers | side | first call s | +held | peak | second call s | graphs | tokens and log-probs |",
             "|---|---|---|---|---|---|---|---|"]
    for n in counts:
        for side in SIDES:
            r = mem[str(n)][side]
            f = r["first"]
            lines.append(f"| {n} | {side} | {f['seconds']:.1f} | {f['after_gb'] - f['before_gb']:+.2f} | "
                         f"{f['peak_gb']:.2f} | {r['second']['seconds']:.1f} | {r['graphs']} | "
                         f"{'identical' if mem[str(n)]['identical'] else 'DIFFER'} |")
    lines.append("")
    for side in SIDES:
        f = res["fit"][side]
        lines.append(f"- {side}: +held = {f['fixed_gb']:.3f} + {f['per_layer_gb']:.3f} GB per layer -> "
                     f"{f['at_24_gb']:.2f} GB at 24 layers")
    lines += ["", "## Time: the tiny default's rollout", "",
              "32 prompts of 20-60 random tokens x G = 8, 40 forced tokens at temperature 0.7, 256 slots (vocabulary "
              "512, hidden 128); each model in its own process, both sides in it: each side's first (compiling) call, "
              "then alternating rounds of one call each.", "",
              "| model | side | first call s | median later call s | ratio | same tokens |", "|---|---|---|---|---|---|"]
    for model, t in res["tiny"].items():
        for side in SIDES:
            lines.append(f"| {model} | {side} | {t['first_s'][side]:.2f} | {t['median_s'][side]:.3f} | "
                         f"{t['median_s'][side] / t['median_s']['whole']:.2f}x | {t['same_tokens']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tiny-rounds", type=int, default=5)
    ap.add_argument("--output", default=os.path.join(RESULTS, "layerwise_generate.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.layerwise_generate", argv), code=code_version())
    res["tiny"] = tiny_timing(args.tiny_rounds)
    print(f"tiny: {[t['median_s'] for t in res['tiny'].values()]}", flush=True)
    res["memory"] = measure_memory(args.layers)
    res["fit"] = {side: fit(res["memory"], side) for side in SIDES}
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
