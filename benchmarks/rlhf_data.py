"""Time data_tools/rlhf_data.py on the full GSM8K train set (7,473 rows) from <repo>/../shared.

    python -m benchmarks.rlhf_data [--repeats 3]

Reports the end-to-end command (a fresh process: imports, tokenizer load, reading, templating, tokenizing,
writing) and, in-process, each stage, with batched `encode_batch` against a one-text-at-a-time `encode` loop
as the peer. Requirement: the command converts the train set in under 20 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import REPO, SHARED, alternate, timed

QWEN_DIR = Path(SHARED) / "tokenizers" / "qwen2_5"
TRAIN = Path(SHARED) / "data" / "gsm8k" / "train.jsonl"


def run_command(out_path: str) -> float:
    args = [
        sys.executable, "-m", "data_tools.rlhf_data",
        "--vocab_path", str(QWEN_DIR / "vocab.json"),
        "--merges_file_path", str(QWEN_DIR / "merges.txt"),
        "--tokenizer_config", str(QWEN_DIR / "tokenizer_config.json"),
        "--file_path", str(TRAIN),
        "--output_path", out_path,
        "--overwrite",
    ]
    env = dict(os.environ, PYTHONPATH=REPO)
    seconds, result = timed(lambda: subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO), 1)
    if result.returncode != 0:
        raise SystemExit(f"rlhf_data.py failed:\n{result.stderr}")
    return seconds


def stages(out_path: str) -> dict:
    from mindgrpo.data.mindrecord import write_prompt_dataset
    from mindgrpo.data.questions import read_rows
    from mindgrpo.data.templates import render_prompt
    from mindgrpo.data.tokenizer import QwenTokenizer

    t = {}
    t["load tokenizer"], tok = timed(
        lambda: QwenTokenizer.from_files(
            str(QWEN_DIR / "vocab.json"), str(QWEN_DIR / "merges.txt"), str(QWEN_DIR / "tokenizer_config.json")
        ), 1
    )
    t["read + validate jsonl"], read = timed(lambda: read_rows(str(TRAIN), "gsm8k", {}, False, None), 1)
    prompts = [render_prompt("qwen_r1", r.question) for r in read.rows]
    # alternate, best of three: both share the tokenizer's word cache
    runs = alternate({"batch": lambda: tok.encode_batch(prompts), "loop": lambda: [tok.encode(p) for p in prompts]}, 3)
    if tok.encode_batch(prompts) != [tok.encode(p) for p in prompts]:
        raise SystemExit("encode_batch and the encode loop disagree")
    t["encode_batch (all prompts, best of 3)"] = min(runs["batch"])
    t["encode loop (peer, best of 3)"] = min(runs["loop"])
    t["template + encode + write MindRecord"], _ = timed(
        lambda: write_prompt_dataset(out_path, read.rows, tok, overwrite=True), 1
    )
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not TRAIN.is_file() or not (QWEN_DIR / "vocab.json").is_file():
        print(f"needs GSM8K and the Qwen2.5 tokenizer under {SHARED}", file=sys.stderr)
        return 1
    rows = sum(1 for line in TRAIN.open(encoding="utf-8") if line.strip())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gsm8k_train.mindrecord")
        command = [run_command(out) for _ in range(args.repeats)]
        stage_times = stages(out)
    median = statistics.median(command)
    print(f"GSM8K train: {rows} rows, {os.cpu_count()} CPU cores, python {sys.version.split()[0]}")
    print(f"command end to end: median {median:.2f} s of {args.repeats} ({', '.join(f'{s:.2f}' for s in command)}) "
          f"-> {rows / median:,.0f} rows/s (limit 20 s)")
    for name, seconds in stage_times.items():
        print(f"  {name:<42} {seconds:7.3f} s  {rows / seconds:>10,.0f} rows/s")
    ratio = stage_times["encode loop (peer, best of 3)"] / stage_times["encode_batch (all prompts, best of 3)"]
    print(f"encode_batch is {ratio:.1f}x the speed of the one-at-a-time loop")
    return 0 if median < 20 else 1


if __name__ == "__main__":
    sys.exit(main())
