"""Probe (not a benchmark): what scoring a group's prompt once would save. One decoder layer of the Qwen2.5-0.5B
shape (random weights) through the layer graph the layerwise reference and update run (`models.qwen2.LayerGraph`),
on the same hidden states laid out two ways:

    python -m benchmarks.probes.shared_prefix [--prompt 140] [--completion 128] [--group 4] [--rounds 5]

- padded: G rows of prompt + completion (today's micro-batch of one group: every sample carries the prompt);
- shared: one row of the prompt then the G completions, each completion at the positions after the prompt
  (position ids restart), attending to the prompt and to itself only (an additive bias built here).

Prints each layout's median forward time over --rounds alternating calls, and the largest difference between the
completions' outputs of the two layouts (the same function of the same inputs: fp32 rounding) and of the prompt's.
The step it points at: GRPO's G samples of a prompt share its tokens, and in the issue-20 step (prompts of ~140
tokens, 128 new) the prompt is half of every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import numpy as np

NEG = -1e9


def layouts(prompt: np.ndarray, completions: np.ndarray):
    """prompt (P, H), completions (G, C, H) -> (padded x (G, P+C, H), positions, bias), (shared x (1, P+G*C, H),
    positions, bias); bias additive (rows, 1, S, S)."""
    (p, _), (g, c, _) = prompt.shape, completions.shape
    s = p + c
    padded = (np.concatenate([np.repeat(prompt[None], g, 0), completions], 1),
              np.tile(np.arange(s, dtype=np.int32), (g, 1)),
              np.triu(np.full((s, s), NEG, np.float32), 1)[None, None].repeat(g, 0))
    seg = np.concatenate([np.zeros(p, np.int64)] + [np.full(c, k + 1) for k in range(g)])  # 0: the prompt
    i, j = np.arange(seg.size)[:, None], np.arange(seg.size)[None]
    sees = (j <= i) & ((seg[j] == seg[i]) | (seg[j] == 0))
    shared = (np.concatenate([prompt, *completions], 0)[None],
              np.concatenate([np.arange(p)] + [np.arange(p, p + c)] * g).astype(np.int32)[None],
              np.where(sees, 0.0, NEG).astype(np.float32)[None, None])
    return padded, shared


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=140)
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    import mindspore as ms
    from mindspore import Tensor

    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.presets import resolve_model_config
    from mindgrpo.models.qwen2 import LayerGraph, Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    cfg = dataclasses.replace(Qwen2Config.load(resolve_model_config("qwen2_5_0_5b")), num_hidden_layers=1)
    lm = Qwen2ForCausalLM(cfg, max_positions=args.prompt + args.completion)
    layer = lm.model.layers[0]
    graph, w = LayerGraph(layer), ms.mutable(tuple(layer.weights()))
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((args.prompt, cfg.hidden_size)).astype(np.float32)
    completions = rng.standard_normal((args.group, args.completion, cfg.hidden_size)).astype(np.float32)
    sides = {}
    for name, (x, pos, bias) in zip(("padded", "shared"), layouts(prompt, completions)):
        cos, sin = lm.rope(Tensor(pos))
        sides[name] = (Tensor(x), cos, sin, Tensor(bias))
    out = {name: graph(*a, w).asnumpy() for name, a in sides.items()}  # compiles both
    times = {name: [] for name in sides}
    print(f"load average at the start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for _ in range(args.rounds):
        for name, a in sides.items():
            t = time.perf_counter()
            graph(*a, w).asnumpy()
            times[name].append(time.perf_counter() - t)
    p, c = args.prompt, args.completion
    padded, shared = out["padded"], out["shared"][0]
    diff = max(np.abs(padded[k, p:] - shared[p + k * c:p + (k + 1) * c]).max() for k in range(args.group))
    for name, x in sides.items():
        print(f"{name}: {tuple(x[0].shape)[:2]} rows x positions, median {np.median(times[name]) * 1e3:.1f} ms")
    print(f"shared / padded: {np.median(times['shared']) / np.median(times['padded']):.2f}; largest difference of "
          f"the completions' outputs {diff:.2e}, of the prompt's {np.abs(padded[0, :p] - shared[:p]).max():.2e}")
    print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
