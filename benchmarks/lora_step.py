"""LoRA GRPO (docs/lora.md) on the issue-20 step at the Qwen2.5-0.5B shape: our full fine-tuning, our LoRA and TRL's
GRPOTrainer with PEFT's LoraConfig, each alone in its process, one after the other, in one invocation.

    python -m benchmarks.lora_step [--layers 24] [--steps 2] [--rank 16] [--sides full lora trl_lora]
        [--switches layers|on|off|auto] [--set KEY=VALUE ...] [--output PATH]

The work is `benchmarks.step_memory`'s (4 GSM8K prompts x G = 4 x 128 forced new tokens, micro-batches of 4 rows,
beta 0.04, one update per step, random weights of the qwen2_5_0_5b preset with --layers decoder layers):
    full      our trainer, full fine-tuning, the memory switches on (step_memory's README row)
    lora      our trainer, actor_config.lora_rank = R (lora_alpha 2 R) on all seven projections, the memory switches
              as --switches says: layers (the default: the three layerwise switches on, rl_config.release_graphs
              off; the layer graphs take the adapters as inputs beside the base weights), on (full's four), off, or
              auto (none set: rl_config.memory auto chooses them for this machine's available memory, as a user's
              run does). Why layers: release_graphs compiles the step's graphs again every step, and what it saves
              is the buffers of the other phases' graphs, which the layer graphs keep small; the whole-model update
              graph does not fit in 24 GB at 24 layers, LoRA or not (HISTORY.md, 2026-11-30, has the runs)
    trl_lora  TRL's GRPOTrainer with peft_config = LoraConfig(r=R, lora_alpha=2 R, the same seven target modules);
              its reference is the model with the adapters off, as ours
Per side: seconds per phase and per step, the peak resident memory (VmHWM) of the process. On one device our engine
generates with the policy itself, so a step has no sync; after the steps each of our sides times the sync it would
run with generate_config.inference_weights: copy (`step_memory.sync_seconds`: every base weight; with LoRA the adapters
alone), and MindSpore's fp32 matmul rate (`benchmarks.matmul_peak`, squares of 1024 and 2048) in the same process;
TRL's side PyTorch's after each step. The ratios are the results: absolute seconds move with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from benchmarks import step_memory
from benchmarks.harness import RESULTS, code_version, run_stamp, stamp_lines, write_results
from benchmarks.workers import Workers

SIDES = ("full", "lora", "trl_lora")
# --switches (step_memory.SETTINGS) -> the LoRA side's title in the results
SWITCH_TITLES = {"layers": "the three layerwise switches on, release_graphs off", "on": "the memory switches on",
                 "off": "the memory switches off",
                 "auto": "the memory switches as rl_config.memory auto chose them"}


def lora_overrides(rank: int) -> tuple:
    return (f"actor_config.lora_rank={rank}", f"actor_config.lora_alpha={2 * rank}")


def _ours(res: dict, key: str, args, output: str) -> None:
    lora = key == "lora"
    with tempfile.TemporaryDirectory() as folder, Workers() as workers:
        switches, extra = step_memory.SETTINGS[args.switches if lora else "on"]
        worker = workers.start(step_memory.side, args.layers, switches, folder, False,
                               (*lora_overrides(args.rank), *extra, *args.set) if lora else extra, ())
        side = res["sides"][key] = {"built": worker.recv(), "steps": []}
        for _ in range(args.steps):
            step = worker.ask("step")
            side["steps"].append(step)
            side["process_peak_gb"] = max([side["built"]["build_peak_gb"]] + [s["step_peak_gb"] for s in side["steps"]])
            print(f"{key} step: {step['step_s']:.1f} s, peak {step['step_peak_gb']:.2f} GB; "
                  + ", ".join(f"{r['phase']} {r['seconds']:.1f} s" for r in step["phases"]), flush=True)
            write_results(output, res, markdown(res))
        side["sync"] = worker.ask("sync")
        print(f"{key} sync: {side['sync']}", flush=True)
        worker.ask("stop")


def _trl(res: dict, args, output: str) -> None:
    import peft
    import transformers
    import trl

    with tempfile.TemporaryDirectory() as folder, Workers() as workers:
        worker = workers.start(step_memory.trl_side, args.layers, folder, args.steps, args.torch_threads, args.rank)
        setup = worker.recv()
        side = res["sides"]["trl_lora"] = {
            "setup": setup, "steps": [], "process_peak_gb": setup["rss_gb"],
            "versions": f"trl {trl.__version__}, peft {peft.__version__}, transformers {transformers.__version__}, "
                        f"torch {setup['torch']}"}
        for _ in range(args.steps):
            step = worker.recv()
            side["steps"].append(step)
            side["process_peak_gb"] = max(side["process_peak_gb"], step["step_peak_gb"])
            print(f"trl_lora step: {step['phases']['step']:.1f} s, peak {step['step_peak_gb']:.2f} GB; "
                  + ", ".join(f"{k} {v:.1f}" for k, v in step["phases"].items()), flush=True)
            write_results(output, res, markdown(res))
        side["process_peak_gb"] = max(side["process_peak_gb"], worker.recv())


def _step_s(res: dict, key: str) -> float:
    side = res["sides"][key]
    return side["steps"][-1]["phases"]["step"] if key == "trl_lora" else side["steps"][-1]["step_s"]


def summary(res: dict) -> dict:
    """The ratios the issue asks for, from the last step of each side (the first compiles / warms up)."""
    sides, out = res["sides"], {}
    if {"full", "lora"} <= set(sides) and sides["full"]["steps"] and sides["lora"]["steps"]:
        out["lora_peak_over_full"] = sides["lora"]["process_peak_gb"] / sides["full"]["process_peak_gb"]
        out["full_step_over_lora"] = _step_s(res, "full") / _step_s(res, "lora")
    if {"lora", "trl_lora"} <= set(sides) and sides["lora"]["steps"] and sides["trl_lora"]["steps"]:
        out["lora_peak_over_trl_lora"] = sides["lora"]["process_peak_gb"] / sides["trl_lora"]["process_peak_gb"]
        out["trl_lora_step_over_lora"] = _step_s(res, "trl_lora") / _step_s(res, "lora")
    if "sync" in sides.get("lora", {}):
        sync = sides["lora"]["sync"]
        out["full_sync_over_adapter_sync"] = sync["full"]["seconds"] / sync["adapters"]["seconds"]
    return out


def markdown(res: dict) -> str:
    lines = [f"# LoRA rank {res['rank']} against full fine-tuning and TRL + PEFT: the issue-20 GRPO step at the "
             f"Qwen2.5-0.5B shape, {res['layers']} layers", "", *stamp_lines(res),
             f"Workload: `benchmarks.step_memory`'s (4 GSM8K prompts x G = {step_memory.G}, {step_memory.RESPONSE} "
             f"forced new tokens, micro-batches of {step_memory.MICRO_BATCH} rows, beta {step_memory.BETA}, one update "
             "per step, random weights). Each side alone in its process, one after the other. GB = 10^9 bytes; "
             "peak = VmHWM.", ""]
    sides = res["sides"]
    for key in ("full", "lora"):
        if key not in sides:
            continue
        side = sides[key]
        title = ("full fine-tuning, the memory switches on" if key == "full" else
                 f"LoRA rank {res['rank']} (alpha {2 * res['rank']}) on all seven projections, "
                 + SWITCH_TITLES[res.get("switches", "on")]  # results before --switches: on
                 + "".join(f", {kv}" for kv in res.get("set", ())))
        lines += [f"## Ours: {title}", "", f"Built in {side['built']['build_s']:.1f} s, peak "
                  f"{side['built']['build_peak_gb']:.2f} GB. Its start-up block:", "",
                  *("    " + line for line in side["built"].get("memory_policy", "").splitlines()),
                  "", "| step | phase | s | peak GB |", "|---|---|---|---|"]
        for i, step in enumerate(side["steps"], 1):
            for r in step["phases"]:
                lines.append(f"| {i} | {r['phase']} | {r['seconds']:.1f} | {r['peak_gb']:.2f} |")
            lines.append(f"| {i} | **step** | **{step['step_s']:.1f}** | **{step['step_peak_gb']:.2f}** |")
        if "process_peak_gb" in side:
            lines += ["", f"Process peak: {side['process_peak_gb']:.2f} GB."]
        if "sync" in side:
            sync = side["sync"]
            moved = ", ".join(f"{kind}: {v['seconds']:.4f} s for {v['bytes'] / 1e6:.2f} MB (first call, compiling, "
                              f"{v['first_s']:.2f} s)" for kind, v in sync.items() if kind != "matmul_gflops")
            rates = ", ".join(f"{k} {v:.0f}" for k, v in sync["matmul_gflops"].items())
            lines += ["", f"Same-layout sync into a copy (inference_weights: copy): {moved}. MindSpore fp32 matmul "
                      f"GFLOP/s after the steps: {rates}."]
        lines.append("")
    if "trl_lora" in sides:
        side = sides["trl_lora"]
        lines += [f"## TRL's GRPOTrainer with PEFT's LoraConfig (r {res['rank']}, alpha {2 * res['rank']}, the same "
                  f"seven modules) ({side['versions']})", "",
                  "| step | generation s | reference s | update s | other s | step s | step peak GB | torch matmul "
                  "GFLOP/s (peak) |", "|---|---|---|---|---|---|---|---|"]
        for i, s in enumerate(side["steps"], 1):
            p = s["phases"]
            lines.append(f"| {i} | {p['generation']:.1f} | {p['reference']:.1f} | {p['update']:.1f} | "
                         f"{p['other']:.1f} | **{p['step']:.1f}** | {s['step_peak_gb']:.2f} | "
                         f"{s['matmul_gflops']['peak']:.0f} |")
        lines += ["", f"TRL's process peak: {side['process_peak_gb']:.2f} GB.", ""]
    ratios = summary(res)
    if ratios:
        lines += ["## Ratios (last step of each side)", "", "| ratio | value | goal (issue 44) |", "|---|---|---|"]
        goals = {"lora_peak_over_full": "<= 0.7", "lora_peak_over_trl_lora": "<= 1", "trl_lora_step_over_lora": ">= 2",
                 "full_sync_over_adapter_sync": ">= 20", "full_step_over_lora": ""}
        lines += [f"| {k} | {v:.2f} | {goals.get(k, '')} |" for k, v in ratios.items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    ap.add_argument("--switches", choices=tuple(step_memory.SETTINGS), default="layers",
                    help="the LoRA side's memory switches: layers (the three layerwise ones), on (the full side's "
                         "four), off, or auto (rl_config.memory)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides of the LoRA side after its switches (e.g. "
                         "actor_config.recompute_num_layers=0)")
    ap.add_argument("--torch_threads", type=int, default=os.cpu_count(), help="PyTorch threads on TRL's side")
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)
    output = args.output or os.path.join(RESULTS, f"lora_step_{args.layers}_layers.json")
    res = dict(run_stamp("benchmarks.lora_step", argv), code=code_version(), layers=args.layers, rank=args.rank,
               switches=args.switches, set=list(args.set), sides={}, load_average_end=os.getloadavg()[0])
    for key in args.sides:  # one after the other: each alone
        if key == "trl_lora":
            _trl(res, args, output)
        else:
            _ours(res, key, args, output)
        res["load_average_end"] = os.getloadavg()[0]
    res["summary"] = summary(res)
    write_results(output, res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
