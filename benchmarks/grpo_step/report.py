"""The markdown table, bar chart and scaling plot of the GRPO step benchmark, from its JSON."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

PHASES = ("generation", "reference", "old_logprobs", "update", "sync", "other")


def scaling_sentence(s: dict) -> str:
    """How the step time grew along each axis of the sweep, as exponents of a power law."""
    def growth(axis: str, what: str, unit: Callable[[float], str]) -> str:
        a, b = s[axis][0], s[axis][-1]
        x, y = b["value"] / a["value"], b["step_s"] / a["step_s"]
        e = math.log(y) / math.log(x)
        kind = "about linearly" if 0.85 <= e <= 1.15 else "sub-linearly" if e < 0.85 else "super-linearly"
        top = max(PHASES, key=lambda p: b[f"{p}_s"])
        return (f"{kind} in {what}: {x:.1f}x ({unit(a['value'])} -> {unit(b['value'])}) took {y:.2f}x the step time "
                f"(exponent {e:.2f}; largest phase at the top: {top}, {b[f'{top}_s'] / b['step_s']:.0%})")

    small, big = s["model_size"][0], s["model_size"][-1]
    body = f"; {big['body_params'] / small['body_params']:.1f}x without the embedding" if "body_params" in big else ""
    parts = [growth("response_length", "response length", lambda v: f"{v:.0f} tokens"),
             growth("group_size", "group size", lambda v: f"G={v:.0f}"),
             growth("model_size", "parameters", lambda v: f"{v / 1e6:.0f} M" + (body if v == big["value"] else ""))]
    return "Cost grows " + "; ".join(parts) + "."


def markdown(res: dict) -> str:
    lines = ["# One GRPO step: mindgrpo against TRL's GRPOTrainer (CPU)", "",
             f"Date {res['date']}; machine: {res['machine']}; {res['versions']}; load average {res['load_average']}",
             "(other jobs share this machine: compare the two sides of one run, not runs with each other).", "",
             f"Command (from the repo root): `{res['command']}`; library code: {res['code']}.", "", res["settings"], ""]
    if res.get("configs"):
        lines += ["| config | params | mindgrpo s/step | TRL s/step | TRL / mindgrpo | mindgrpo tok/s | TRL tok/s | "
                  "update GFLOP/s mindgrpo (% of MindSpore's matmul peak) | update GFLOP/s TRL (% of PyTorch's) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, c in res["configs"].items():
            lines.append(
                f"| {name} | {c['params'] / 1e6:.1f} M | {c['mindgrpo_step_s']:.2f} | {c['trl_step_s']:.2f} | "
                f"{c['speedup']:.2f}x | {c['mindgrpo_tokens_per_s']:.0f} | {c['trl_tokens_per_s']:.0f} | "
                f"{c['mindgrpo_update_gflops_per_s']:.1f} ({c['mindgrpo_update_pct_of_mindspore_peak']:.0f}%) | "
                f"{c['trl_update_gflops_per_s']:.1f} ({c['trl_update_pct_of_torch_peak']:.0f}%) |")
        for name, c in res["configs"].items():
            lines += ["", f"## {name}: seconds per phase (median)", "",
                      f"Prompt tokens {c['prompt_tokens']}, {c['generated_tokens']} generated tokens per step, "
                      f"tokenizer: {c['tokenizer']}; update: {c['update_gflop']:.1f} GFLOP of useful work. "
                      f"First (warm-up) step: mindgrpo {c['mindgrpo_first_step_s']:.1f} s (includes compiling), "
                      f"TRL {c['trl_first_step_s']:.1f} s. Peak memory (RSS): "
                      f"mindgrpo {c['mindgrpo_peak_rss_gb']:.1f} GB, "
                      f"TRL {c['trl_peak_rss_gb']:.1f} GB. TRL ran with {c.get('trl_torch_threads', '?')} PyTorch "
                      "threads.", "",
                      "fp32 matmul GFLOP/s, each side right after each of its steps (median; peak = the best shape): "
                      + "; ".join(f"{fw}: " + ", ".join(f"{k} {v:.1f}" for k, v in c[f"{fw}_matmul_gflops"].items())
                                  for fw in ("mindspore", "torch")), "",
                      "| phase | mindgrpo | TRL | TRL / mindgrpo |", "|---|---|---|---|"]
            for p in PHASES + ("step",):
                a, b = c[f"mindgrpo_{p}_s"], c[f"trl_{p}_s"]
                ratio = f"{b / a:.2f}x" if a > 1e-4 and b > 1e-4 else "-"
                lines.append(f"| {p} | {a:.3f} | {b:.3f} | {ratio} |")
            lines.append(f"| generation tok/s | {c['mindgrpo_generation_tokens_per_s']:.0f} | "
                         f"{c['trl_generation_tokens_per_s']:.0f} | |")
        lines += ["", "Phases: generation = rollout (TRL: `_generate_single_turn`); reference = reference-model "
                  "log-probs; old_logprobs = the policy's old log-probs (neither side needs them with one update "
                  "per batch); update = loss, backward, clip and AdamW; sync = policy -> inference weight copy "
                  "(TRL generates with the trained model itself); other = the rest of the step (reward, "
                  "advantages, packing, decoding).", "", f"![bar chart]({res['png']})"]
    sc = res.get("scaling")
    if sc:
        lines += ["", f"## Scaling (mindgrpo only, {sc['base']} shape)", "",
                  f"Date {sc['date']}, load average {sc['load_average']}; command: `{sc['command']}`; library code: "
                  f"{sc['code']}. {sc['settings']}", "", sc["summary"], "",
                  "| axis | params | new tokens | G | micro-batch | s/step | generation | reference | update | sync | "
                  "other | tok/s | peak RSS GB | load avg |", "|" + "---|" * 14]
        for axis in ("response_length", "group_size", "model_size"):
            for r in sc[axis]:
                lines.append(
                    f"| {axis} | {r['params'] / 1e6:.1f} M | {r['new_tokens']} | {r['group_size']} | "
                    f"{r['micro_batch']} | "
                    f"{r['step_s']:.2f} | {r['generation_s']:.2f} | {r['reference_s']:.2f} | {r['update_s']:.2f} | "
                    f"{r['sync_s']:.3f} | {r['other_s']:.2f} | {r['tokens_per_s']:.0f} | {r['peak_rss_gb']:.1f} | "
                    f"{r['load_average_1min']:.1f} |")
        lines += ["", f"![scaling]({res['scaling_png']})"]
    return "\n".join(lines) + "\n"


def plot_compare(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["configs"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 3.6), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, name in zip(axes[0], names):
        c = res["configs"][name]
        for row, side in enumerate(("trl", "mindgrpo")):
            left = 0.0
            for k, p in enumerate(PHASES):
                w = c[f"{side}_{p}_s"]
                ax.barh(row, w, left=left, color=colors[k], label=p if row == 0 else None)
                left += w
            ax.text(left, row, f" {c[f'{side}_step_s']:.2f} s", va="center")
        ax.set_yticks([0, 1], ["TRL", "mindgrpo"])
        ax.set_xlim(0, 1.2 * max(c["trl_step_s"], c["mindgrpo_step_s"]))
        ax.set_xlabel("seconds per GRPO step (median)")
        ax.set_title(f"{name}: mindgrpo {c['speedup']:.2f}x faster" if c["speedup"] >= 1
                     else f"{name}: mindgrpo {1 / c['speedup']:.2f}x slower")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(PHASES), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scaling(sc: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    colors = plt.get_cmap("tab10").colors
    for ax, axis, label in zip(axes, ("response_length", "group_size", "model_size"),
                               ("response tokens", "group size G", "parameters")):
        rows = sc[axis]
        ticks = [f"{r['params'] / 1e6:.1f} M\nH={r['hidden_size']}, {r['layers']} layers" if axis == "model_size"
                 else str(r["value"]) for r in rows]
        bottom = np.zeros(len(rows))
        for k, p in enumerate(PHASES):
            h = np.array([r[f"{p}_s"] for r in rows])
            ax.bar(ticks, h, bottom=bottom, color=colors[k], label=p)
            bottom += h
        ax.set_xlabel(label)
        ax.set_ylabel("seconds per step")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(PHASES), fontsize=8)
    fig.suptitle(f"mindgrpo GRPO step scaling ({sc['base']} shape)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
