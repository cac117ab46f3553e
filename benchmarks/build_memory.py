"""Where the built trainer's resident memory goes, per decoder layer: the issue-20 workload of
`benchmarks.step_memory` (the Qwen2.5-0.5B shape with N layers, its switches) built in a fresh process for
each layer count, the resident memory read after each part of the build, and the bytes of each group of
tensors that holds a copy of the layer weights.

    python -m benchmarks.build_memory [--layers 2 4] [--switches on|off] [--output PATH]

Parts, in build order (`grpo.builder.build`, then `make_trainer`): the policy model, the reference model,
the rollout engine (its fused layer copies), the reference's weight sync (made and, with random weights,
run once), then the trainer (gradient buffers and AdamW's moments). Per part: the resident memory it added
(GB = 10^9 bytes); between two layer counts, its growth per decoder layer and that growth in copies of one
layer's fp32 weights. Groups: the layer tensors each object holds (bytes, and in layer copies).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from benchmarks.harness import RESULTS, code_version, rss_gb, run_stamp, write_results
from benchmarks.step_memory import setup
from benchmarks.workers import Workers

PARTS = ("imports", "policy", "reference", "engine", "ref_sync", "build_rest", "trainer")


def _layer_bytes(params) -> int:
    """Bytes of the decoder-layer tensors among params (names holding 'layers.' or the engine's fused copies)."""
    return sum(p.nbytes for p in params if "layers." in p.name or p.name.startswith("inference_weights."))


def side(conn, layers: int, switches: bool, folder: str) -> None:
    """Builds the trainer, reading the resident memory after each part (module docstring)."""
    import mindspore as ms

    from mindgrpo.grpo import builder
    from mindgrpo.parallel import placement
    from mindgrpo.utils.metrics_log import MetricsLogger
    from mindgrpo.utils.progress import Progress

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg, paths, _, _ = setup(folder, layers, switches)
    marks = [("start", rss_gb())]
    model, weight_sync, build_engine = placement.OneDevice.model, placement.OneDevice.weight_sync, builder.build_engine

    def traced_model(self, role, *a, **k):
        lm = model(self, role, *a, **k)
        marks.append((role, rss_gb()))
        return lm

    def traced_sync(self, *a, **k):
        sync = weight_sync(self, *a, **k)
        marks.append(("ref_sync_made", rss_gb()))
        return sync

    def traced_engine(*a, **k):
        engine = build_engine(*a, **k)
        marks.append(("engine", rss_gb()))
        return engine

    placement.OneDevice.model, placement.OneDevice.weight_sync, builder.build_engine = \
        traced_model, traced_sync, traced_engine
    parts = builder.build(cfg, paths)
    marks.append(("built", rss_gb()))
    trainer = builder.make_trainer(cfg, parts, MetricsLogger(folder, tensorboard=False, console=False),
                                   Progress(cfg.rl_config.max_steps), folder)
    marks.append(("trainer", rss_gb()))
    policy = list(parts.policy.get_parameters())
    adamw = getattr(trainer.updater.adamw, "whole", trainer.updater.adamw)  # LayerwiseAdamW wraps it
    held = {id(p) for p in policy}
    groups = {
        "policy": _layer_bytes(policy),
        "reference": _layer_bytes(parts.reference.get_parameters()) if parts.reference is not None else 0,
        "engine fused copies": _layer_bytes([p for p in trainer.engine.resident_parameters() if id(p) not in held]),
        "gradient buffers": sum(b.nbytes for b, p in zip(trainer.updater.buffer.bufs, trainer.updater.params)
                                if "layers." in p.name),
        "AdamW m and v": sum(m.nbytes + v.nbytes for m, v, p in zip(adamw.m, adamw.v, trainer.updater.params)
                             if "layers." in p.name),
    }
    conn.send({"marks": marks, "groups": groups, "layer_params": sum(p.size for p in policy if "layers." in p.name),
               "shared": parts.inference is parts.policy})


def _deltas(marks):
    """[(name, rss)] -> {part: GB added}: imports (start), each model, engine, ref sync made + run, trainer."""
    at = dict(marks)
    policy = at["policy"]
    ref = at.get("reference", policy)
    made = at.get("ref_sync_made", at["engine"])
    return {"imports": at["start"], "policy": policy - at["start"], "reference": ref - policy,
            "engine": at["engine"] - ref, "ref_sync": at["built"] - made, "build_rest": made - at["engine"],
            "trainer": at["trainer"] - at["built"]}


def markdown(res: dict) -> str:
    runs = res["runs"]
    ns = sorted(int(n) for n in runs)
    copy = {n: runs[str(n)]["layer_copy_bytes"] for n in ns}
    lines = ["# Where the built trainer's resident memory goes at the Qwen2.5-0.5B shape", "",
             f"Date {res['date']}; machine: {res['machine']}; load average {res['load_average']} at the start. "
             f"Command: `{res['command']}`; library code: {res['code']}.", "",
             f"The issue-20 workload of `benchmarks.step_memory` (switches {res['switches']}), built in a fresh "
             f"process per layer count; resident memory (GB = 10^9 bytes) added by each part of the build. One "
             f"layer's fp32 weights: {copy[ns[0]] / 1e9:.4f} GB.", "",
             "| part | " + " | ".join(f"{n} layers" for n in ns) + " | per layer | in layer copies |",
             "|---|" + "---|" * (len(ns) + 2)]
    for part in PARTS:
        vals = [runs[str(n)]["parts"][part] for n in ns]
        per = (vals[-1] - vals[0]) / (ns[-1] - ns[0]) if len(ns) > 1 else float("nan")
        lines.append(f"| {part} | " + " | ".join(f"{v:.3f}" for v in vals)
                     + f" | {per:.3f} | {per * 1e9 / copy[ns[0]]:.2f} |")
    built = [runs[str(n)]["marks"]["trainer"] for n in ns]
    per = (built[-1] - built[0]) / (ns[-1] - ns[0]) if len(ns) > 1 else float("nan")
    lines.append("| **resident after make_trainer** | " + " | ".join(f"**{v:.3f}**" for v in built)
                 + f" | **{per:.3f}** | **{per * 1e9 / copy[ns[0]]:.2f}** |")
    lines += ["", "Layer tensors each object holds (GB at the largest layer count, and in layer copies):", "",
              "| object | GB | copies |", "|---|---|---|"]
    n = ns[-1]
    for name, b in runs[str(n)]["groups"].items():
        lines.append(f"| {name} | {b / 1e9:.3f} | {b / (copy[n] * n):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--switches", choices=("on", "off"), default="on")
    ap.add_argument("--output", default=os.path.join(RESULTS, "build_memory.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.build_memory", argv), code=code_version(), switches=args.switches, runs={})
    for n in args.layers:  # one fresh process each, one after another
        with tempfile.TemporaryDirectory() as folder, Workers() as workers:
            out = workers.start(side, n, args.switches == "on", folder).recv()
        out["parts"] = _deltas(out["marks"])
        out["marks"] = dict(out["marks"])
        out["layer_copy_bytes"] = 4 * out["layer_params"] // n
        res["runs"][str(n)] = out
        print(n, {k: round(v, 3) for k, v in out["parts"].items()}, flush=True)
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
