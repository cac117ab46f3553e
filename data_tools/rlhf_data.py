"""Convert a GSM8K- or MATH-style .jsonl/.json file into a prompt MindRecord for GRPO.

    python data_tools/rlhf_data.py --vocab_path vocab.json --merges_file_path merges.txt \
        --file_path train.jsonl --output_path gsm8k_train.mindrecord [--template qwen_r1] [--max_prompt_length 512]

Input rows are JSON objects. The dataset type says where the question, the full reference solution and the
final answer are:
    gsm8k  question, answer            final answer after the last '####' of answer
    math   problem, solution           final answer in the last \\boxed{} of solution
    auto   gsm8k if the first row has question/answer, math if it has problem/solution
--map_keys question=FIELD,answer=FIELD[,solution=FIELD] renames the fields (solution=FIELD: a field that holds
the final answer itself). Output columns: see mindgrpo/data/mindrecord.py (prompt_ids, prompt_length, prompt,
solution, answer). A bad row stops the run with `FILE:LINE: problem` on stderr and exit code 1, leaving nothing
at the output path; --skip_invalid skips and counts bad rows instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from mindgrpo.data.mindrecord import PromptRow, check_output_free, write_prompt_dataset
from mindgrpo.data.templates import TEMPLATES
from mindgrpo.data.tokenizer import QwenTokenizer
from mindgrpo.rewards.answer import last_boxed

DATASET_FIELDS = {
    "gsm8k": {"question": "question", "answer": "answer"},
    "math": {"question": "problem", "answer": "solution"},
}
ROLES = ("question", "answer", "solution")


class InputError(ValueError):
    """A problem with one input row, formatted `FILE:LINE: what is wrong`."""


@dataclass(frozen=True)
class ReadResult:
    rows: List[PromptRow]
    skipped: int
    dataset_type: str


# ----------------------------------------------------------------------------------------------- reading


def first_bad_byte(text: str) -> Optional[int]:
    """Index of the first character of `text` that stands for a byte that is not UTF-8, else None (the input is
    read with errors="surrogateescape", which maps such bytes to U+DC80..U+DCFF)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def bad_byte_error(path: str, lineno: int, line: str, column: int) -> InputError:
    byte = ord(line[column]) - 0xDC00
    return InputError(f"{path}:{lineno}: not UTF-8 text (byte 0x{byte:02x} at column {column + 1})")


def iter_json_objects(path: str) -> Iterator[Tuple[int, object]]:
    """(line number, parsed value or InputError) for each row of a .jsonl file or each element of a .json list.

    A row or element holding a byte that is not UTF-8 is an InputError of its line. A malformed .json file
    raises at once: unlike .jsonl, a broken array cannot be read past the error.
    """
    with open(path, encoding="utf-8", errors="surrogateescape") as f:  # bad bytes become U+DC80..U+DCFF
        text = f.read()
    if not path.endswith(".json"):
        for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit inside a string
            if not line.strip():
                continue
            bad = first_bad_byte(line)
            if bad is not None:
                yield lineno, bad_byte_error(path, lineno, line, bad)
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                yield lineno, InputError(f"{path}:{lineno}: malformed JSON ({e.msg}, column {e.colno})")
        return
    decoder = json.JSONDecoder()

    def fail(pos: int, what: str) -> InputError:
        return InputError(f"{path}:{text.count(chr(10), 0, pos) + 1}: {what}")

    def skip_space(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    pos = skip_space(0)
    if pos >= len(text) or text[pos] != "[":
        raise fail(pos, "a .json input must be a list of objects")
    pos = skip_space(pos + 1)
    if pos < len(text) and text[pos] == "]":
        return
    while True:
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise fail(e.pos, f"malformed JSON ({e.msg})") from None
        bad = first_bad_byte(text[pos:end])
        if bad is not None:  # the element is skippable like any other bad row
            at = pos + bad
            line_start = text.rfind("\n", 0, at) + 1
            value = bad_byte_error(path, text.count("\n", 0, at) + 1, text[line_start:at + 1], at - line_start)
        yield text.count("\n", 0, pos) + 1, value
        pos = skip_space(end)
        if pos < len(text) and text[pos] == ",":
            pos = skip_space(pos + 1)
        elif pos < len(text) and text[pos] == "]":
            if skip_space(pos + 1) != len(text):
                raise fail(pos + 1, "unexpected text after the closing ']'")
            return
        else:
            raise fail(pos, "expected ',' or ']' between list elements")


def detect_dataset_type(record: dict) -> Optional[str]:
    for name, fields in DATASET_FIELDS.items():
        if all(f in record for f in fields.values()):
            return name
    return None


def final_answer(text: str, dataset_type: str) -> Optional[str]:
    if dataset_type == "gsm8k":
        return text.rsplit("####", 1)[1].strip() if "####" in text else None
    boxed = last_boxed(text)
    return boxed.strip() if boxed is not None else None


def to_row(record: object, fields: Dict[str, str], dataset_type: str) -> PromptRow:
    """A PromptRow from one JSON object; ValueError says what is wrong (without the FILE:LINE prefix)."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    values = {}
    for role, key in fields.items():
        if key not in record:
            raise ValueError(f"missing key {key!r} (the {role}); keys are {sorted(record)}")
        value = record[key]
        if role == "solution" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"key {key!r} must be a non-empty string, got {value!r:.60}")
        values[role] = value
    solution = values.get("solution")
    if solution is None:
        solution = final_answer(values["answer"], dataset_type)
        where = "'####'" if dataset_type == "gsm8k" else "\\boxed{}"
        if not solution:
            raise ValueError(f"key {fields['answer']!r} has no final answer after {where}")
    return PromptRow(question=values["question"], answer=values["answer"], solution=solution.strip())


def read_rows(
    path: str,
    dataset_type: str,
    key_map: Dict[str, str],
    skip_invalid: bool,
    limit: Optional[int],
    log=None,
) -> ReadResult:
    """All valid rows of `path` (up to `limit`); raises InputError on the first bad row unless skip_invalid,
    which reports skipped rows on `log` (default stderr)."""
    log = sys.stderr if log is None else log
    rows: List[PromptRow] = []
    skipped = 0
    fields: Optional[Dict[str, str]] = None
    for lineno, record in iter_json_objects(path):
        try:
            if isinstance(record, InputError):
                raise record
            if fields is None:
                if dataset_type == "auto":
                    detected = detect_dataset_type(record) if isinstance(record, dict) else None
                    if detected is None:
                        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                        raise InputError(
                            f"{path}:{lineno}: cannot detect the dataset type from {keys}; "
                            "pass --dataset_type and --map_keys"
                        )
                    dataset_type = detected
                fields = {**DATASET_FIELDS[dataset_type], **key_map}
            try:
                rows.append(to_row(record, fields, dataset_type))
            except ValueError as e:
                raise InputError(f"{path}:{lineno}: {e}") from None
        except InputError as e:
            if not skip_invalid:
                raise
            skipped += 1
            if skipped <= 20:
                print(f"skipped {e}", file=log)
        if limit is not None and len(rows) >= limit:
            break
    if skipped > 20:
        print(f"skipped {skipped - 20} more invalid rows", file=log)
    return ReadResult(rows=rows, skipped=skipped, dataset_type=dataset_type)


# ----------------------------------------------------------------------------------------------- CLI


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
    p.add_argument("--map_keys", type=parse_key_map, default={}, help="question=FIELD,answer=FIELD[,solution=FIELD]")
    p.add_argument("--truncate", choices=["left", "right"], default=None,
                   help="cut the question of an over-long prompt from this side, keeping the template whole "
                   "(default: drop such prompts and count them)")
    p.add_argument("--skip_invalid", action="store_true", help="skip and count bad rows instead of stopping")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--limit", type=int, default=None, help="convert only the first N valid rows")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_prompt_length <= 0:
        parser.error("--max_prompt_length must be positive")
    if args.limit is not None and args.limit <= 0:
        parser.error("--limit must be positive")
    start = time.perf_counter()
    try:
        check_output_free(args.output_path, args.overwrite)
        read = read_rows(args.file_path, args.dataset_type, args.map_keys, args.skip_invalid, args.limit)
        if not read.rows:
            raise InputError(f"{args.file_path}: no valid rows to convert")
        tokenizer = QwenTokenizer.from_files(args.vocab_path, args.merges_file_path, args.tokenizer_config)
        summary = write_prompt_dataset(
            args.output_path,
            read.rows,
            tokenizer,
            template=args.template,
            max_prompt_length=args.max_prompt_length,
            truncate=args.truncate,
            overwrite=args.overwrite,
            on_progress=Progress(len(read.rows), "converting"),
        )
    except (ValueError, OSError) as e:  # bad rows, existing output, missing files, every prompt over-long
        print(str(e) if isinstance(e, InputError) else f"error: {e}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    print(
        f"wrote {summary.written} rows to {os.path.abspath(args.output_path)} (+ .db) in {elapsed:.1f} s\n"
        f"  dataset {read.dataset_type}, template {args.template}, max_prompt_length {args.max_prompt_length}\n"
        f"  dropped {summary.dropped} over-long, truncated {summary.truncated}, skipped {read.skipped} invalid\n"
        f"  prompt length min {summary.min_length} / mean {summary.mean_length:.1f} / max {summary.max_length} tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
