"""Convert a GSM8K- or MATH-style .jsonl/.json file into a prompt MindRecord for GRPO.

    python data_tools/rlhf_data.py --vocab_path vocab.json --merges_file_path merges.txt \
        --file_path train.jsonl --output_path gsm8k_train.mindrecord [--template qwen_r1] [--max_prompt_length 512]

Input rows are JSON objects. The dataset type says where the question, the full reference solution and the
final answer are:
    gsm8k  question, answer            final answer after the last '####' of answer
    math   problem, solution           final answer in the last \\boxed{} of solution
    auto   gsm8k if the first row has question/answer, math if it has problem/solution
--tools calculator,python writes prompts with those tools' definitions in the system turn, rendered by the model's
own chat template (--chat_template tokenizer_config.json, default --tokenizer_config) with the system message of
--template; --tool_plugin FILE registers more tools first.
--map_keys question=FIELD,answer=FIELD[,solution=FIELD] renames the fields (solution=FIELD: a field that holds
the final answer itself). Output columns: see mindgrpo/data/mindrecord.py (prompt_ids, prompt_length, prompt,
solution, answer). A bad row stops the run with `FILE:LINE: problem` on stderr and exit code 1, leaving nothing
at the output path; --skip_invalid skips and counts bad rows instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Optional

from mindgrpo.data.mindrecord import check_output_free, write_prompt_dataset
from mindgrpo.data.questions import ROLES, InputError, read_rows
from mindgrpo.data.templates import TEMPLATES, ChatTemplateError, chat_prompt_template, get_template
from mindgrpo.data.tokenizer import QwenTokenizer


class Progress:
    """A plain stderr progress line; redrawn in place on a terminal, one line per update otherwise."""

    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label = total, label
        self.stream = sys.stderr if stream is None else stream
        self.start = time.perf_counter()
        self.tty = self.stream.isatty()

    def __call__(self, done: int) -> None:
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(24 * frac)
        rate = done / max(time.perf_counter() - self.start, 1e-9)
        line = f"{self.label} [{bar:<24}] {done}/{self.total} ({rate:,.0f} rows/s)"
        end = "" if self.tty and done < self.total else "\n"
        self.stream.write(("\r" if self.tty else "") + line + end)
        self.stream.flush()


def parse_key_map(text: Optional[str]) -> Dict[str, str]:
    if not text:
        return {}
    mapping = {}
    for item in text.split(","):
        role, sep, key = item.partition("=")
        role, key = role.strip(), key.strip()
        if not sep or role not in ROLES or not key:
            raise argparse.ArgumentTypeError(f"bad --map_keys item {item!r}; expected ROLE=FIELD with ROLE in {ROLES}")
        mapping[role] = key
    return mapping


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab_path", required=True, help="Qwen2 vocab.json")
    p.add_argument("--merges_file_path", required=True, help="Qwen2 merges.txt")
    p.add_argument("--tokenizer_config", default=None, help="tokenizer_config.json (added tokens, eos/pad); "
                   "without it <|endoftext|>, <|im_start|>, <|im_end|> follow the vocabulary")
    p.add_argument("--file_path", required=True, help="input .jsonl (one object per line) or .json (a list)")
    p.add_argument("--output_path", required=True, help="output MindRecord file (its index is OUTPUT.db)")
    p.add_argument("--template", default="qwen_r1", choices=TEMPLATES.names())
    p.add_argument("--max_prompt_length", type=int, default=512)
    p.add_argument("--dataset_type", default="gsm8k", choices=["gsm8k", "math", "auto"])
    p.add_argument("--tools", default=None, help="comma-separated tool names (calculator, python, a plugin's): "
                   "their definitions go into the system turn, rendered by the chat template")
    p.add_argument("--tool_plugin", default=None, help="a Python file whose @register_tool functions add tools")
    p.add_argument("--chat_template", default=None, help="tokenizer_config.json whose chat_template renders the "
                   "prompts with --tools (default: --tokenizer_config)")
    p.add_argument("--map_keys", type=parse_key_map, default={}, help="question=FIELD,answer=FIELD[,solution=FIELD]")
    p.add_argument("--truncate", choices=["left", "right"], default=None,
                   help="cut the question of an over-long prompt from this side, keeping the template whole "
                   "(default: drop such prompts and count them)")
    p.add_argument("--skip_invalid", action="store_true", help="skip and count bad rows instead of stopping")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--limit", type=int, default=None, help="convert only the first N valid rows")
    return p


def tool_template(args):
    """The chat template's one-question prompt with the tools of --tools in its system turn."""
    from mindgrpo.tools import load_tool_plugin, tool_schema

    if args.tool_plugin:
        load_tool_plugin(args.tool_plugin)
    names = [n.strip() for n in args.tools.split(",") if n.strip()]
    return chat_prompt_template(args.chat_template or args.tokenizer_config, get_template(args.template).system,
                                [tool_schema(n) for n in names])


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_prompt_length <= 0:
        parser.error("--max_prompt_length must be positive")
    if args.limit is not None and args.limit <= 0:
        parser.error("--limit must be positive")
    if args.tools and not (args.chat_template or args.tokenizer_config):
        parser.error("--tools needs the model's chat template: --chat_template or --tokenizer_config")
    start = time.perf_counter()
    try:
        template = tool_template(args) if args.tools else args.template
        check_output_free(args.output_path, args.overwrite)
        read = read_rows(args.file_path, args.dataset_type, args.map_keys, args.skip_invalid, args.limit,
                         other_keys="name other keys with --dataset_type and --map_keys")
        if not read.rows:
            raise InputError(f"{args.file_path}: no valid rows to convert")
        tokenizer = QwenTokenizer.from_files(args.vocab_path, args.merges_file_path, args.tokenizer_config)
        summary = write_prompt_dataset(
            args.output_path,
            read.rows,
            tokenizer,
            template=template,
            max_prompt_length=args.max_prompt_length,
            truncate=args.truncate,
            overwrite=args.overwrite,
            on_progress=Progress(len(read.rows), "converting"),
        )
    except (ValueError, OSError, KeyError) as e:  # bad rows, existing output, missing files, every prompt over-long
        print(str(e) if isinstance(e, (InputError, ChatTemplateError)) else f"error: {e}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    print(
        f"wrote {summary.written} rows to {os.path.abspath(args.output_path)} (+ .db) in {elapsed:.1f} s\n"
        f"  dataset {read.dataset_type}, template {getattr(template, 'name', template)}, max_prompt_length {args.max_prompt_length}\n"
        f"  dropped {summary.dropped} over-long, truncated {summary.truncated}, skipped {read.skipped} invalid\n"
        f"  prompt length min {summary.min_length} / mean {summary.mean_length:.1f} / max {summary.max_length} tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
