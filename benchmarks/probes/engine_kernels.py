"""Probe (not a benchmark): the rollout engine with our CPU kernels (the default: OpenBLAS's sgemm from 512 rows, so a
prefill's products) against the same engine with MindSpore's MatMul (MINDGRPO_CPU_KERNELS=0), whole generate calls
side by side in one process, at the Qwen2.5-0.5B shape (random weights, its 151,936-token vocabulary) cut to
--layers layers.

    python -m benchmarks.probes.engine_kernels [--layers 24] [--prompts 4] [--samples 4] [--prompt_len 140]
        [--tokens 128] [--rounds 3] [--whole] [--output engine_kernels.json]

The issue-20 rollout's work: --prompts prompts of --prompt_len random tokens, --samples samples each of exactly
--tokens new tokens (temperature 1, no stop token), so a decode step runs prompts x samples slots; layer graphs
(`generate_config.layerwise`, as the issue-20 step runs: two engines of whole-model graphs at 24 layers do not fit
in 23 GB), or whole-model graphs with --whole. Two engines on one model, one built with the switch on and one with
it off (the switch is read when an engine is built); each runs one untimed call (it compiles its graphs), then
--rounds rounds of a call on one engine, then on the other, in turns (a change of the machine's load falls on both
sides). Per side: the median seconds of a whole generate call (its
prefill, decode steps and sampling), new tokens per second, and the ratio. The same seed on both sides: the two
engines' tokens may part where fp32 rounding moves a sample (their sums run in another order), so the table also says
how many of the tokens agree. Then the fp32 matmul rates of both kernels in this process (squares of 1024 and 2048).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks.harness import code_version, run_stamp, stamp_lines, write_results

SIDES = ("ours", "mindspore")  # MINDGRPO_CPU_KERNELS 1 and 0


def markdown(res: dict) -> str:
    a = res["args"]
    lines = [f"# The rollout engine with our CPU kernels and with MindSpore's MatMul, Qwen2.5-0.5B shape, "
             f"{a['layers']} layers", "", *stamp_lines(res),
             f"Work: {a['prompts']} prompts of {a['prompt_len']} random tokens x {a['samples']} samples of "
             f"{a['tokens']} new tokens (temperature 1, no stop), {'whole-model' if a['whole'] else 'layer'} "
             "graphs, one process, the two engines in turns; "
             f"{a['rounds']} timed rounds after one untimed call each. Ours: {res['ours_kind']}.", "",
             "| side | median s a call | calls s | new tokens/s |", "|---|---|---|---|"]
    for side in SIDES:
        s = res["sides"][side]
        lines.append(f"| {side} | {s['median_s']:.2f} | {', '.join(f'{t:.2f}' for t in s['seconds'])} | "
                     f"{s['tokens_per_s']:.1f} |")
    lines += ["", f"**Ours {res['speedup']:.2f}x as fast as MindSpore's MatMul** (median call seconds, MindSpore's / "
              f"ours). Tokens equal on both sides: {res['same_tokens']:.3f} of them (fp32 rounding may part a sample).",
              "", "fp32 matmul GFLOP/s in this process after the rounds (squares of 1024 and 2048, the better): "
              + ", ".join(f"{side} {r['peak']:.0f}" for side, r in res["matmul_gflops"].items()) + "."]
    return "\n".join(lines) + "\n"


def add_rollout_args(ap, layers: int, tokens: int) -> None:
    """The options of the issue-20 rollout's work (`rollout_work`) and its graphs (--whole)."""
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt_len", type=int, default=140)
    ap.add_argument("--tokens", type=int, default=tokens)
    ap.add_argument("--whole", action="store_true", help="whole-model graphs instead of layer graphs")


def rollout_work(args):
    """The model and the rollout of args (layers, prompts, samples, prompt_len, tokens): the Qwen2.5-0.5B shape's
    model with random weights, the longest sequence, the prompts (random tokens) and the sampling parameters
    (temperature 1, exactly `tokens` new tokens a sample)."""
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.models.presets import preset_config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    cfg = preset_config("qwen2_5_0_5b", num_hidden_layers=args.layers)
    longest = args.prompt_len + args.tokens + 1
    lm = Qwen2ForCausalLM(cfg, seed=0, max_positions=longest)
    rng = np.random.default_rng(0)
    work = [rng.integers(1, cfg.vocab_size, args.prompt_len).tolist() for _ in range(args.prompts)]
    params = SamplingParams(max_tokens=args.tokens, temperature=1.0, n=args.samples, ignore_stop=True, seed=1)
    return cfg, lm, longest, work, params


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_args(ap, layers=24, tokens=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", default="engine_kernels.json")
    args = ap.parse_args(argv)
    import mindspore as ms

    from benchmarks.matmul_peak import square_rates
    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.kernels.matmul import ENV

    ms.set_context(mode=ms.GRAPH_MODE)
    res = dict(run_stamp("benchmarks.probes.engine_kernels", argv), code=code_version())
    res["args"] = vars(args)
    cfg, lm, longest, work, params = rollout_work(args)
    slots = args.prompts * args.samples
    engines = {}
    for side, switch in zip(SIDES, ("1", "0")):
        os.environ[ENV] = switch
        engines[side] = RolloutEngine(lm, max_num_seqs=slots, max_model_len=longest, layerwise=not args.whole)
    os.environ.pop(ENV)
    res["ours_kind"] = "rows_matmul: OpenBLAS from 512 rows, MindSpore's below"
    seconds = {side: [] for side in SIDES}
    tokens = {}
    for side, engine in engines.items():
        engine.generate(work, params)  # compiles
    for _ in range(args.rounds):
        for side, engine in engines.items():
            t0 = time.perf_counter()
            out = engine.generate(work, params)
            seconds[side].append(time.perf_counter() - t0)
            tokens[side] = np.array([c.token_ids for c in out])
            print(f"{side}: {seconds[side][-1]:.2f} s", flush=True)
    new = slots * args.tokens
    res["sides"] = {side: {"seconds": t, "median_s": float(np.median(t)), "tokens_per_s": new / float(np.median(t))}
                    for side, t in seconds.items()}
    res["speedup"] = res["sides"]["mindspore"]["median_s"] / res["sides"]["ours"]["median_s"]
    res["same_tokens"] = float(np.mean(tokens["ours"] == tokens["mindspore"]))
    res["matmul_gflops"] = square_rates()
    res["load_average_end"] = os.getloadavg()[0]
    text = markdown(res)
    write_results(args.output, res, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
