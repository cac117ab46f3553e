"""The README's performance table, generated from the results files (benchmarks/results/*.json):

    python -m benchmarks.readme_table            # print the table
    python -m benchmarks.readme_table --write    # replace the table in README.md (between its two markers)

One row per claim: what is measured, the command that measures it (and its results file), mindgrpo's figure,
the peer's figure from the same run, and their ratio. Run it after a benchmark writes new results; the test
tests/benchmarks/test_readme_table.py fails while the README's table differs from this output, and checks
every figure in it against the results file its row names.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Callable, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
README = os.path.join(REPO, "README.md")
BEGIN = "<!-- performance table: python -m benchmarks.readme_table --write -->"
END = "<!-- end of the performance table -->"


@dataclass(frozen=True)
class Row:
    what: str
    command: str
    results: str  # the file under benchmarks/results/, without .json
    figures: Callable[[dict], Tuple[float, float]]  # (mindgrpo's, the peer's)
    unit: str
    digits: int
    peer: str
    ratio: str  # "time": the peer's / ours, as fast; "rate": ours / the peer's, as fast; "share": ours / the peer's


def _step_rows(what: str, command: str, results: str, peak_what: str) -> List[Row]:
    """The two rows of a `benchmarks.step_memory` run against TRL: the last step's seconds, the process peaks."""
    return [Row(what, command, results, lambda r: (r["steps"][-1]["step_s"], r["trl"]["steps"][-1]["phases"]["step"]),
                "s per step", 1, "TRL's GRPOTrainer", "time"),
            Row(peak_what, "(the same run)", results, lambda r: (r["process_peak_gb"], r["trl"]["process_peak_gb"]),
                "GB", 2, "TRL's GRPOTrainer", "share")]


ROWS: List[Row] = [
    *_step_rows("one GRPO step at the Qwen2.5-0.5B shape (24 layers, random weights; 4 GSM8K prompts x 4 samples x "
                "128 tokens, beta 0.04), the memory switches on, 2 cores of an AMD EPYC (Zen 4) with AVX-512",
                "python -m benchmarks.step_memory --layers 24 --steps 2 --sides ours trl "
                "--output benchmarks/results/step_memory_24_layers_amd.json", "step_memory_24_layers_amd",
                "peak resident memory of that step"),
    *_step_rows("the same step on 2 cores of an AMD EPYC (Zen 2) with AVX2 and no AVX-512",
                "python -m benchmarks.step_memory --layers 24 --steps 2 --sides ours trl "
                "--output benchmarks/results/step_memory_24_layers_amd_zen2.json", "step_memory_24_layers_amd_zen2",
                "peak resident memory of that step on the Zen 2"),
    *_step_rows("the same step on 2 cores of an Intel Xeon with AVX-512 and AMX, where PyTorch's fp32 matmul outruns "
                "MindSpore's (docs/cpu_kernels.md, \"Intel Xeon\")",
                "python -m benchmarks.step_memory --layers 24 --steps 2 --sides ours trl "
                "--output benchmarks/results/step_memory_24_layers_intel.json", "step_memory_24_layers_intel",
                "peak resident memory of that step on the Intel Xeon"),
    *_step_rows("that step on the Intel Xeon with each prompt's samples scored as one run (`actor_config.shared_prefix`)",
                "python -m benchmarks.step_memory --layers 24 --steps 2 --sides ours trl "
                "--output benchmarks/results/step_memory_24_layers_intel_shared_prefix.json "
                "--set actor_config.packing=true actor_config.max_tokens_per_micro_batch=672 "
                "actor_config.shared_prefix=true", "step_memory_24_layers_intel_shared_prefix",
                "peak resident memory of that shared-prefix step"),
    Row("one GRPO step with LoRA rank 16 on all seven projections, the same work, the three layerwise switches on, "
        "no layer of the update recomputing, each prompt's samples scored as one run (`actor_config.shared_prefix`)",
        "python -m benchmarks.lora_step --layers 24 --steps 2 --sides lora trl_lora full "
        "--set actor_config.recompute_num_layers=0 actor_config.packing=true "
        "actor_config.max_tokens_per_micro_batch=672 actor_config.shared_prefix=true", "lora_step_24_layers",
        lambda r: (r["sides"]["lora"]["steps"][-1]["step_s"], r["sides"]["trl_lora"]["steps"][-1]["phases"]["step"]),
        "s per step", 1, "TRL's GRPOTrainer + PEFT", "time"),
    Row("peak resident memory of that LoRA step", "(the same run)", "lora_step_24_layers",
        lambda r: (r["sides"]["lora"]["process_peak_gb"], r["sides"]["trl_lora"]["process_peak_gb"]), "GB", 2,
        "TRL's GRPOTrainer + PEFT", "share"),
    Row("LoRA's weight sync (the adapters) against the full-weight sync, the same model and process, a run's buckets",
        "python -m benchmarks.lora_step --layers 24 --steps 0 --sides lora full", "lora_sync_24_layers",
        lambda r: (r["sides"]["lora"]["sync"]["adapters"]["seconds"], r["sides"]["lora"]["sync"]["full"]["seconds"]),
        "s", 4, "every weight", "time"),  # 4 digits: 0.0176 s (3 would show 0.018 and a 34.5x ratio for 35.3x)
    Row("one GRPO step on a 43 M Qwen2 model with Qwen2.5's vocabulary (4 prompts x 4 samples x 64 tokens)",
        "python -m benchmarks.grpo_step", "grpo_step",
        lambda r: (r["configs"]["tiny-qwen-vocab"]["mindgrpo_step_s"], r["configs"]["tiny-qwen-vocab"]["trl_step_s"]),
        "s per step", 2, "TRL's GRPOTrainer", "time"),
    Row("rollout of 64 prompts x 8 samples, long-tailed lengths up to 512 tokens, Qwen2.5's vocabulary",
        "python -m benchmarks.rollout --configs tiny-qwen-vocab --workloads longtail --sides engine transformers "
        "--output benchmarks/results/rollout_qwen_vocab_longtail_transformers.json",
        "rollout_qwen_vocab_longtail_transformers",
        lambda r: (r["configs"]["tiny-qwen-vocab"]["longtail"]["engine_tokens_per_s"],
                   r["configs"]["tiny-qwen-vocab"]["longtail"]["transformers_tokens_per_s"]),
        "useful tokens/s", 1, "transformers' generate", "rate"),
    Row("the same rollout, a 4,096-token vocabulary", "python -m benchmarks.rollout --configs tiny-small-vocab "
        "--sides engine static --output benchmarks/results/rollout.json", "rollout",
        lambda r: (r["configs"]["tiny-small-vocab"]["longtail"]["engine_tokens_per_s"],
                   r["configs"]["tiny-small-vocab"]["longtail"]["static_tokens_per_s"]),
        "useful tokens/s", 0, "a static batch", "rate"),
    Row("multi-turn rollout of 64 prompts of 180-260 tokens (a system turn with the tools' definitions) x 8 "
        "conversations with up to 4 tool calls each (a 50 ms tool), a 4-layer hidden-256 model: continuation in the "
        "KV cache", "python -m benchmarks.rollout --workloads multiturn "
        "--configs tiny-small-vocab --max_tokens 128", "rollout_multiturn_small_vocab",
        lambda r: (r["configs"]["tiny-small-vocab"]["cache_tokens_per_s"],
                   r["configs"]["tiny-small-vocab"]["reprefill_tokens_per_s"]),
        "useful tokens/s", 0, "re-prefilling each turn's history", "rate"),
    Row("asynchronous GRPO on 2 ranks of one core: separate placement, one step off-policy, partial rollouts; 4 "
        "prompts x 8 long-tailed samples of up to 256 tokens, tiny_qwen2", "python -m benchmarks.async_rollout",
        "async_rollout", lambda r: (r["async_step_s"], r["sync_step_s"]), "s per step", 2,
        "the synchronous colocated step (dp 2)", "time"),
    Row("reference + update of 32 long-tailed samples (mean 165, max 512 tokens), packed rows "
        "(`actor_config.packing`)", "python -m benchmarks.packing", "update",
        lambda r: (r["configs"]["tiny-qwen-vocab"]["longtail"]["packed_s"],
                   r["configs"]["tiny-qwen-vocab"]["longtail"]["padded_s"]), "s", 1, "padded rows", "time"),
    Row("resident memory after the first rollout at the Qwen2.5-0.5B shape (24 layers), layer graphs "
        "(`generate_config.layerwise`)", "python -m benchmarks.layerwise_generate --layers 2 24 --groups 4",
        "layerwise_generate",
        lambda r: (r["memory"]["24"]["layers of 4"]["first"]["peak_gb"], r["memory"]["24"]["whole"]["first"]["peak_gb"]),
        "GB", 2, "whole-model graphs", "share"),
    Row("the update's arithmetic rate, against MindSpore's fp32 matmul peak in the same run",
        "python -m benchmarks.update_profile --steps 7", "update_profile",
        lambda r: (r["result"]["update_gflops_per_s"], r["result"]["matmul_gflops"]["peak"]), "GFLOP/s", 1,
        "matmul peak", "share"),
    Row("scoring 256 completions of 100-1,000 tokens (after prompts of 32-128) with a Qwen2.5-0.5B-shaped reward "
        "model cut to 2 layers, packed rows",
        "python -m benchmarks.reward_model --layers 2 --count 256 --micro 8 --max_tokens 8192",
        "reward_model", lambda r: (r["sides"]["packed"]["tokens_per_s"], r["sides"]["transformers"]["tokens_per_s"]),
        "tokens/s", 0, "transformers' Qwen2ForSequenceClassification", "rate"),
    Row("crash-safe checkpoint save (fsync, SHA-256, manifest) of a 1 GB policy with its optimizer",
        "python -m benchmarks.checkpoint_save --gb 1.0 --rounds 3", "checkpoint_save",
        lambda r: (r["median_s"]["new save"], r["median_s"]["old save"]), "s", 1, "a plain save", "share"),
]


RATIOS = {"time": lambda ours, peer: f"{peer / ours:.2f}x as fast",
          "rate": lambda ours, peer: f"{ours / peer:.2f}x as fast",
          "share": lambda ours, peer: f"{ours / peer:.2f}x the peer's"}


def load(name: str) -> dict:
    with open(os.path.join(RESULTS, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


def row_cells(row: Row) -> List[str]:
    ours, peer = row.figures(load(row.results))
    ours, peer = round(ours, row.digits), round(peer, row.digits)  # the ratio of the figures as shown
    link = f"[results](benchmarks/results/{row.results}.md)"
    return [row.what, f"`{row.command}` {link}" if row.command.startswith("python") else f"{row.command} {link}",
            f"{ours:.{row.digits}f} {row.unit}", f"{peer:.{row.digits}f} ({row.peer})", RATIOS[row.ratio](ours, peer)]


def table() -> str:
    lines = ["| what | command | mindgrpo | peer, same run | ratio |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in ROWS]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{README}: needs one '{BEGIN}' line, then one '{END}' line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = ap.parse_args(argv)
    block = table()
    if not args.write:
        print(block)
        return
    with open(README, encoding="utf-8") as f:
        text = f.read()
    new = replace_block(text, block)
    tmp = README + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, README)


if __name__ == "__main__":
    main()
