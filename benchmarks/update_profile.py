"""Where the update phase's time goes: the update of the GRPO step benchmark's workload (same model
config, prompt lengths, group, forced response length, beta, micro-batches, entropy logging) under
MindSpore's profiler, by kind of op, set against the fp32 matmul peak measured in the same process.

    python -m benchmarks.update_profile --steps 7                        # tiny-qwen-vocab (results/)
    python -m benchmarks.update_profile --config tiny-small-vocab --output /tmp/p.json

Each of --steps rounds times the update as the trainer runs it (`PolicyUpdater.update`: micro-batch
graphs, then AdamW), then its parts on their own: the micro-batch graphs (forward, loss, backward,
accumulation) and the AdamW graph (what is left is host work: batching, tensors in and out), then the
matmul peak; medians over the rounds. After the rounds the micro-batch graphs run --steps more times
under the profiler, whose per-op times are grouped:

    matmul        MatMul and BatchMatMul (every useful FLOP of the update is one of these)
    vocabulary    other ops with a vocabulary-sized input, e.g. (B*R, V): log-softmax and its
                  gradient, the entropy's softmax and sums, the label gather's gradient
    accumulation  AssignAdd / ScatterAdd into the gradient buffers
    other         the rest: the layers' norms, RoPE, SwiGLU, attention softmax, reshapes, their gradients

"matmul only" is the update's useful FLOPs (benchmarks/grpo_step/flops.py's count) over the matmul time
alone: the rate the update would reach if everything but its matmuls took no time, so the bound on
"% of the matmul peak" that faster non-matmul ops could buy; below it, the matmul kernels themselves.
Token ids are random (the cost depends on shapes only). Writes benchmarks/results/update_profile.{json,md}.
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import tempfile
from collections import defaultdict
from typing import Dict, List

import numpy as np

from benchmarks.grpo_step.flops import peak_shapes, update_flops
from benchmarks.grpo_step.workload import BETA, LR
from benchmarks.harness import RESULTS, code_version, run_stamp, timed, write_results
from benchmarks.matmul_peak import matmul_gflops
from benchmarks.tiny_models import ALL_CONFIGS

# the Qwen2.5 token counts of the first 4 GSM8K test questions in the qwen_r1 template (benchmarks/grpo_step/)
GSM8K_PROMPT_LENS = [157, 118, 149, 127]
KINDS = ("matmul", "vocabulary", "accumulation", "other")


def op_kind(op_type: str, shapes: List[tuple], vocab_size: int) -> str:
    if op_type in ("MatMul", "BatchMatMul"):
        return "matmul"
    if op_type in ("AssignAdd", "ScatterAdd"):
        return "accumulation"
    if any(vocab_size in s for s in shapes):
        return "vocabulary"
    return "other"


def profile_rows(folder: str):
    """MindSpore's CPU profile under `folder` -> (op type, its input shapes, total ms, calls) for each op."""
    framework = glob.glob(os.path.join(folder, "**", "cpu_framework_*.txt"), recursive=True)
    details = glob.glob(os.path.join(folder, "**", "cpu_op_detail_info_*.csv"), recursive=True)
    if not framework or not details:
        raise RuntimeError(f"no CPU profile under {folder}")
    shapes = {}  # op name (e.g. MatMul-op3) -> its input shapes
    with open(framework[0]) as f:
        for line in f:
            fields = line.strip().split(";")
            if len(fields) >= 2:
                shapes[fields[1]] = [tuple(int(x) for x in re.findall(r"\d+", m))
                                     for m in re.findall(r"input_\d+:\[([^\]]*)\]", line)]
    with open(details[0]) as f:
        for row in csv.DictReader(f):
            yield (row["op_type"], shapes.get(row["op_name"], []), float(row["op_total_time(ms)"]),
                   int(float(row.get("op_occurrences") or 1)))


def read_profile(folder: str, vocab_size: int) -> Dict[str, float]:
    """MindSpore's CPU profile under `folder` -> total ms per kind of op."""
    totals = defaultdict(float)
    for op_type, shapes, ms, _ in profile_rows(folder):
        totals[op_kind(op_type, shapes, vocab_size)] += ms
    return {k: totals.get(k, 0.0) for k in KINDS}


def build(model: dict, micro_batch: int, group: int, new_tokens: int, prompt_lens: List[int], seed: int = 0):
    """The policy, its updater as the trainer builds it (grpo_step's settings) and one rollout batch."""
    from mindgrpo.config.sections import ActorConfig
    from mindgrpo.grpo.actor import PolicyUpdater
    from mindgrpo.grpo.experience import pack
    from mindgrpo.grpo.ms_objective import GRPOLoss
    from mindgrpo.grpo.optim import AdamWSettings
    from mindgrpo.grpo.packing import Batching
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    lm = Qwen2ForCausalLM(Qwen2Config(**model, rope_theta=1000000.0, rms_norm_eps=1e-6), seed=seed,
                          max_positions=4096)
    actor = ActorConfig()
    updater = PolicyUpdater(lm, GRPOLoss(beta=BETA, kl_kind="k3", agg_mode="token-mean"), Batching(micro_batch),
                            detach_old=True, use_ref=True,
                            optimizer=AdamWSettings.of_actor(actor))
    rng = np.random.default_rng(seed)
    vocab = model["vocab_size"]
    prompts = [rng.integers(0, vocab, n).tolist() for n in prompt_lens for _ in range(group)]
    responses = [rng.integers(0, vocab, new_tokens).tolist() for _ in prompts]
    exp = pack(prompts, responses, rng.standard_normal(len(prompts)).astype(np.float32))
    exp.ref_logp = np.where(exp.mask > 0, -np.log(vocab) + 0.1 * rng.standard_normal(exp.mask.shape), 0.0)
    exp.ref_logp = exp.ref_logp.astype(np.float32)
    return updater, exp


def graph_inputs(updater, exp) -> List[tuple]:
    """The micro-batch graph's inputs, as `PolicyUpdater.update` makes them."""
    import mindspore as ms
    from mindspore import Tensor

    from mindgrpo.grpo.actor import tensors
    from mindgrpo.grpo.packing import plan

    g_tok, g_seq = Tensor(np.float32(exp.mask.sum())), Tensor(np.float32((exp.mask.sum(-1) > 0).sum()))
    out = []
    for mb in plan(exp, updater.batching):
        part = mb.exp
        out.append((Tensor(mb.ids), ms.mutable(tensors(mb.feed)), Tensor(part.mask), Tensor(part.advantages),
                    Tensor(np.zeros(part.labels.shape, np.float32)), Tensor(part.ref_logp), g_tok, g_seq, None))
    return out


def measure(args) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    from mindgrpo.grpo.optim import adam_scalars

    ms.set_context(mode=ms.GRAPH_MODE)
    model = ALL_CONFIGS[args.config]
    prompt_lens = GSM8K_PROMPT_LENS[:args.prompts]
    updater, exp = build(model, args.micro_batch, args.group, args.new_tokens, prompt_lens)
    inputs = graph_inputs(updater, exp)

    def graphs():
        for x in inputs:
            updater.step_graph(*x)[0].asnumpy()

    bc1, bc2 = adam_scalars(2, updater.beta1, updater.beta2)
    adamw = lambda: updater.adamw(Tensor(np.float32(LR)), bc1, bc2, Tensor(np.float32(1.0)), None).asnumpy()  # noqa: E731
    shapes = peak_shapes(model, max(prompt_lens) + args.new_tokens, args.new_tokens, args.micro_batch)
    flops = update_flops(model, [n for n in prompt_lens for _ in range(args.group)], args.new_tokens)
    for _ in range(2):  # compile and warm up
        updater.update(exp, LR)
    # this machine's speed drifts (other jobs): each round times the update, its parts and the matmul
    # peak side by side, and the figures below are medians over the rounds of per-round values
    rounds = []
    for _ in range(args.steps):
        r = {"update": timed(lambda: updater.update(exp, LR), 1)[0], "graphs": timed(graphs, 1)[0],
             "adamw": timed(adamw, 1)[0], "peak": matmul_gflops("mindspore", shapes)}
        r["host"] = r["update"] - r["graphs"] - r["adamw"]
        r["pct"] = 100 * flops / r["update"] / 1e9 / r["peak"]["peak"]
        rounds.append(r)
    med = lambda key: float(np.median([r[key] for r in rounds]))  # noqa: E731
    peak = {k: float(np.median([r["peak"][k] for r in rounds])) for k in rounds[0]["peak"]}
    with tempfile.TemporaryDirectory() as folder:
        prof = ms.Profiler(output_path=folder)
        for _ in range(args.steps):
            graphs()
        prof.stop()
        prof.analyse()
        kinds = {k: v / 1000 / args.steps for k, v in read_profile(folder, model["vocab_size"]).items()}
    update_s = med("update")
    return {"update_s": update_s, "graphs_s": med("graphs"), "adamw_s": med("adamw"), "host_s": med("host"),
            "profiled_ops_s": kinds, "between_ops_s": med("graphs") - sum(kinds.values()),
            "update_gflop": flops / 1e9, "matmul_gflops": peak, "update_gflops_per_s": flops / update_s / 1e9,
            "matmul_only_gflops_per_s": flops / kinds["matmul"] / 1e9, "update_pct_of_peak": med("pct"),
            "matmul_only_pct_of_peak": 100 * flops / kinds["matmul"] / 1e9 / peak["peak"],
            "rounds": rounds,
            "micro_batches": len(inputs), "shape": list(exp.input_ids.shape), "scored": list(exp.labels.shape)}


def markdown(res: dict) -> str:
    r = res["result"]
    rows = [("update (as the trainer runs it)", r["update_s"]),
            ("micro-batch graphs: matmuls", r["profiled_ops_s"]["matmul"]),
            ("micro-batch graphs: vocabulary-sized passes", r["profiled_ops_s"]["vocabulary"]),
            ("micro-batch graphs: gradient accumulation", r["profiled_ops_s"]["accumulation"]),
            ("micro-batch graphs: other ops (layers)", r["profiled_ops_s"]["other"]),
            ("micro-batch graphs: between ops (graph wall - profiled ops)", r["between_ops_s"]),
            ("AdamW (clip, update, zero the buffers)", r["adamw_s"]),
            ("host (batching, tensors in and out)", r["host_s"])]
    peak = r["matmul_gflops"]
    lines = ["# Where the update phase's time goes", "", "Command (from the repo root):", "",
             f"    {res['command']}", "",
             f"Date {res['date']}, {res['code']}; machine: {res['machine']}; load average {res['load_average']}.", "",
             f"Config `{res['config']}` ({res['model']}); {res['prompts']} prompts of GSM8K lengths "
             f"{res['prompt_lens']} x G={res['group']} x {res['new_tokens']} forced new tokens; {r['micro_batches']} "
             f"micro-batches of {res['micro_batch']} rows (inputs {r['shape']}, scored {r['scored']}); beta 0.04 "
             f"(k3), entropy logged; 2 warm-up updates, then {res['steps']} rounds, each timing the update, its "
             "parts and the matmul peak side by side (this machine's speed drifts); medians over the rounds. Op "
             "times: MindSpore's profiler over the same micro-batch graphs, after the rounds. Per-round % of the "
             "peak: " + ", ".join(f"{x['pct']:.0f}%" for x in r["rounds"]) + ".", "",
             "| part | s per update | share |", "|---|---|---|"]
    for name, sec in rows:
        lines.append(f"| {name} | {sec:.3f} | {100 * sec / r['update_s']:.0f}% |")
    lines += ["", f"Useful work {r['update_gflop']:.1f} GFLOP. MindSpore fp32 matmul in the same process: "
              + ", ".join(f"{k} {v:.1f}" for k, v in peak.items() if k != "peak") + f" GFLOP/s; peak {peak['peak']:.1f}.",
              "", f"- update: {r['update_gflops_per_s']:.1f} GFLOP/s, {r['update_pct_of_peak']:.0f}% of the peak",
              f"- its matmuls alone: {r['matmul_only_gflops_per_s']:.1f} GFLOP/s, {r['matmul_only_pct_of_peak']:.0f}% "
              "of the peak: the most that making every other op free could reach", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny-qwen-vocab", choices=sorted(ALL_CONFIGS))
    ap.add_argument("--prompts", type=int, default=4, choices=range(1, len(GSM8K_PROMPT_LENS) + 1))
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--micro_batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--output", default=os.path.join(RESULTS, "update_profile.json"))
    args = ap.parse_args(argv)
    result = measure(args)
    model = ALL_CONFIGS[args.config]
    res = dict(run_stamp("benchmarks.update_profile", argv), code=code_version(), config=args.config,
               model=", ".join(f"{k} {v}" for k, v in model.items()), prompts=args.prompts,
               prompt_lens=GSM8K_PROMPT_LENS[:args.prompts], group=args.group, new_tokens=args.new_tokens,
               micro_batch=args.micro_batch, steps=args.steps, result=result)
    text = markdown(res)
    write_results(args.output, res, text)
    print(text)


if __name__ == "__main__":
    main()
