"""Multi-turn rollouts with tool calls: conversations continued in the KV cache (`generate(turns=...)`) against
the naive agent loop that re-prefills each turn's whole history (a fresh generate call per turn), one model,
one engine, one invocation. Run through `python -m benchmarks.rollout --workloads multiturn`.

The workload (64 prompts x G = 8 conversations by default, prompts of 180 to 260 random tokens (--prompt_tokens:
an agent's prompt is a system turn with its tools' definitions and the question; Qwen2.5's chat template writes a
GSM8K question with one calculator tool as 212 tokens), temperature 1):
a random model (transformers' initialisation) with V / 40 stop ids, so a model turn ends with a stop id with
probability about 1/40 per token; each turn that ends so is a tool call, up to --max_turns per conversation,
answered after --latency_ms by a tool on the tool pool (`bench_wait`: a sleep, in --tool_workers worker
processes) with a tool turn of --response_tokens fixed random ids; at most --max_tokens model tokens per
conversation over all its turns. The model writes no JSON: what is measured is the conversation machinery
(park, tool latency, append, decode on), not a model's tool use.

- cache: one generate call; a sample that ends its turn is parked while its tool runs, the tool turn is
  appended at its slot's position, the others decode meanwhile.
- re-prefill: the same conversations replayed as a naive loop does them: round k generates the k-th model turn
  of every conversation still going, as a fresh generate call whose prompts are the whole histories (prompt,
  the earlier model turns and tool turns, as the cache side wrote them), as many tokens as the cache side's
  turn (stop ids ignored), one sample per history; then the round's tool calls run on the pool, all at once,
  and the next round starts when the last has answered. The sampled tokens themselves differ from the cache
  side's (a fresh call restarts each sample's random stream), their number and every history do not.

The default model is `micro` (tiny_models.EXTRA_CONFIGS: 2 layers, hidden 64, V = 512), so that 64 x 8
conversations run in minutes on 2 cores; at that size a prefill costs little and the cache side's per-call
costs (an append graph call nearly every decode step, as a 50 ms tool answers within a step) dominate, while
on `tiny-small-vocab` (4 layers, hidden 256, V = 4096) the re-prefilled histories weigh (--configs).

Useful tokens/s = the model's own tokens (tool turns excluded) / wall seconds of the whole run (tool latency
included). Slot occupancy while tools run: of the cache side's decode steps, the share taken while at least one
tool call was in flight, and the tool calls in flight at a step on average; `waiting_seconds` is the time no
sample could decode (every sample waiting for a tool).
"""

from __future__ import annotations

import time
from typing import Dict, List

import numpy as np

from mindgrpo.tools import ToolCall, register_tool

TOOL = "bench_wait"


@register_tool(TOOL, description="sleeps `ms` milliseconds (a tool of fixed latency)",
               parameters={"type": "object", "properties": {"ms": {"type": "number"}}, "required": ["ms"]})
def bench_wait(ms: float) -> str:
    time.sleep(ms / 1000.0)
    return "ok"


class LatencyTurns:
    """engine.Turns: every turn that ends with a stop id is a tool call (one `bench_wait` on the pool); its tool
    turn is `answers[k]` of the conversation's prompt. Counts the tool calls in flight at each poll(False) (once
    per engine loop, before its decode step)."""

    def __init__(self, pool, answers: Dict[int, List[List[int]]], max_turns: int, latency_ms: float):
        self.pool, self.answers, self.latency_ms = pool, answers, latency_ms
        self.max_turns = max_turns
        self.max_turn_tokens = max(len(a) for per in answers.values() for a in per)
        self.turn: Dict[int, int] = {}
        self.prompt: Dict[int, int] = {}
        self.in_flight: List[int] = []

    def end_turn(self, request, prompt, turn_ids) -> bool:
        self.prompt[request] = prompt
        self.pool.submit(request, ToolCall(TOOL, {"ms": self.latency_ms}))
        return True

    def poll(self, block):
        if not block:
            self.in_flight.append(self.pool.pending)
        out = []
        for request, result in self.pool.poll(None if block else 0.0):
            k = self.turn.get(request, 0)
            self.turn[request] = k + 1
            out.append((request, self.answers[self.prompt[request]][k]))
        return out


def workload(vocab: int, prompts: int, group: int, max_tokens: int, max_turns: int, response_tokens: int,
             prompt_tokens=(180, 260), seed: int = 0):
    """(prompts, their tool turns per prompt, SamplingParams); the same in every run."""
    from mindgrpo.inference.sampling import SamplingParams

    rng = np.random.default_rng(seed)
    stops = rng.choice(np.arange(1, vocab), vocab // 40, replace=False)
    allowed = np.setdiff1d(np.arange(1, vocab), stops)
    ids = [rng.choice(allowed, int(n)).tolist() for n in rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, prompts)]
    answers = {p: [rng.choice(allowed, response_tokens).tolist() for _ in range(max_turns)] for p in range(prompts)}
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, n=group, seed=seed + 1,
                            stop_token_ids=tuple(int(s) for s in stops))
    return ids, answers, params


def cache_side(engine, pool, prompts, answers, params, max_turns: int, latency_ms: float) -> dict:
    turns = LatencyTurns(pool, answers, max_turns, latency_ms)
    compiled = engine.compiled_graphs
    t0 = time.perf_counter()
    out = engine.generate(prompts, params, turns=turns)
    seconds = time.perf_counter() - t0
    s = engine.last_stats
    flight = np.array(turns.in_flight)
    return {"out": out, "seconds": seconds, "model_tokens": int(sum(c.model_mask.sum() for c in out)),
            "tool_calls": int(sum(c.turns for c in out)), "decode_steps": s["decode_steps"],
            "slots": s["slots"], "slots_in_use": s["slots_in_use"], "waiting_seconds": s["waiting_seconds"],
            "append_seconds": s["append_seconds"], "append_calls": s["append_calls"],
            "steps_with_tools_in_flight": float((flight > 0).mean()) if flight.size else 0.0,
            "tools_in_flight_mean": float(flight.mean()) if flight.size else 0.0,
            "compiled_graphs": engine.compiled_graphs - compiled}


def segments(c) -> List[tuple]:
    """(start, end) of each model turn of a trajectory."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], c.model_mask.astype(int), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def reprefill_side(engine, pool, prompts, out, params, latency_ms: float) -> dict:
    """The naive loop over the cache side's conversations `out` (see the module docstring)."""
    from mindgrpo.inference.sampling import SamplingParams

    runs = [segments(c) for c in out]
    compiled = engine.compiled_graphs
    tokens = prefill_tokens = rounds = 0
    t0 = time.perf_counter()
    for k in range(max(len(r) for r in runs)):
        live = [i for i, r in enumerate(runs) if len(r) > k]
        histories = [prompts[out[i].prompt_index] + out[i].token_ids[:runs[i][k][0]] for i in live]
        limits = [runs[i][k][1] - runs[i][k][0] for i in live]
        fresh = engine.generate(histories, SamplingParams(max_tokens=max(limits), temperature=1.0, n=1,
                                                          seed=params.seed + 1 + k, ignore_stop=True),
                                max_tokens=limits, prompt_index=live)
        tokens += sum(len(c.token_ids) for c in fresh)
        prefill_tokens += sum(len(h) for h in histories)
        calls = [i for i in live if len(runs[i]) > k + 1]  # a tool turn follows this model turn
        if calls:
            pool.run([ToolCall(TOOL, {"ms": latency_ms}) for _ in calls])
        rounds += 1
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "model_tokens": tokens, "prefill_tokens": prefill_tokens, "rounds": rounds,
            "compiled_graphs": engine.compiled_graphs - compiled}


def compare(weights: str, vocab: int, args) -> dict:
    """Both sides on one engine: an untimed warm-up of each (it compiles their graphs), then the timed runs,
    taking turns."""
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.models.checkpoint import load_model
    from mindgrpo.tools import ToolPool

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    prompts, answers, params = workload(vocab, args.prompts, args.group, args.max_tokens, args.max_turns,
                                        args.response_tokens, tuple(args.prompt_tokens))
    capacity = max(len(p) for p in prompts) + args.max_tokens + args.max_turns * args.response_tokens
    engine = RolloutEngine(load_model(weights), max_num_seqs=args.slots, max_model_len=capacity + 1)
    runs = {"cache": [], "reprefill": []}
    with ToolPool({TOOL: {}}, num_workers=args.tool_workers, timeout_s=30.0) as pool:
        pool.run([ToolCall(TOOL, {"ms": 0})] * args.tool_workers)  # the workers started
        t0 = time.perf_counter()
        warm = cache_side(engine, pool, prompts, answers, params, args.max_turns, args.latency_ms)
        reprefill_side(engine, pool, prompts, warm["out"], params, args.latency_ms)
        warmup_seconds = time.perf_counter() - t0
        print(f"  multiturn: warm-up {warmup_seconds:.0f}s", flush=True)
        for _ in range(args.repeats):
            c = cache_side(engine, pool, prompts, answers, params, args.max_turns, args.latency_ms)
            r = reprefill_side(engine, pool, prompts, c.pop("out"), params, args.latency_ms)
            runs["cache"].append(c)
            runs["reprefill"].append(r)
            print(f"  multiturn: cache {c['model_tokens'] / c['seconds']:.0f} tok/s ({c['model_tokens']} tokens, "
                  f"{c['tool_calls']} tool calls, {c['seconds']:.1f}s); re-prefill "
                  f"{r['model_tokens'] / r['seconds']:.0f} tok/s ({r['model_tokens']} tokens, {r['seconds']:.1f}s)",
                  flush=True)
    rate = {s: float(np.median([x["model_tokens"] / x["seconds"] for x in runs[s]])) for s in runs}
    last = runs["cache"][-1]
    return {"cache_tokens_per_s": rate["cache"], "reprefill_tokens_per_s": rate["reprefill"],
            "ratio": rate["cache"] / rate["reprefill"], "tool_calls": last["tool_calls"],
            "model_tokens": last["model_tokens"], "steps_with_tools_in_flight": last["steps_with_tools_in_flight"],
            "tools_in_flight_mean": last["tools_in_flight_mean"], "slots_in_use": last["slots_in_use"],
            "waiting_seconds": last["waiting_seconds"], "warmup_seconds": warmup_seconds, "runs": runs}


def markdown(res: dict, args) -> str:
    lines = ["# Multi-turn rollouts with tool calls: continuation in the KV cache against re-prefilling each turn",
             "", "Command (from the repo root):", "", f"    {res['command']}", "",
             f"Date {res['date']}, {res['machine']}, load average {res['load_average']} at the start (a machine "
             "shared with other work: the two sides take turns, so a load change falls on both). "
             f"{args.prompts} prompts of {args.prompt_tokens[0]}-{args.prompt_tokens[1]} tokens x G={args.group} "
             f"conversations, up to {args.max_turns} tool calls each, a tool "
             f"of {args.latency_ms:g} ms latency on {args.tool_workers} tool workers, tool turns of "
             f"{args.response_tokens} tokens, at most {args.max_tokens} model tokens per conversation, temperature 1, "
             f"a random model whose V/40 stop ids end a turn with probability ~1/40 per token; {args.slots} slots; "
             f"medians of {args.repeats} timed run(s) per side after a warm-up of each. The re-prefill side replays "
             "the cache side's conversations as a naive agent loop: a fresh generate call per turn whose prompts are "
             "the whole histories, as many tokens per turn (module docstring of benchmarks/multiturn.py).", "",
             "| config | tool calls | model tokens | cache tok/s | re-prefill tok/s | cache / re-prefill (x) | "
             "decode steps with tools in flight | tool calls in flight per step | slots decoding per step | "
             "seconds all waiting | append calls (seconds) | decode steps |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["configs"].items():
        c = r["runs"]["cache"][-1]
        lines.append(f"| {name} | {r['tool_calls']} | {r['model_tokens']} | {r['cache_tokens_per_s']:.0f} | "
                     f"{r['reprefill_tokens_per_s']:.0f} | {r['ratio']:.2f} | {r['steps_with_tools_in_flight']:.2f} | "
                     f"{r['tools_in_flight_mean']:.1f} | {r['slots_in_use']:.1f} | {r['waiting_seconds']:.2f} | "
                     f"{c['append_calls']} ({c['append_seconds']:.1f}) | {c['decode_steps']} |")
    lines += ["", "Goal (issue 45): cache >= 2x re-prefill useful tokens/s, decode not stalled while tools run.", ""]
    return "\n".join(lines) + "\n"
