"""Memory and time of the training step's vocabulary head: MindSpore autodiff over all scored rows
(`actor_config.logprob_chunk_size=0`) against the fused, chunked head with its hand-written backward
(`mindgrpo/models/fused_head.py`), on `tiny-qwen-vocab` (Qwen2.5's 151,936-token vocabulary).

    python -m benchmarks.fused_head                      # micro-batches 4 8 16, chunk 0 and 512
    python -m benchmarks.fused_head --micro_batches 4 8 --chunks 0 256 1024

Each point is one GRPO step of the GRPO step benchmark's workload (benchmarks/grpo_step/) (same prompts, group, forced
response length; mindgrpo only), in a fresh process (MindSpore keeps its memory pool): one warm-up
step, then --steps measured steps; medians. Reports the update and reference phases, the step, and
the process's peak resident memory. A point the kernel kills for memory is reported as such.
Writes benchmarks/results/fused_head.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from benchmarks.grpo_step.ours import ours_worker
from benchmarks.grpo_step.workload import Workload
from benchmarks.harness import RESULTS, SHARED, code_version, run_stamp, write_results
from benchmarks.tiny_models import ALL_CONFIGS
from benchmarks.workers import SideFailed, Workers


def run_point(work, folder, args, micro: int, chunk: int) -> dict:
    try:
        with Workers() as sides:
            worker = sides.start(ours_worker, work, folder, args.group, args.new_tokens, micro, False, chunk)
            worker.recv()
            steps = [worker.ask("step") for _ in range(1 + args.steps)]
            rss = worker.ask("stop")
    except SideFailed as e:
        if "SIGKILL" in str(e):
            return {"micro_batch": micro, "chunk": chunk, "killed": True}
        raise
    measured = steps[1:]
    med = {k: float(np.median([s[k] for s in measured])) for k in ("step", "update", "reference", "generation")}
    return {"micro_batch": micro, "chunk": chunk, "killed": False, "peak_rss_gb": rss,
            **{f"{k}_s": v for k, v in med.items()}, "update_steps_s": [s["update"] for s in measured]}


def markdown(result: dict) -> str:
    lines = ["# Fused, chunked vocabulary head against MindSpore autodiff (training step)", "",
             "Command (from the repo root):", "", f"    {result['command']}", "",
             f"Config `{result['config']}` ({result['model']}), {result['prompts']} "
             f"prompts x {result['group']} samples x {result['new_tokens']} forced new tokens, beta 0.04 (the "
             f"reference is scored too); one warm-up step and {result['steps']} measured steps per point, each "
             "point in a fresh process; medians.", "",
             f"Date {result['date']}, {result['code']}; machine: {result['machine']}.", "",
             "| micro-batch rows | chunk | update s | reference s | step s | peak RSS GB |",
             "|---|---|---|---|---|---|"]
    for p in result["points"]:
        if p["killed"]:
            lines.append(f"| {p['micro_batch']} | {p['chunk'] or 'off'} | killed (out of memory) | | | |")
        else:
            lines.append(f"| {p['micro_batch']} | {p['chunk'] or 'off'} | {p['update_s']:.2f} | "
                         f"{p['reference_s']:.2f} | {p['step_s']:.2f} | {p['peak_rss_gb']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny-qwen-vocab", choices=list(ALL_CONFIGS))
    ap.add_argument("--micro_batches", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 512])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--shared", default=SHARED)
    ap.add_argument("--output", default=os.path.join(RESULTS, "fused_head.json"))
    args = ap.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="fused_head_")
    points = []
    try:
        work = Workload(args.config, ALL_CONFIGS[args.config], os.path.join(folder, args.config), args.prompts,
                        args.shared)
        for micro in args.micro_batches:
            for chunk in args.chunks:
                p = run_point(work, os.path.join(folder, f"mb{micro}_c{chunk}"), args, micro, chunk)
                points.append(p)
                print(json.dumps(p), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    stamp = run_stamp("benchmarks.fused_head", argv)
    result = {"command": stamp["command"],
              "config": args.config, "model": ", ".join(f"{k} {v}" for k, v in ALL_CONFIGS[args.config].items()),
              "prompts": args.prompts, "group": args.group, "new_tokens": args.new_tokens,
              "steps": args.steps, "date": stamp["date"], "code": code_version(), "machine": stamp["machine"],
              "points": points}
    write_results(args.output, result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
