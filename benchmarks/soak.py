"""Resident memory over a long run: `scripts/grpo_one_stage.py` for N GRPO steps, the memory at each step's end.

    python -m benchmarks.soak [--steps 200] [--shapes tiny tiny_release_graphs 0_5b_2_layers] [--growth 0.03] [--output PATH]

Shapes (each one run of the real command line, in a child process; the memory from the run's own metrics.jsonl,
`memory/host_resident_bytes`, which every process of the run appends to):
- `tiny`: the tiny default as shipped (the memory setting `auto`), no warm start, no validation, no sample logging.
- `tiny_release_graphs`: the same with rl_config.release_graphs=true, which compiles the step's graphs again every
  step (MindSpore keeps a few MB of each: the process grows, and the trainer continues in fresh processes).
- `0_5b_2_layers`: the 0.5B recipe (model_configs/qwen_grpo/qwen2_5_0_5b) at 2 decoder layers (random weights, the
  synthetic task and its tokenizer instead of GSM8K), the four memory savers on (release_graphs and the three
  layerwise switches), cut to 2 prompts x 4 samples of up to 32 new tokens a step: at the recipe's 4 x 4 x 128 a
  step took ~50 s here (200 steps ~2.8 h); the graphs compiled and released each step, where the growth came from,
  are the same at either size. A random model never answers the task: with every group's rewards equal the
  advantages, the gradients and the KL would all be 0 and the weights would not move (the update still runs); the
  shape adds a reward drawn at random for each completion (a plugin written beside the run), so that the updates
  change the weights and the optimizer's moments as in a real run. The results count the steps whose groups all
  had equal rewards anyway.

Each with rl_config.restart_on_memory_growth = --growth (mindgrpo/grpo/recycle.py: past it the trainer saves a
checkpoint and continues in a fresh process, the same run). Reported per shape: the resident memory at steps 1..N,
the fresh processes the run took, whether every step 1..N was logged exactly once (no step lost or run twice), and
the goal: the resident memory at step N within 3% of step 20 (step N's against step min(20, N / 2) on shorter runs).
GB = 10^9 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from benchmarks.harness import RESULTS, REPO, code_version, run_stamp, stamp_lines, write_results

SCRIPT = os.path.join(REPO, "scripts", "grpo_one_stage.py")
SHAPES = ("tiny", "tiny_release_graphs", "0_5b_2_layers")
# a reward drawn at random: the 0.5B shape's groups always have a spread, so its updates move the weights
SPREAD_PLUGIN = """import random

from mindgrpo.rewards import register_reward


@register_reward("random_score")
def random_score(completions, **_):
    return [random.random() for _ in completions]
"""
QUIET = ["sft_config={steps: 0}", "rl_config.val_interval=0", "rl_config.completions_interval=0",
         "rl_config.save_interval=0"]


def _two_layer_model(folder: str) -> str:
    from mindgrpo.models.presets import resolve_model_config

    with open(resolve_model_config("qwen2_5_0_5b"), encoding="utf-8") as f:
        text = f.read().replace("num_hidden_layers: 24", "num_hidden_layers: 2")
    path = os.path.join(folder, "qwen2_5_0_5b_2_layers.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def command(shape: str, steps: int, growth: float, folder: str) -> list:
    args = [sys.executable, SCRIPT, "--output_dir", os.path.join(folder, "run"), *QUIET,
            f"rl_config.max_steps={steps}", f"rl_config.restart_on_memory_growth={growth}"]
    if shape == "tiny":
        return args
    args.append("rl_config.release_graphs=true")
    if shape == "tiny_release_graphs":
        return args
    recipe = os.path.join(REPO, "model_configs", "qwen_grpo", "qwen2_5_0_5b", "grpo_config.yaml")
    plugin = os.path.join(folder, "spread_reward.py")
    with open(plugin, "w", encoding="utf-8") as f:
        f.write(SPREAD_PLUGIN)
    return args + ["--config", recipe, f"reward_config.reward_plugin={plugin}",
                   "reward_config.verifier_function=[accuracy, format, random_score]",
                   "reward_config.verifier_weight=[1.0, 0.5, 1.0]", f"actor_config.model={_two_layer_model(folder)}",
                   "generate_config.max_tokens=32", "rl_config.batch_size=2", "actor_config.layerwise_update=true",
                   "ref_config.layerwise=true", "generate_config.layerwise=true"]


def soak(shape: str, steps: int, growth: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="soak_") as folder:
        cmd = command(shape, steps, growth, folder)
        log = os.path.join(folder, "console.log")
        with open(log, "w") as out:
            rc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
        text = open(log, encoding="utf-8", errors="replace").read()
        if rc != 0:
            raise SystemExit(f"soak: {shape} failed ({rc}):\n" + text[-3000:])
        rows = [json.loads(line) for line in open(os.path.join(folder, "run", "metrics.jsonl"), encoding="utf-8")]
    logged = [r["step"] for r in rows if "memory/host_resident_bytes" in r]
    rss = {r["step"]: r["memory/host_resident_bytes"] / 1e9 for r in rows if "memory/host_resident_bytes" in r}
    ref = min(20, max(1, steps // 2))
    return {"steps": steps, "rss_gb": [rss[k] for k in sorted(rss)], "reference_step": ref,
            "restarts": len(re.findall(r"continuing in a fresh process", text)),
            "steps_with_equal_rewards": len(re.findall(r"every group's rewards are equal", text)),
            "every_step_once": sorted(logged) == list(range(1, steps + 1)),
            "growth_at_end": rss[steps] / rss[ref] - 1, "within_3_percent": rss[steps] <= 1.03 * rss[ref],
            "command": " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd[1:])}


def markdown(res: dict) -> str:
    lines = ["# Resident memory over a long run (benchmarks/soak.py)", "", *stamp_lines(res),
             f"rl_config.restart_on_memory_growth = {res['growth']}: past it the trainer saves a checkpoint and continues "
             "in a fresh process. GB = 10^9 bytes.", "",
             "| shape | steps | resident at step ref / N (GB) | change | peak of the first / last ref steps (GB) | "
             "fresh processes | steps with all rewards equal | every step logged once |",
             "|---|---|---|---|---|---|---|---|"]
    for shape, r in res["shapes"].items():
        ref, rss = r["reference_step"], r["rss_gb"]
        lines.append(f"| {shape} | {r['steps']} | {rss[ref - 1]:.3f} (step {ref}) / {rss[-1]:.3f} | "
                     f"{r['growth_at_end']:+.1%} | {max(rss[:ref]):.3f} / {max(rss[-ref:]):.3f} | {r['restarts']} | "
                     f"{r.get('steps_with_equal_rewards', '-')} | {'yes' if r['every_step_once'] else 'NO'} |")
    lines += ["", "With restarts the memory is a sawtooth (a fresh process starts lower than its second step, its "
              "reference): the peaks of the first and the last steps compare like with like; two single steps may fall "
              "on different points of a tooth.", ""]
    for shape, r in res["shapes"].items():
        lines += [f"{shape}, resident memory at each step (GB): " + ", ".join(f"{v:.3f}" for v in r["rss_gb"]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    ap.add_argument("--growth", type=float, default=0.03, help="rl_config.restart_on_memory_growth")
    ap.add_argument("--output", default=os.path.join(RESULTS, "soak.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.soak", argv), code=code_version(), growth=args.growth, shapes={})
    for shape in args.shapes:
        res["shapes"][shape] = soak(shape, args.steps, args.growth)
        print(json.dumps({shape: {k: v for k, v in res["shapes"][shape].items() if k != "rss_gb"}}), flush=True)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
