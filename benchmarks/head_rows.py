"""actor_config.head_rows_per_graph at the Qwen2.5-0.5B shape: the issue-20 step (`benchmarks.step_memory`'s
workload and side, the four memory switches on) with the layerwise update's vocabulary head and loss run on
each value's rows of a micro-batch a graph call, each value alone in a fresh process, one after another in
this invocation.

    python -m benchmarks.head_rows [--layers 24] [--steps 2] [--rows 0 1 2] [--output PATH]

Per value and step: seconds of the step and of its update, the update's peak resident memory and the step's
(VmHWM), in GB = 10^9 bytes; the loss and gradient norm of each step (the same work: the same numbers to rounding).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from benchmarks.harness import RESULTS, code_version, run_stamp, stamp_lines, write_results
from benchmarks.step_memory import MICRO_BATCH, side
from benchmarks.workers import Workers


def run(rows: int, layers: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as folder, Workers() as workers:
        worker = workers.start(side, layers, True, folder, False, (f"actor_config.head_rows_per_graph={rows}",), ())
        out = {"rows": rows, "built": worker.recv(), "steps": []}
        for _ in range(steps):
            step = worker.ask("step")
            update = next(r for r in step["phases"] if r["phase"] == "update")
            out["steps"].append({"step_s": step["step_s"], "step_peak_gb": step["step_peak_gb"], "loss": step["loss"],
                                 "grad_norm": step["grad_norm"],
                                 "update_s": update["seconds"], "update_peak_gb": update["peak_gb"],
                                 "phases": step["phases"]})
            print(f"head rows {rows}: step {step['step_s']:.1f} s (update {update['seconds']:.1f}), peak "
                  f"{step['step_peak_gb']:.2f} GB (update {update['peak_gb']:.2f})", flush=True)
        worker.ask("stop")
        out["process_peak_gb"] = max([out["built"]["build_peak_gb"]] + [s["step_peak_gb"] for s in out["steps"]])
    return out


def markdown(res: dict) -> str:
    lines = [f"# The layerwise update's head rows a graph call, the Qwen2.5-0.5B shape at {res['layers']} layers", "",
             *stamp_lines(res),
             f"The issue-20 step of `benchmarks.step_memory` (micro-batches of {MICRO_BATCH} rows of 128 response "
             "tokens, the four memory switches on), actor_config.head_rows_per_graph set to each value (0: the whole "
             "micro-batch), each alone in a fresh process, in turn. GB = 10^9 bytes.", "",
             "| head rows | step | step s | update s | update peak GB | step peak GB | loss | gradient norm |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        for i, s in enumerate(r["steps"], 1):
            lines.append(f"| {r['rows']} | {i} | {s['step_s']:.1f} | {s['update_s']:.1f} | {s['update_peak_gb']:.2f} | "
                         f"{s['step_peak_gb']:.2f} | {s['loss']:.6g} | {s['grad_norm']:.6g} |")
    lines += ["", "At step 1 the policy is the reference: the whole micro-batch's head reproduces its log-probs bit for "
              "bit and a head of fewer rows to rounding (~1e-7), so the KL term's gradient differs by rounding and the "
              "runs' losses and norms agree to about that; the same math to rounding is tests/grpo/test_layerwise.py's "
              "to show."]
    base = next((r for r in res["runs"] if r["rows"] == 0), None)
    if base is not None and base["steps"]:
        lines += ["", "Against the whole micro-batch (0), on the last step: "
                  + "; ".join(f"{r['rows']} rows: update {r['steps'][-1]['update_s'] / base['steps'][-1]['update_s']:.2f}x "
                              f"the time, process peak {r['process_peak_gb']:.2f} against {base['process_peak_gb']:.2f} GB"
                              for r in res["runs"] if r is not base and r["steps"]) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--output", default=os.path.join(RESULTS, "head_rows.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.head_rows", argv), code=code_version(), layers=args.layers, runs=[],
               load_average_end=os.getloadavg()[0])
    for rows in args.rows:
        res["runs"].append(run(rows, args.layers, args.steps))
        res["load_average_end"] = os.getloadavg()[0]
        write_results(args.output, res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
