"""Probe (not a benchmark): the process's resident memory over RewardScorer calls whose longest sequence changes
from call to call, at Qwen2.5-0.5B's shape cut to --layers layers, random weights.

    python -m benchmarks.probes.reward_model_memory [--layers 2] [--rows 4] [--max_tokens 0]
        [--lengths 1024,992,960,...] [--repeat 1]

Each call scores --rows sequences of the call's length (random ids); after each call the resident set (VmRSS), the
call's wall and CPU seconds (the process's, all threads: on a shared machine steadier than the wall time) and the
scorer's compiled graphs are printed. --max_tokens > 0: packed rows within that budget.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1e6
    return float("nan")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--max_tokens", type=int, default=0)
    ap.add_argument("--lengths", default=",".join(str(1024 - 32 * k) for k in range(8)))
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args(argv)
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.reward_model import RewardModel, RewardScorer

    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=args.layers,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096)
    rm = RewardModel(cfg, seed=0)
    scorer = RewardScorer(rm, micro_batch_size=args.rows, max_tokens=args.max_tokens)
    print(f"model built: {rss_gb():.2f} GB", flush=True)
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in args.lengths.split(",")] * args.repeat
    for n in lengths:
        seqs = [rng.integers(10, 151936, n).tolist() for _ in range(args.rows)]
        t0, c0 = time.perf_counter(), time.process_time()
        scores = scorer(seqs)
        graphs = getattr(scorer, "compiled_graphs", "?")
        print(f"length {n}: {rss_gb():.2f} GB, {time.perf_counter() - t0:.1f} s (CPU {time.process_time() - c0:.1f} s), "
              f"graphs {graphs}, "
              f"scores {np.round(scores[:2], 4)}", flush=True)


if __name__ == "__main__":
    main()
