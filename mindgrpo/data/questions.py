"""Math questions from a GSM8K- or MATH-style .jsonl / .json file: each row's question, full reference
solution and final answer, every bad row named `FILE:LINE: problem`. Read by `data_tools/rlhf_data.py`
(into a prompt MindRecord) and by the evaluation runner (`mindgrpo/eval/runner.py`, for .jsonl data).

Input rows are JSON objects. The dataset type says where the question, the full reference solution and the
final answer are:
    gsm8k  question, answer            final answer after the last '####' of answer
    math   problem, solution           final answer in the last \\boxed{} of solution (as the accuracy reward
                                       reads it: `mindgrpo/rewards/answer.last_boxed`)
    auto   gsm8k if the first row has question/answer, math if it has problem/solution
A key map (role -> field) renames the fields; `solution` names a field that holds the final answer itself.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from mindgrpo.data.mindrecord import PromptRow
from mindgrpo.rewards.answer import last_boxed

DATASET_FIELDS = {
    "gsm8k": {"question": "question", "answer": "answer"},
    "math": {"question": "problem", "answer": "solution"},
}
FINAL = {"gsm8k": "after '####'", "math": "in the last \\boxed{}"}  # where each type's final answer is
ROLES = ("question", "answer", "solution")


class InputError(ValueError):
    """A problem with one input row, formatted `FILE:LINE: what is wrong`."""


@dataclass(frozen=True)
class ReadResult:
    rows: List[PromptRow]
    skipped: int
    dataset_type: str


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


def undetected(path: str, lineno: int, record: object, other_keys: str) -> InputError:
    """A first row in which neither dataset type's keys are found: which keys are read, and `other_keys`, how
    the caller names other keys (rlhf_data.py's flags), when it can."""
    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
    read = " or ".join(f"{f['question']} and {f['answer']} ({name.upper()}: the final answer {FINAL[name]})"
                       for name, f in DATASET_FIELDS.items())
    return InputError(f"{path}:{lineno}: a row needs a question and its answer, read from the keys {read}; this row "
                      f"has {keys}" + (f"; {other_keys}" if other_keys else ""))


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
    other_keys: str = "",
) -> ReadResult:
    """All valid rows of `path` (up to `limit`); raises InputError on the first bad row unless skip_invalid,
    which reports skipped rows on `log` (default stderr). `other_keys`: how the caller's user names other keys
    (said when the type of a dataset_type "auto" file cannot be detected)."""
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
                        raise undetected(path, lineno, record, other_keys)
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
