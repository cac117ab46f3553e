"""Rollout throughput on a long-tailed workload: the slot-scheduled engine against the static engine
it replaced and transformers' `generate`, identical weights and sampling, in one invocation.

    python -m benchmarks.rollout [--configs tiny-qwen-vocab tiny-small-vocab] [--prompts 64] [--group 8]
        [--max_tokens 512] [--slots 64] [--repeats 1] [--sides engine static transformers]
        [--output benchmarks/results/rollout.json]
    python -m benchmarks.rollout --workloads multiturn [--max_turns 4] [--latency_ms 50] ...
        (conversations with tool calls, in the cache against re-prefilling: benchmarks/multiturn.py;
        default output benchmarks/results/rollout_multiturn.json)

Workloads (64 prompts x G = 8 by default, prompts of 20 to 60 random tokens, temperature 1, no
top-k / top-p / min-p, at most 512 new tokens):
  longtail  a random model (transformers' initialisation: near-uniform next-token distributions)
            with V / 150 stop ids, so a sample stops at each token with probability about 1/150:
            geometric lengths of mean about 0.3 x 512, cut at 512 (the measured mean is reported)
  forced    the control: every sample runs exactly 512 tokens (stops ignored)
Every side holds 64 sequences' KV cache at once: the engine has 64 slots (max_num_seqs) of
prompt + 512 positions; the static engine and transformers run the 512 samples as 8 batches of
8 prompts x 8 (a static batch decodes until its longest sample stops; transformers keeps
computing finished rows as padding).

Each side runs in its own process (so its peak RSS is its own), loaded with the same weights
(transformers' random model saved once, converted for ours). Each warms up untimed (the engine
with a whole run, which compiles every shape it uses; the static engine with its first batch,
which compiles the one bucket all batches use; transformers with two tokens), then the sides take
turns for --repeats timed runs; the figures are medians. Useful tokens/s = generated tokens (stop ids included) / wall seconds of a
whole run (prefill, decode, host loop). Useful fraction = generated tokens / rows computed,
summed over the decode steps (for the static engine: over its steps x its 64 rows).

Writes --output (json) and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks.harness import RESULTS, median, run_stamp, write_results
from benchmarks.tiny_models import ALL_CONFIGS, CONFIGS, hf_model
from benchmarks.workers import Workers

SIDES = ("engine", "static", "transformers")
GOALS = {"longtail": {"static": 2.5, "transformers": 2.0, "fraction": 0.9}, "forced": {"static": 0.9}}


def workload(vocab: int, kind: str, prompts: int, group: int, max_tokens: int, seed: int = 0):
    """(prompts as token lists, SamplingParams) of a workload; the same in every process."""
    from mindgrpo.inference.sampling import SamplingParams

    rng = np.random.default_rng(seed)
    stops = rng.choice(np.arange(1, vocab), vocab // 150, replace=False)
    allowed = np.setdiff1d(np.arange(1, vocab), stops)
    ids = [rng.choice(allowed, int(n)).tolist() for n in rng.integers(20, 61, prompts)]
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, n=group, seed=seed + 1,
                            stop_token_ids=tuple(int(s) for s in stops), ignore_stop=kind == "forced")
    return ids, params


# ------------------------------------------------------------------ the sides (one per process)

class EngineSide:
    def __init__(self, weights: str, slots: int, prompts, params):
        from mindgrpo.inference.engine import RolloutEngine
        from mindgrpo.models.checkpoint import load_model

        capacity = max(len(p) for p in prompts) + params.max_tokens
        self.engine = RolloutEngine(load_model(weights), max_num_seqs=slots, max_num_batched_tokens=slots * capacity,
                                    max_model_len=capacity)
        self.prompts, self.params = prompts, params

    def warm_up(self) -> dict:
        """A whole run: it compiles every graph shape the timed runs use."""
        return self.run()

    def run(self) -> dict:
        out = self.engine.generate(self.prompts, self.params)
        s = self.engine.last_stats
        return {"tokens": sum(len(c.token_ids) for c in out), "useful_fraction": s["useful_fraction"],
                "decode_steps": s["decode_steps"], "prefill_seconds": s["prefill_seconds"],
                "compiled_graphs": s["compiled_graphs"], "kv_bytes": s["kv_bytes"]}


class StaticSide:
    def __init__(self, weights: str, slots: int, prompts, params):
        from benchmarks.static_engine import StaticEngine
        from mindgrpo.models.checkpoint import load_model

        self.engine = StaticEngine(load_model(weights))
        self.chunk = max(1, slots // params.n)  # prompts per static batch: slots rows
        self.prompts, self.params = prompts, params

    def warm_up(self) -> dict:
        """The first batch: it compiles the one bucket every batch uses (8 prompts of 20 to 60 tokens:
        the longest is over 32, so all pad to 64)."""
        return self.run(self.prompts[:self.chunk])

    def run(self, prompts=None) -> dict:
        prompts = self.prompts if prompts is None else prompts
        tokens = rows = steps = 0
        for i in range(0, len(prompts), self.chunk):
            out = self.engine.generate(prompts[i:i + self.chunk], self.params)
            s = self.engine.last_stats
            tokens += sum(len(c.token_ids) for c in out)
            rows += s["new_tokens"] / s["useful_fraction"]
            steps += s["decode_steps"]
        return {"tokens": tokens, "useful_fraction": tokens / rows, "decode_steps": steps}


class TransformersSide:
    def __init__(self, weights: str, slots: int, prompts, params):
        import torch
        from transformers import Qwen2ForCausalLM

        torch.manual_seed(params.seed)
        self.torch = torch
        self.model = Qwen2ForCausalLM.from_pretrained(weights, torch_dtype=torch.float32).eval()
        self.chunk = max(1, slots // params.n)
        self.prompts, self.params = prompts, params

    def warm_up(self) -> dict:
        """Two tokens of the first batch (nothing to compile)."""
        return self.run(self.prompts[:self.chunk], max_tokens=2)

    def run(self, prompts=None, max_tokens=None) -> dict:
        torch, p = self.torch, self.params
        prompts = self.prompts if prompts is None else prompts
        new_tokens = max_tokens or p.max_tokens
        stops = np.array(p.stop_token_ids)
        tokens = rows = steps = 0
        for i in range(0, len(prompts), self.chunk):
            batch = prompts[i:i + self.chunk]
            width = max(len(q) for q in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for j, q in enumerate(batch):  # left padding
                ids[j, width - len(q):] = torch.tensor(q)
                mask[j, width - len(q):] = 1
            kw = dict(min_new_tokens=new_tokens) if p.ignore_stop else dict(eos_token_id=stops.tolist())
            with torch.no_grad():
                out = self.model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                          top_p=1.0, max_new_tokens=new_tokens, num_return_sequences=p.n,
                                          pad_token_id=0, **kw)
            new = out[:, width:].numpy()  # (rows, steps): a finished row is padded to the longest
            if p.ignore_stop:
                tokens += new.size
            else:  # up to and with the first stop id (transformers pads after it)
                hit = np.isin(new, stops)
                tokens += int(np.where(hit.any(1), hit.argmax(1) + 1, new.shape[1]).sum())
            rows += new.shape[0] * new.shape[1]
            steps += new.shape[1]
        return {"tokens": tokens, "useful_fraction": tokens / rows, "decode_steps": steps}


SIDE_CLASSES = {"engine": EngineSide, "static": StaticSide, "transformers": TransformersSide}


def side_worker(conn, side: str, config: str, kind: str, weights: str, prompts: int, group: int, max_tokens: int,
                slots: int) -> None:
    """A side's process (benchmarks.workers): set up, an untimed warm-up (the engine's graphs compile
    then), then one timed run per "run" message until "stop"."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ids, params = workload(CONFIGS[config]["vocab_size"], kind, prompts, group, max_tokens)
    runner = SIDE_CLASSES[side](weights, slots, ids, params)
    t0 = time.perf_counter()
    warm = runner.warm_up()
    conn.send({"warmup_seconds": time.perf_counter() - t0, **warm})
    while conn.recv() == "run":
        t0 = time.perf_counter()
        result = runner.run()
        result["seconds"] = time.perf_counter() - t0
        conn.send(result)


def compare(name: str, kind: str, weights: str, args) -> tuple:
    """The three sides of one (config, workload), each in its own process, taking turns."""
    runs = {s: [] for s in args.sides}
    warm, rss = {}, {}
    with Workers() as workers:
        sides = {}
        for side in args.sides:  # one set-up and warm-up at a time: they would time each other's compilation
            sides[side] = workers.start(side_worker, side, name, kind, weights, args.prompts, args.group,
                                        args.max_tokens, args.slots)
            warm[side] = sides[side].recv()
            print(f"  {name} {kind} {side}: warm-up {warm[side]['warmup_seconds']:.0f}s", flush=True)
        for _ in range(args.repeats):
            for side in args.sides:
                r = sides[side].ask("run")
                runs[side].append(r)
                print(f"  {name} {kind} {side}: {r['tokens'] / r['seconds']:.0f} tok/s, {r['tokens']} tokens in "
                      f"{r['seconds']:.1f}s, useful fraction {r['useful_fraction']:.3f}", flush=True)
        for side in args.sides:
            rss[side] = sides[side].ask("stop")  # a side's last message: its peak RSS (GB)
    rate = {s: median([r["tokens"] / r["seconds"] for r in runs[s]]) if s in runs else None for s in SIDES}
    fraction = {s: median([r["useful_fraction"] for r in runs[s]]) if s in runs else None for s in SIDES}
    summary = {"engine_tokens_per_s": rate["engine"], "static_tokens_per_s": rate["static"],
               "transformers_tokens_per_s": rate["transformers"], "useful_fraction": fraction["engine"],
               "static_useful_fraction": fraction["static"], "peak_rss_gb": rss["engine"]}
    details = {s: {"runs": runs[s], "warmup": warm[s], "peak_rss_gb": rss[s],
                   "mean_length": float(np.mean([r["tokens"] for r in runs[s]])) / (args.prompts * args.group)}
               for s in args.sides}
    return summary, details


def markdown(res: dict, args) -> str:
    lines = ["# Rollout throughput: the slot-scheduled engine, the static engine, transformers `generate`", "",
             "Command (from the repo root):", "", f"    {res['command']}", "",
             f"Date {res['date']}, {res['machine']}, load average {res['load_average']} at the start. "
             f"{args.prompts} prompts x G={args.group}, at most {args.max_tokens} new tokens, temperature 1; "
             f"each side holds {args.slots} sequences' KV cache (the engine's slots; batches of "
             f"{max(1, args.slots // args.group)} prompts x {args.group} for the static engine and transformers); medians of "
             f"{args.repeats} timed run(s) per side after a warm-up run, sides taking turns, each in its own process. "
             "longtail: a random model whose V/150 stop ids end a sample with probability ~1/150 per token; "
             "forced: every sample runs the whole length.", "",
             "| config | workload | mean length | engine tok/s | static tok/s | transformers tok/s | engine / static (x) | "
             "engine / transformers (x) | useful fraction (engine) | useful fraction (static) | peak RSS GB "
             "(engine / static / transformers) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    def ratio(r, side):
        other = r[f"{side}_tokens_per_s"]
        return None if other is None else r["engine_tokens_per_s"] / other

    for name, per in res["configs"].items():
        for kind, r in per.items():
            d = res["details"][name][kind]
            rss = " / ".join(num(d[s]["peak_rss_gb"], ".2f") if s in d else "-" for s in SIDES)
            lines.append(
                f"| {name} | {kind} | {d['engine']['mean_length']:.0f} | {r['engine_tokens_per_s']:.0f} | "
                f"{num(r['static_tokens_per_s'], '.0f')} | {num(r['transformers_tokens_per_s'], '.0f')} | "
                f"{num(ratio(r, 'static'), '.2f')} | {num(ratio(r, 'transformers'), '.2f')} | "
                f"{r['useful_fraction']:.3f} | {num(r['static_useful_fraction'], '.3f')} | {rss} |")
    lines += ["", "Goals (issue 21): longtail engine >= 2.5x static, >= 2x transformers, useful fraction >= 0.9; "
              "forced engine >= 0.9x static. A side not run in this invocation (--sides) shows '-'.", ""]
    for name, per in res["configs"].items():
        for kind, r in per.items():
            checks = []
            g = GOALS[kind]
            for side in ("static", "transformers"):
                if side in g and ratio(r, side) is not None:
                    checks.append(f"vs {side} {ratio(r, side):.2f}x (goal {g[side]}x)")
            if "fraction" in g:
                checks.append(f"useful fraction {r['useful_fraction']:.3f} (goal {g['fraction']})")
            lines.append(f"- {name} {kind}: " + ", ".join(checks))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=None, choices=list(ALL_CONFIGS),
                    help=f"default {' '.join(CONFIGS)} (multiturn: micro)")
    ap.add_argument("--workloads", nargs="+", default=["longtail", "forced"], choices=["longtail", "forced", "multiturn"],
                    help="multiturn runs alone (benchmarks/multiturn.py)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max_tokens", type=int, default=512)
    ap.add_argument("--slots", type=int, default=64, help="sequences each side holds at once")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES,
                    help="which sides to run (the engine always runs: every figure is relative to it)")
    ap.add_argument("--max_turns", type=int, default=4, help="multiturn: tool calls per conversation at most")
    ap.add_argument("--latency_ms", type=float, default=50.0, help="multiturn: the tool's latency")
    ap.add_argument("--tool_workers", type=int, default=16, help="multiturn: tool worker processes")
    ap.add_argument("--response_tokens", type=int, default=32, help="multiturn: tokens of a tool turn")
    ap.add_argument("--prompt_tokens", type=int, nargs=2, default=[180, 260], metavar=("MIN", "MAX"),
                    help="multiturn: a prompt's tokens (a system turn with the tools' definitions and a question)")
    ap.add_argument("--output", default=None, help="default benchmarks/results/rollout.json "
                    "(multiturn: rollout_multiturn.json)")
    args = ap.parse_args(argv)
    if "multiturn" in args.workloads:
        if args.workloads != ["multiturn"]:
            ap.error("--workloads multiturn runs alone")
        return multiturn_main(args, argv)
    args.configs = args.configs or list(CONFIGS)
    if set(args.configs) - set(CONFIGS):
        ap.error(f"--configs: the longtail and forced workloads run {', '.join(CONFIGS)}")
    args.output = args.output or os.path.join(RESULTS, "rollout.json")
    args.sides = ["engine"] + [s for s in args.sides if s != "engine"]

    res = {**run_stamp("benchmarks.rollout", argv), "configs": {}, "details": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            weights = os.path.join(tmp, name)
            hf_model(name, seed=0).save_pretrained(weights, safe_serialization=True)
            res["configs"][name], res["details"][name] = {}, {}
            for kind in args.workloads:
                summary, details = compare(name, kind, weights, args)
                res["configs"][name][kind], res["details"][name][kind] = summary, details
                text = markdown(res, args)
                write_results(args.output, res, text)  # after each workload: what is done survives a later failure
    print(text)
    return 0


def multiturn_main(args, argv) -> int:
    from benchmarks import multiturn

    args.output = args.output or os.path.join(RESULTS, "rollout_multiturn.json")
    args.configs = args.configs or ["micro"]
    res = {**run_stamp("benchmarks.rollout", argv), "configs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            weights = os.path.join(tmp, name)
            hf_model(name, seed=0, overrides=ALL_CONFIGS[name]).save_pretrained(weights, safe_serialization=True)
            res["configs"][name] = multiturn.compare(weights, ALL_CONFIGS[name]["vocab_size"], args)
            text = multiturn.markdown(res, args)
            write_results(args.output, res, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
