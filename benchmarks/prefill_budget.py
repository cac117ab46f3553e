"""A rollout at many slots with and without a prefill budget (generate_config.max_prefill_tokens): what the
engine's first generate call holds and costs when every admitted prompt is prefilled in one graph call, and
when the calls take at most the budget's prompt positions.

    python -m benchmarks.prefill_budget [--layers 4] [--prompts 64] [--budgets 4096 1024] [--layerwise on|off]
        [--output PATH]

The Qwen2.5-0.5B shape (hidden 896, intermediate 4864, 14 / 2 heads, tied, vocabulary 151,936; random weights)
cut to --layers decoder layers; --prompts prompts of 157, 118, 149 and 127 random tokens in turn, G = 4 samples
of 128 forced tokens each, a slot per sample (256 slots for 64 prompts), the engine on the model itself,
`--layerwise` (default on: the memory switch users of this shape turn on). All prompts are admitted at the
first step and fall in the 256-position bucket. The sides: no budget, then each --budgets value, each in its own
process one after the other: the model, then the engine built and its first call. The resident memory the call
leaves (+held) and its peak above the start (VmHWM), in GB = 10^9 bytes; seconds; prefill calls; whether the
tokens equal the first side's, and how many log-probs differ and by how much.
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.harness import RESULTS, code_version, run_stamp, stamp_lines, values_differ, write_results
from benchmarks.update_sides import G, PROMPT_LENGTHS, RESPONSE, measured, step_workload
from benchmarks.workers import Workers


def side(conn, layers: int, prompts: int, budget, layerwise: bool) -> None:
    """A `benchmarks.workers` side: the model, the engine and its first call; its figures and its samples."""
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg, positions, base, params, _ = step_workload(layers, 151936)
    lm = Qwen2ForCausalLM(cfg, seed=0, max_positions=positions)
    work = [base[i % len(base)] for i in range(prompts)]
    engine = RolloutEngine(lm, max_num_seqs=prompts * G, max_model_len=max(PROMPT_LENGTHS) + RESPONSE,
                           layerwise=layerwise, max_prefill_tokens=budget)
    calls = []
    prefill = engine._prefill
    engine._prefill = lambda cache, ps, homes, p_len: (calls.append(len(ps)), prefill(cache, ps, homes, p_len))[1]
    out, figures = measured(lambda: engine.generate(work, params))
    conn.send({**figures, "prefill_calls": calls, "prefill_seconds": engine.last_stats["prefill_seconds"],
               "decode_seconds": engine.last_stats["decode_seconds"], "kv_gb": engine.cache_bytes() / 1e9,
               "tokens": [c.token_ids for c in out], "logprobs": [c.logprobs.tolist() for c in out]})


def compare(first: dict, other: dict) -> dict:
    return {"same_tokens": first["tokens"] == other["tokens"], **values_differ(first["logprobs"], other["logprobs"])}


def markdown(res: dict) -> str:
    a = res["args"]
    lines = ["# A prefill budget (generate_config.max_prefill_tokens) at many slots", "",
             *stamp_lines(res),
             f"The Qwen2.5-0.5B shape cut to {a['layers']} decoder layers (random weights); {a['prompts']} prompts of "
             f"{list(PROMPT_LENGTHS)} random tokens in turn x G = {G}, {RESPONSE} forced tokens, {a['prompts'] * G} "
             f"slots, layerwise {a['layerwise']}; each side in its own process, the engine's first call. GB = 10^9 "
             "bytes; +held: resident memory after the call less before it; peak: above the start.", "",
             "| budget (prompt positions a call) | prefill calls (prompts each) | s | prefill s | decode s | +held GB "
             "| peak GB | KV cache GB | tokens | log-probs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["sides"].items():
        c = r.get("compared")
        lp = "" if c is None else (f"{c['differ']} of {c['values']} differ (max {c['max_abs']:.1e})"
                                   if c["differ"] is not None else "other lengths")
        toks = "reference" if c is None else ("the same" if c["same_tokens"] else "OTHER")
        lines.append(f"| {name} | {len(r['prefill_calls'])} ({', '.join(map(str, r['prefill_calls']))}) | "
                     f"{r['seconds']:.1f} | {r['prefill_seconds']:.1f} | {r['decode_seconds']:.1f} | "
                     f"{r['after_gb'] - r['before_gb']:+.2f} | {r['peak_gb'] - r['before_gb']:+.2f} | "
                     f"{r['kv_gb']:.2f} | {toks} | {lp} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--budgets", type=int, nargs="+", default=[4096, 1024])
    ap.add_argument("--layerwise", choices=["on", "off"], default="on")
    ap.add_argument("--output", default=os.path.join(RESULTS, "prefill_budget.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.prefill_budget", argv), code=code_version(), args=vars(args), sides={})
    first = None
    for budget in [None] + args.budgets:  # one process at a time
        name = "none" if budget is None else str(budget)
        with Workers() as workers:
            r = workers.start(side, args.layers, args.prompts, budget, args.layerwise == "on").recv()
        if first is None:
            first = r
        else:
            r["compared"] = compare(first, r)
        print(f"budget {name}: {r['seconds']:.1f} s, +{r['after_gb'] - r['before_gb']:.2f} GB held, peak "
              f"+{r['peak_gb'] - r['before_gb']:.2f}, prefill calls {r['prefill_calls']}", flush=True)
        res["sides"][name] = r
    for r in res["sides"].values():
        del r["tokens"], r["logprobs"]
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
