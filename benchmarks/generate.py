"""Decode throughput: our inference graph against transformers `generate`, identical weights and
sampling settings, side by side in one run.

    .venv/bin/python benchmarks/generate.py [--configs tiny-qwen-vocab tiny-small-vocab] \
        [--batch 16] [--new_tokens 64 128] [--repeats 3] [--output benchmarks/results/generate.json]

Both sides sample with temperature 1, top_k=0, top_p=1 (transformers' default top_k=50 would cost
it a sort per step) and generate exactly N new tokens (no early stop). Timing covers prefill and
decode, median of --repeats runs after one warm-up run (our warm-up includes graph compilation,
reported separately). Also prints our per-layer decode cost, from timing the same decode with
the layer count varied.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CONFIGS, hf_model, machine, ours_from_hf, timed  # noqa: E402


def run_hf(model, prompts, new_tokens):
    import torch

    ids = torch.tensor(prompts, dtype=torch.long)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    assert out.shape[1] == ids.shape[1] + new_tokens
    return out


def run_ours(engine, prompts, new_tokens):
    from mindgrpo.inference.sampling import SamplingParams

    out = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, temperature=1.0, ignore_stop=True))
    assert all(len(c.token_ids) == new_tokens for c in out)
    return out


def per_layer_cost(name: str, batch: int, new_tokens: int, repeats: int) -> dict:
    """ms per decode step with 2 and with 4 layers: the difference / 2 is one layer's cost."""
    from mindgrpo.inference.engine import RolloutEngine

    steps = {}
    for layers in (2, 4):
        base = dict(CONFIGS[name], num_hidden_layers=layers)
        hf = hf_model(name, overrides=base)
        engine = RolloutEngine(ours_from_hf(hf))
        prompts = [list(range(10, 42))] * batch
        run_ours(engine, prompts, new_tokens)
        secs, _ = timed(lambda: run_ours(engine, prompts, new_tokens), repeats)
        steps[layers] = 1000 * secs / new_tokens
    return {"ms_per_step_2_layers": steps[2], "ms_per_step_4_layers": steps[4],
            "ms_per_layer": (steps[4] - steps[2]) / 2, "ms_outside_layers": steps[2] - (steps[4] - steps[2])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt_len", type=int, default=32)
    ap.add_argument("--new_tokens", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                     "generate.json"))
    args = ap.parse_args(argv)

    import mindspore as ms
    import torch

    from mindgrpo.inference.engine import RolloutEngine

    ms.set_context(mode=ms.GRAPH_MODE)
    torch.manual_seed(0)
    results = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "batch": args.batch,
               "torch_threads": torch.get_num_threads(), "configs": {}}
    rows = []
    for name in args.configs:
        hf = hf_model(name)
        engine = RolloutEngine(ours_from_hf(hf))
        rng = np.random.default_rng(0)
        prompts = rng.integers(1, CONFIGS[name]["vocab_size"], (args.batch, args.prompt_len)).tolist()
        per = {}
        for n in args.new_tokens:
            t0 = time.perf_counter()
            run_ours(engine, prompts, n)  # compiles the bucket
            compile_s = time.perf_counter() - t0
            ours_s, _ = timed(lambda: run_ours(engine, prompts, n), args.repeats)
            run_hf(hf, prompts, n)
            hf_s, _ = timed(lambda: run_hf(hf, prompts, n), args.repeats)
            tokens = args.batch * n
            per[n] = {"mindgrpo_tokens_per_s": tokens / ours_s, "transformers_tokens_per_s": tokens / hf_s,
                      "ratio": hf_s / ours_s, "mindgrpo_ms_per_step": 1000 * ours_s / n,
                      "transformers_ms_per_step": 1000 * hf_s / n, "mindgrpo_first_call_s": compile_s}
            rows.append((name, n, per[n]))
            print(f"{name:18s} {n:4d} new tokens: mindgrpo {per[n]['mindgrpo_tokens_per_s']:8.1f} tok/s, "
                  f"transformers {per[n]['transformers_tokens_per_s']:8.1f} tok/s, ratio {per[n]['ratio']:.2f}x",
                  flush=True)
        per["layers"] = per_layer_cost(name, args.batch, args.new_tokens[0], args.repeats)
        print(f"{name:18s} decode cost: {per['layers']['ms_per_layer']:.2f} ms per layer, "
              f"{per['layers']['ms_outside_layers']:.2f} ms outside the layers (embedding, head, sampling)")
        results["configs"][name] = per

    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=2)
    print("\n| config | new tokens | mindgrpo tok/s | transformers tok/s | ratio |\n|---|---|---|---|---|")
    for name, n, r in rows:
        print(f"| {name} | {n} | {r['mindgrpo_tokens_per_s']:.0f} | {r['transformers_tokens_per_s']:.0f} | "
              f"{r['ratio']:.2f}x |")
    print(f"\nwritten {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
