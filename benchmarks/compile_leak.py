"""What MindSpore 2.10 keeps of a graph after its cell is gone, and what that makes of `rl_config.release_graphs`
over many steps.

    python -m benchmarks.compile_leak [--cycles 10] [--tiny_steps 20] [--layers 2]

cycles: in this process, each of `--cycles` times: a fresh tiny model (`tiny_qwen2_2layer`, with `--layers`
decoder layers) with a fresh Scorer (its scoring graph) or PolicyUpdater (its update graphs), one call on 8
rows, then everything deleted and collected; the resident memory and the number of Python objects after each
cycle, and whether the model outlived its cycle (a weak reference). A cycle that gave back all it took would
leave all three flat. A third kind, recompile, keeps one model and one Scorer and only drops the scoring
graph's compiled resources (`del_net_res`, as a deleted cell does) so each call compiles it again: what a
compile keeps whether or not its cells are new. The kinds run in that order (recompile, score, update), in
one process: a kind that frees memory (the updates free their models) leaves room that the next one's
allocations reuse, which would hide what those keep (recompile after update stayed flat for 8 cycles). The
first two cycles of each kind are left out of the slopes (MindSpore's one-time set-up).

tiny_steps: `scripts/grpo_one_stage.py` on the tiny default without its warm start for that many GRPO steps
(no validation or checkpoints), with `rl_config.release_graphs` off and on, each in its own process one after
the other; its resident memory read when each step's progress line appears, and the slope over the second
half of the steps. MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
import weakref

import numpy as np

from benchmarks.harness import RESULTS, REPO, code_version, run_stamp, write_results
from mindgrpo.utils.host_memory import status_bytes


def rss_mb(pid: str = "self") -> float:
    """Resident memory of this process (or of a child) in MB = 10^6 bytes."""
    return status_bytes("VmRSS", pid) / 1e6


def slope(values) -> float:
    """Least-squares change per cycle (or step) of `values`."""
    y = np.asarray(values, np.float64)
    return float(np.polyfit(np.arange(len(y)), y, 1)[0]) if len(y) > 1 else float("nan")


def cycles(kind: str, n: int, layers: int) -> dict:
    """n fresh models with a fresh scorer or updater, one call each, all deleted after it; or (recompile)
    one model and scorer, its scoring graph compiled again at every call."""
    import dataclasses

    import mindspore as ms
    from mindspore.graph.api import _cell_graph_executor
    from mindgrpo.grpo.actor import PolicyUpdater, Scorer
    from mindgrpo.grpo.experience import pack
    from mindgrpo.grpo.ms_objective import GRPOLoss
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.presets import resolve_model_config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg = dataclasses.replace(Qwen2Config.load(resolve_model_config("tiny_qwen2_2layer")), num_hidden_layers=layers)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, cfg.vocab_size, 12) for _ in range(8)]
    responses = [rng.integers(1, cfg.vocab_size, 20) for _ in range(8)]
    exp = pack(prompts, responses, rng.standard_normal(8).astype(np.float32))
    rss, objects, alive = [], [], 0
    kept = Scorer(Qwen2ForCausalLM(cfg, seed=0), 8) if kind == "recompile" else None
    for i in range(n):
        if kind == "recompile":  # the same cells; only the compiled graph goes
            kept(exp)
            _cell_graph_executor.del_net_res(kept.graph, set(kept.graph.compile_cache))
            kept.graph.compile_cache.clear()
        else:
            lm = Qwen2ForCausalLM(cfg, seed=i)
            if kind == "score":
                part = Scorer(lm, 8)
                part(exp)
            else:
                part = PolicyUpdater(lm, GRPOLoss(beta=0.0, agg_mode="token-mean"), micro_batch_size=8,
                                     detach_old=True, use_ref=False, beta1=0.9, beta2=0.99, eps=1e-8,
                                     weight_decay=0.0, grad_clip=1.0)
                part.update(exp, lr=1e-3)
            model = weakref.ref(lm)
            del part, lm
            gc.collect()
            alive += model() is not None
        rss.append(rss_mb())
        objects.append(len(gc.get_objects()))
        print(f"{kind} cycle {i + 1}: {rss[-1]:.1f} MB, {objects[-1]} objects", flush=True)
    return {"rss_mb": rss, "objects": objects, "mb_per_cycle": slope(rss[2:]),
            "objects_per_cycle": slope(objects[2:]), "models_alive": None if kind == "recompile" else alive}


def tiny_run(steps: int, release: bool, out: str) -> dict:
    """The tiny default's GRPO steps in a child process; its resident memory at each step's progress line."""
    cmd = [sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir", out,
           "sft_config={steps: 0}", f"rl_config.max_steps={steps}", "rl_config.val_interval=0",
           "rl_config.save_interval=0", "rl_config.completions_interval=0",
           f"rl_config.release_graphs={str(release).lower()}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    at = {}
    for line in proc.stdout:
        m = re.search(r"step (\d+)/\d+ \|", line)
        if m:
            at[int(m.group(1))] = rss_mb(str(proc.pid))
    if proc.wait() != 0:
        raise SystemExit(f"compile_leak: {' '.join(cmd)} failed with {proc.returncode}")
    rss = [at[k] for k in sorted(at)]
    return {"rss_mb": rss, "mb_per_step": slope(rss[len(rss) // 2:])}


def markdown(res: dict) -> str:
    out = ["# What MindSpore 2.10 keeps of a released graph", "", f"Command: `{res['command']}`", "",
           f"Date {res['date']}. Machine: {res['machine']}; load average {res['load_average']} at the start. "
           f"Code: {res['code']}. MB = 10^6 bytes.", ""]
    if res.get("cycles"):
        out += [f"A fresh `tiny_qwen2_2layer` model ({res.get('layers', 2)} decoder layers) with a fresh scorer or "
                "updater, one call on 8 rows, all deleted and collected, again and again; recompile: one model and "
                "scorer, its scoring graph's compiled resources dropped after each call (slope over cycles 3 on):", "",
                "| part | resident after each cycle (MB) | kept per cycle (MB) | Python objects per cycle | "
                "models still alive after their cycle |", "|---|---|---|---|---|"]
        out += [f"| {k} | {', '.join(f'{v:.0f}' for v in r['rss_mb'])} | {r['mb_per_cycle']:.1f} | "
                f"{r['objects_per_cycle']:.0f} | "
                + ("(one model throughout)" if r["models_alive"] is None
                   else f"{r['models_alive']} of {len(r['rss_mb'])}")
                + " |"
                for k, r in res["cycles"].items()]
        out.append("")
    if res.get("tiny"):
        out += ["The tiny default without its warm start, resident memory at each GRPO step's progress line "
                "(slope over the second half):", "", "| release_graphs | resident at steps 1, 2, ... (MB) | per step (MB) |",
                "|---|---|---|"]
        out += [f"| {k} | {', '.join(f'{v:.0f}' for v in r['rss_mb'])} | {r['mb_per_step']:.1f} |"
                for k, r in res["tiny"].items()]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10, help="cycles of each part (0: none)")
    ap.add_argument("--tiny_steps", type=int, default=20, help="GRPO steps of each tiny run (0: none)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the cycles' model")
    ap.add_argument("--out", default=os.path.join(RESULTS, "compile_leak.json"))
    args = ap.parse_args(argv)
    res = {**run_stamp("benchmarks.compile_leak", argv), "code": code_version(), "layers": args.layers}
    if args.cycles:
        res["cycles"] = {kind: cycles(kind, args.cycles, args.layers) for kind in ("recompile", "score", "update")}
    if args.tiny_steps:
        with tempfile.TemporaryDirectory(prefix="compile_leak_") as root:
            res["tiny"] = {str(r).lower(): tiny_run(args.tiny_steps, r, os.path.join(root, str(r)))
                           for r in (False, True)}
    write_results(args.out, res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
