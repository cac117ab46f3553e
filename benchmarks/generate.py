"""Decode throughput: our inference graph against transformers `generate`, identical weights and
sampling settings, side by side in one run.

    python -m benchmarks.generate [--configs tiny-qwen-vocab tiny-small-vocab] \
        [--batch 16] [--new_tokens 64 128] [--repeats 5] [--output benchmarks/results/generate.json]

Both sides sample with temperature 1, top_k=0, top_p=1 (transformers' default top_k=50 would cost
it a sort per step) and generate exactly N new tokens (no early stop). Timing covers everything a
call does: prefill and decode, and on our side also remaking the fused weight copies. After one
warm-up run per side (ours includes graph compilation, reported separately) the two sides
alternate run by run, so that load from other jobs on the machine falls on both; the figures are
the medians of --repeats runs each.

Also prints the decode graph's parts timed alone on the same bucket (the whole step, the layers, the
final norm + head, the head + sampler) and our per-layer decode cost: decode steps only (from the first token on), timed with 1
and with 4 layers (the two alternating), (t4 - t1) / 3 per layer and t1 - that outside the layers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.harness import RESULTS, alternate, run_stamp, write_results
from benchmarks.tiny_models import CONFIGS, hf_model, ours_from_hf


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
    """Decode ms per step (first token excluded) with 1 and 4 layers, alternating."""
    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    prompts = [list(range(10, 42))] * batch
    engines = {n: RolloutEngine(Qwen2ForCausalLM(Qwen2Config(**dict(CONFIGS[name], num_hidden_layers=n),
                                                             max_position_embeddings=4096)), max_num_seqs=batch)
               for n in (1, 4)}
    decode_ms = {n: [] for n in engines}

    def run(n):
        e = engines[n]
        run_ours(e, prompts, new_tokens)
        s = e.last_stats
        decode_ms[n].append(1000 * s["decode_seconds"] / s["decode_steps"])

    for n in engines:
        run(n)  # compiles
        decode_ms[n].clear()
    alternate({n: (lambda n=n: run(n)) for n in engines}, repeats)
    t1, t4 = (float(np.median(decode_ms[n])) for n in (1, 4))
    per_layer = (t4 - t1) / 3
    return {"decode_ms_per_step_1_layer": t1, "decode_ms_per_step_4_layers": t4, "ms_per_layer": per_layer,
            "ms_outside_layers": t1 - per_layer}


def decode_parts(name: str, batch: int, repeats: int, steps: int = 30) -> dict:
    """ms per call of the decode graph and of its parts on the same bucket (no host loop):
    the whole step, the layers alone, the final norm + head alone, the head + the sampler."""
    import mindspore as ms
    from mindspore import Tensor

    from mindgrpo.inference.graphs import DecodeGraph
    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    class LayersOnly(DecodeGraph):
        def construct(self, token, position, slot, u, temperature):
            x = self.hidden(token, position, slot)
            return x.sum(-1).reshape(-1, 1), x

    class HeadOnly(DecodeGraph):
        def construct(self, token, position, slot, u, temperature):
            logits = self.model.logits(self.model.embed(token))
            return logits[:, 0:1], logits

    class HeadAndSampler(DecodeGraph):
        def construct(self, token, position, slot, u, temperature):
            logits = self.model.logits(self.model.embed(token))
            return self.sampler(logits, u, temperature)[0].reshape(-1, 1).astype(ms.float32), logits

    lm = Qwen2ForCausalLM(Qwen2Config(**CONFIGS[name], max_position_embeddings=4096))
    engine = RolloutEngine(lm, max_num_seqs=batch)
    run_ours(engine, [list(range(10, 42))] * batch, 128)  # allocates the cache, builds the graphs
    whole = next(g for k, g in engine._graphs.items() if k[0] == "decode" and k[1] == batch)
    graphs = {"whole step": whole}
    for key, cls in (("layers only", LayersOnly), ("norm + head only", HeadOnly),
                     ("norm + head + sampler", HeadAndSampler)):
        graphs[key] = cls(engine.model, engine.cache, whole.sampler, whole.length)
    b = batch
    args = (Tensor(np.arange(b, dtype=np.int32)), Tensor(np.full(b, 40, np.int32)),
            Tensor(np.arange(b, dtype=np.int32)), Tensor(np.full(b, 0.5, np.float32)),
            Tensor(np.ones(b, np.float32)))
    for g in graphs.values():
        g(*args)[0].asnumpy()  # compiles

    def one(g):
        for _ in range(steps):
            g(*args)[0].asnumpy()

    times = alternate({k: (lambda g=g: one(g)) for k, g in graphs.items()}, repeats)
    return {k: 1000 * float(np.median(v)) / steps for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt_len", type=int, default=32)
    ap.add_argument("--new_tokens", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--output", default=os.path.join(RESULTS, "generate.json"))
    args = ap.parse_args(argv)

    import mindspore as ms
    import torch

    from mindgrpo.inference.engine import RolloutEngine

    ms.set_context(mode=ms.GRAPH_MODE)
    torch.manual_seed(0)
    results = dict(run_stamp("benchmarks.generate", argv), batch=args.batch, prompt_len=args.prompt_len,
                   repeats=args.repeats, torch_threads=torch.get_num_threads(), load_average_start=os.getloadavg()[0],
                   configs={})
    rows = []
    for name in args.configs:
        hf = hf_model(name)
        engine = RolloutEngine(ours_from_hf(hf), max_num_seqs=args.batch)
        rng = np.random.default_rng(0)
        prompts = rng.integers(1, CONFIGS[name]["vocab_size"], (args.batch, args.prompt_len)).tolist()
        per = {}
        for n in args.new_tokens:
            t0 = time.perf_counter()
            run_ours(engine, prompts, n)  # compiles the bucket
            compile_s = time.perf_counter() - t0
            run_hf(hf, prompts, n)
            times = alternate({"ours": lambda: run_ours(engine, prompts, n), "hf": lambda: run_hf(hf, prompts, n)},
                              args.repeats)
            ours_s, hf_s = float(np.median(times["ours"])), float(np.median(times["hf"]))
            tokens = args.batch * n
            per[n] = {"mindgrpo_tokens_per_s": tokens / ours_s, "transformers_tokens_per_s": tokens / hf_s,
                      "ratio": hf_s / ours_s, "mindgrpo_ms_per_step": 1000 * ours_s / n,
                      "transformers_ms_per_step": 1000 * hf_s / n, "mindgrpo_first_call_s": compile_s,
                      "mindgrpo_runs_s": times["ours"], "transformers_runs_s": times["hf"]}
            rows.append((name, n, per[n]))
            print(f"{name:18s} {n:4d} new tokens: mindgrpo {per[n]['mindgrpo_tokens_per_s']:8.1f} tok/s, "
                  f"transformers {per[n]['transformers_tokens_per_s']:8.1f} tok/s, ratio {per[n]['ratio']:.2f}x",
                  flush=True)
        per["layers"] = per_layer_cost(name, args.batch, args.new_tokens[0], args.repeats)
        print(f"{name:18s} decode cost: {per['layers']['ms_per_layer']:.2f} ms per layer, "
              f"{per['layers']['ms_outside_layers']:.2f} ms outside the layers (embedding, head, sampling, host)",
              flush=True)
        per["parts_ms"] = decode_parts(name, args.batch, args.repeats)
        print(f"{name:18s} decode graph parts (ms per call): "
              + ", ".join(f"{k} {v:.2f}" for k, v in per["parts_ms"].items()), flush=True)
        results["configs"][name] = per
    results["load_average_end"] = os.getloadavg()[0]

    write_results(args.output, results)
    print("\n| config | new tokens | mindgrpo tok/s | transformers tok/s | ratio | mindgrpo ms/step | "
          "transformers ms/step |\n|---|---|---|---|---|---|---|")
    for name, n, r in rows:
        print(f"| {name} | {n} | {r['mindgrpo_tokens_per_s']:.0f} | {r['transformers_tokens_per_s']:.0f} | "
              f"{r['ratio']:.2f}x | {r['mindgrpo_ms_per_step']:.1f} | {r['transformers_ms_per_step']:.1f} |")
    print("\n| config | decode ms/step, 1 layer | 4 layers | ms per layer | ms outside the layers |\n|---|---|---|---|---|")
    for name in args.configs:
        c = results["configs"][name]["layers"]
        print(f"| {name} | {c['decode_ms_per_step_1_layer']:.2f} | {c['decode_ms_per_step_4_layers']:.2f} | "
              f"{c['ms_per_layer']:.2f} | {c['ms_outside_layers']:.2f} |")
    parts = list(results["configs"][args.configs[0]]["parts_ms"])
    print("\nDecode graph parts, ms per call (same bucket, no host loop):\n\n| config | " + " | ".join(parts)
          + " |\n" + "|---" * (len(parts) + 1) + "|")
    for name in args.configs:
        c = results["configs"][name]["parts_ms"]
        print(f"| {name} | " + " | ".join(f"{c[k]:.2f}" for k in parts) + " |")
    print(f"\nload average {results['load_average_start']:.1f} -> {results['load_average_end']:.1f}; "
          f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
