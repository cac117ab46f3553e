"""Probe (not a benchmark): the rollout engine's prefill with our CPU matmul (mindgrpo.kernels) against MindSpore's
MatMul (MINDGRPO_CPU_KERNELS=0), side by side in one process, at the Qwen2.5-0.5B shape cut to --layers layers
(random weights, its 151,936-token vocabulary).

    python -m benchmarks.probes.engine_prefill_kernels [--layers 2] [--shapes 4x128 4x256 16x256 4x1024]
        [--rounds 5]

Two engines on one model, one built with the switch on and one with it off (the switch is read when an engine is
built). A shape PxL is P prompts of L + 1 random tokens: one prefill graph call of P x L rows (the last token is
decode's input). Each shape: one untimed greedy call of one token per engine (it compiles the prefill graph), then
--rounds rounds, each a call of the same prompts on one engine, then on the other (the machine's load falls on both
sides); each prefill graph call timed in wall seconds and in the process's CPU seconds (every thread's, MindSpore's
and ours). Prints the medians per shape and the load average at the start and at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def shape(text: str):
    prompts, length = text.lower().split("x")
    return int(prompts), int(length)


def timed_prefill(engine, log: list) -> None:
    """Wraps the engine's prefill graph call: each call's (wall, CPU) seconds appended to log."""
    prefill = engine._prefill

    def run(*args):
        w, c = time.perf_counter(), time.process_time()
        prefill(*args)
        log.append((time.perf_counter() - w, time.process_time() - c))
    engine._prefill = run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--shapes", type=shape, nargs="+", default=[(4, 128), (4, 256), (16, 256), (4, 1024)],
                    help="prompts x prefill length (each prompt one token longer)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.kernels.matmul import ENV
    from mindgrpo.models.presets import preset_config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    load_start = os.getloadavg()
    cfg = preset_config("qwen2_5_0_5b", num_hidden_layers=args.layers)
    longest = max(length for _, length in args.shapes) + 1
    lm = Qwen2ForCausalLM(cfg, seed=0, max_positions=longest + 1)
    rng = np.random.default_rng(0)
    sides, logs = {}, {}
    for name, switch in (("ours", "1"), ("mindspore", "0")):
        os.environ[ENV] = switch
        sides[name] = RolloutEngine(lm, max_num_seqs=max(p for p, _ in args.shapes), max_model_len=longest + 1,
                                    max_prefill_tokens=None)
        logs[name] = []
        timed_prefill(sides[name], logs[name])
    params = SamplingParams(max_tokens=1, temperature=0.0)
    print(f"Qwen2.5-0.5B shape, {args.layers} layers, {os.cpu_count()} CPUs, load average {load_start[0]:.2f} at the "
          f"start; medians of {args.rounds} rounds, seconds per prefill graph call (wall / process CPU)\n")
    print("| prompts x length | rows | MindSpore wall | ours wall | MindSpore / ours wall | MindSpore CPU | ours CPU "
          "| MindSpore / ours CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for prompts, length in args.shapes:
        work = [rng.integers(1, cfg.vocab_size, length + 1).tolist() for _ in range(prompts)]
        for name, engine in sides.items():  # compiles this shape's prefill graph
            engine.generate(work, params)
            logs[name].clear()
        for _ in range(args.rounds):
            for engine in sides.values():
                engine.generate(work, params)
        med = {name: np.median(np.array(log), axis=0) for name, log in logs.items()}
        (mw, mc), (ow, oc) = med["mindspore"], med["ours"]
        print(f"| {prompts} x {length} | {prompts * length} | {mw:.3f} | {ow:.3f} | {mw / ow:.2f} | {mc:.3f} | "
              f"{oc:.3f} | {mc / oc:.2f} |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
