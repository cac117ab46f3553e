"""Probe (not a benchmark): where a rollout's time goes, by kind of op, under MindSpore's CPU profiler, at the
Qwen2.5-0.5B shape (random weights, its 151,936-token vocabulary) cut to --layers layers.

    python -m benchmarks.probes.decode_profile [--layers 4] [--prompts 4] [--samples 4] [--prompt_len 140]
        [--tokens 64] [--whole] [--output decode_profile.json]

The issue-20 rollout's work, as benchmarks.probes.engine_kernels runs it (--prompts prompts of --prompt_len random
tokens, --samples samples each of exactly --tokens new tokens, temperature 1; layer graphs, or whole-model graphs
with --whole). One untimed generate call (it compiles), one timed call, then one call under `ms.Profiler`. The
profiler's per-op times (`cpu_op_detail_info_*.csv`) are summed by op type and by where the op's inputs put it:

    head        an input with a vocabulary-sized dimension (the vocabulary projection, the sampler's softmax,
                top-k / top-p, the log-probs of the chosen tokens)
    layers      every other op (the decoder layers' products, norms, RoPE, attention over the KV cache)

Per decode step (the call's seconds over --tokens steps, the prefill included) and per layer a step. "between ops"
is the profiled call's wall less the sum of its op times: the runtime's own work and the host between the graphs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict

from benchmarks.harness import code_version, run_stamp, stamp_lines, write_results
from benchmarks.probes.engine_kernels import add_rollout_args, rollout_work
from benchmarks.update_profile import profile_rows


def read_ops(folder: str, vocab_size: int) -> dict:
    """MindSpore's CPU profile under `folder` -> {(part, op type): [total ms, calls]}, part "head" or "layers"."""
    out = defaultdict(lambda: [0.0, 0])
    for op_type, shapes, ms, calls in profile_rows(folder):
        key = ("head" if any(vocab_size in shape for shape in shapes) else "layers", op_type)
        out[key][0] += ms
        out[key][1] += calls
    return dict(out)


def markdown(res: dict) -> str:
    a = res["args"]
    steps = a["tokens"]
    lines = [f"# Where a rollout's time goes, by op, Qwen2.5-0.5B shape, {a['layers']} layers", "", *stamp_lines(res),
             f"Work: {a['prompts']} prompts of {a['prompt_len']} random tokens x {a['samples']} samples of "
             f"{a['tokens']} new tokens (temperature 1, no stop), {'whole-model' if a['whole'] else 'layer'} graphs. "
             f"A call: {res['call_s']:.2f} s timed, {res['profiled_s']:.2f} s under the profiler; ops "
             f"{res['ops_ms'] / 1000:.2f} s, between ops {res['profiled_s'] - res['ops_ms'] / 1000:.2f} s.", "",
             "| part | op type | ms a decode step | ms a layer a step | calls | share of the ops |",
             "|---|---|---|---|---|---|"]
    for (part, op), (ms, calls) in sorted(res["ops"].items(), key=lambda kv: -kv[1][0])[:a["top"]]:
        per_layer = f"{ms / steps / a['layers']:.2f}" if part == "layers" else ""
        lines.append(f"| {part} | {op} | {ms / steps:.2f} | {per_layer} | {calls} | "
                     f"{100 * ms / res['ops_ms']:.1f}% |")
    for part in ("layers", "head"):
        total = sum(ms for (p, _), (ms, _) in res["ops"].items() if p == part)
        per_layer = f"{total / steps / a['layers']:.2f}" if part == "layers" else ""
        lines.append(f"| {part} | **all** | {total / steps:.2f} | {per_layer} | | {100 * total / res['ops_ms']:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_args(ap, layers=4, tokens=64)
    ap.add_argument("--top", type=int, default=20, help="op types in the table")
    ap.add_argument("--output", default="decode_profile.json")
    args = ap.parse_args(argv)
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine

    ms.set_context(mode=ms.GRAPH_MODE)
    res = dict(run_stamp("benchmarks.probes.decode_profile", argv), code=code_version())
    res["args"] = vars(args)
    cfg, lm, longest, work, params = rollout_work(args)
    engine = RolloutEngine(lm, max_num_seqs=args.prompts * args.samples, max_model_len=longest,
                           layerwise=not args.whole)
    engine.generate(work, params)  # compiles
    t0 = time.perf_counter()
    engine.generate(work, params)
    res["call_s"] = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as folder:
        prof = ms.Profiler(output_path=folder)
        t0 = time.perf_counter()
        engine.generate(work, params)
        res["profiled_s"] = time.perf_counter() - t0
        prof.stop()
        prof.analyse()
        ops = read_ops(folder, cfg.vocab_size)
    res["ops"] = {f"{part}|{op}": v for (part, op), v in ops.items()}
    res["ops_ms"] = sum(v[0] for v in ops.values())
    res["load_average_end"] = os.getloadavg()[0]
    text = markdown({**res, "ops": ops})  # the table from the (part, op type) keys; the JSON keeps them as "part|op"
    write_results(args.output, res, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
