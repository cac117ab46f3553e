"""Prompt datasets in MindRecord: the writer shared by data_tools/rlhf_data.py and the synthetic task, and the
trainer-side reader.

One row per question, columns (PROMPT_SCHEMA):
    prompt_ids     int32 (P,)  templated prompt token ids, right-padded with the pad id to P = max_prompt_length
    prompt_length  int32       number of real tokens in prompt_ids
    prompt         string      the templated prompt text (a truncated prompt: its ids decoded)
    solution       string      the reference final answer (what `accuracy` compares against)
    answer         string      the full reference solution text

A MindRecord file's `.db` index records the data file's name, so the pair is written under its final names
inside a temporary folder beside the output (`.NAME.tmp-HOST-PID-*`, mindgrpo/utils/staging.py) and then moved
into place; a failed write leaves nothing behind, and the folder of a killed one is removed by the next write
to the same output.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Union

import numpy as np

from mindgrpo.data.templates import ChatTemplatePrompt, PromptTemplate, get_template
from mindgrpo.data.tokenizer import QwenTokenizer
from mindgrpo.utils.staging import staging_dir

PROMPT_SCHEMA = {
    "prompt_ids": {"type": "int32", "shape": [-1]},
    "prompt_length": {"type": "int32"},
    "prompt": {"type": "string"},
    "solution": {"type": "string"},
    "answer": {"type": "string"},
}
PROMPT_COLUMNS = tuple(PROMPT_SCHEMA)
TRUNCATE_MODES = (None, "left", "right")


@dataclass(frozen=True)
class PromptRow:
    """One dataset example before templating."""

    question: str
    answer: str  # full reference solution
    solution: str  # reference final answer


@dataclass(frozen=True)
class WriteSummary:
    written: int
    dropped: int  # over-long prompts left out (truncate=None)
    truncated: int  # over-long prompts cut (truncate="left"/"right")
    min_length: int
    mean_length: float
    max_length: int


def index_path(path: str) -> str:
    """The index file MindRecord keeps beside a data file."""
    return path + ".db"


def check_output_free(path: str, overwrite: bool) -> None:
    """Raise FileExistsError when `path` or its index exists and `overwrite` is False."""
    if overwrite:
        return
    for existing in (path, index_path(path)):
        if os.path.lexists(existing):
            raise FileExistsError(f"{existing} already exists (pass overwrite=True / --overwrite to replace it)")


def write_mindrecord(
    path: str,
    schema: Dict[str, dict],
    batches: Iterable[List[dict]],
    *,
    overwrite: bool = False,
    description: str = "mindgrpo",
) -> int:
    """Write `batches` of rows (dicts matching `schema`) as `path` + `path.db`, all or nothing; returns rows written.

    Refuses an existing `path` or `path.db` unless `overwrite`. Raises ValueError when there is no row.
    """
    from mindspore.mindrecord import FileWriter  # heavy import, only when writing

    path = os.path.abspath(path)
    check_output_free(path, overwrite)
    name = os.path.basename(path)
    tmp_dir = staging_dir(path)  # also removes the folders of killed writes to this output
    try:
        tmp_path = os.path.join(tmp_dir, name)
        writer = FileWriter(tmp_path, shard_num=1, overwrite=True)
        writer.add_schema(schema, description)
        rows = 0
        for batch in batches:
            if batch:
                writer.write_raw_data(batch)
                rows += len(batch)
        if rows == 0:
            raise ValueError(f"no rows to write to {path}")
        writer.commit()
        for written in (tmp_path, index_path(tmp_path)):
            os.chmod(written, 0o644)  # FileWriter creates 0600 files
        os.replace(tmp_path, path)
        try:
            os.replace(index_path(tmp_path), index_path(path))
        except BaseException:
            os.unlink(path)  # never leave a data file paired with a stale or missing index
            raise
        return rows
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


class EncodedPrompts(NamedTuple):
    ids: np.ndarray  # (N', P) int32, right-padded with the pad id
    lengths: np.ndarray  # (N',) int32
    texts: List[str]  # the prompt text of each row
    kept: List[int]  # indices into the questions
    truncated: int  # how many of the kept prompts were cut


def encode_prompts(
    questions: Sequence[str],
    tokenizer: QwenTokenizer,
    max_prompt_length: int,
    truncate: Optional[str] = None,
    template: Union[str, PromptTemplate, ChatTemplatePrompt] = "raw",
) -> EncodedPrompts:
    """Template, tokenize and right-pad questions.

    A prompt longer than P = max_prompt_length is dropped when truncate is None; otherwise its question is cut
    and the template kept whole (see truncate_question), and its text is the text of the ids that remain.
    """
    if truncate not in TRUNCATE_MODES:
        raise ValueError(f"truncate must be one of {TRUNCATE_MODES}, got {truncate!r}")
    render = get_template(template) if isinstance(template, str) else template
    prompts = [render(q) for q in questions]
    encoded = tokenizer.encode_batch(prompts)
    ids = np.full((len(encoded), max_prompt_length), tokenizer.pad_token_id, dtype=np.int32)  # (N, P)
    lengths = np.zeros(len(encoded), dtype=np.int32)  # (N,)
    texts, kept, truncated = [], [], 0
    for i, tokens in enumerate(encoded):
        text = prompts[i]
        if len(tokens) > max_prompt_length:
            if truncate is None:
                continue
            tokens = truncate_question(tokenizer, render, questions[i], max_prompt_length, truncate)
            text = tokenizer.decode(tokens)
            truncated += 1
        row = len(kept)
        ids[row, : len(tokens)] = tokens
        lengths[row] = len(tokens)
        texts.append(text)
        kept.append(i)
    return EncodedPrompts(ids[: len(kept)], lengths[: len(kept)], texts, kept, truncated)


def truncate_question(
    tokenizer: QwenTokenizer, template: PromptTemplate, question: str, max_prompt_length: int, side: str
) -> List[int]:
    """The ids of template(question) with only the question's tokens cut to fit max_prompt_length.

    "left" drops the question's first tokens (keeps its end), "right" its last ones. The template's tokens
    (system turn, user header, the closing marks and the assistant header) are those of the full prompt, and
    a token that straddles the question's edge counts as the template's. The cut moves to a character boundary
    (byte-level tokens can split a character), so the ids decode to whole characters.
    """
    before, after = template.parts()
    enc = tokenizer.backend.encode(before + question + after, add_special_tokens=False)
    ids, offsets = enc.ids, enc.offsets  # offsets: (start, end) characters of each token in the text
    q_start, q_end = len(before), len(before) + len(question)
    lo = sum(1 for start, _ in offsets if start < q_start)  # question tokens: ids[lo:hi]
    hi = lo + sum(1 for start, end in offsets[lo:] if end <= q_end)
    room = max_prompt_length - (lo + len(ids) - hi)
    if room < 1:
        raise ValueError(f"template {template.name!r} takes {lo + len(ids) - hi} tokens with this question, which "
                         f"leaves no room for the question within max_prompt_length {max_prompt_length}")
    if hi - lo <= room:
        return ids
    if side == "left":
        cut = hi - room
        while cut < hi and offsets[cut][0] < offsets[cut - 1][1]:  # shares a character with a dropped token
            cut += 1
        return ids[:lo] + ids[cut:]
    cut = lo + room
    while cut > lo and offsets[cut - 1][1] > offsets[cut][0]:
        cut -= 1
    return ids[:cut] + ids[hi:]


def write_prompt_dataset(
    path: str,
    rows: Sequence[PromptRow],
    tokenizer: QwenTokenizer,
    *,
    template: Union[str, PromptTemplate, ChatTemplatePrompt] = "qwen_r1",
    max_prompt_length: int = 512,
    truncate: Optional[str] = None,
    overwrite: bool = False,
    chunk_size: int = 2048,
    on_progress: Optional[Callable[[int], None]] = None,
) -> WriteSummary:
    """Template, tokenize (batched) and write `rows` as a prompt MindRecord at `path` (see PROMPT_SCHEMA).

    `on_progress(n)` is called after every chunk with the number of input rows processed so far.
    """
    counts = {"dropped": 0, "truncated": 0}
    lengths_seen: List[np.ndarray] = []

    def batches():
        for start in range(0, len(rows), chunk_size):
            chunk = rows[start : start + chunk_size]
            enc = encode_prompts([r.question for r in chunk], tokenizer, max_prompt_length, truncate, template)
            counts["dropped"] += len(chunk) - len(enc.kept)
            counts["truncated"] += enc.truncated
            lengths_seen.append(enc.lengths)
            yield [
                {
                    "prompt_ids": enc.ids[j],
                    "prompt_length": np.int32(enc.lengths[j]),
                    "prompt": enc.texts[j],
                    "solution": chunk[i].solution,
                    "answer": chunk[i].answer,
                }
                for j, i in enumerate(enc.kept)
            ]
            if on_progress is not None:
                on_progress(start + len(chunk))

    written = write_mindrecord(
        path, PROMPT_SCHEMA, batches(), overwrite=overwrite, description=f"mindgrpo prompts ({getattr(template, 'name', template)})"
    )
    lengths = np.concatenate(lengths_seen)
    return WriteSummary(
        written=written,
        dropped=counts["dropped"],
        truncated=counts["truncated"],
        min_length=int(lengths.min()),
        mean_length=float(lengths.mean()),
        max_length=int(lengths.max()),
    )


def load_prompt_dataset(path: str) -> Dict[str, object]:
    """Read a prompt MindRecord in file order.

    Returns {"prompt_ids": (N, P) int32, "prompt_length": (N,) int32, "prompt": [str], "solution": [str],
    "answer": [str]}. Fails naming the file when it is missing or lacks a column.
    """
    import mindspore.dataset as ds  # heavy import, only when reading

    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt dataset {path} does not exist")
    if not os.path.isfile(index_path(path)):
        raise FileNotFoundError(f"prompt dataset {path} has no index file {index_path(path)}")
    dataset = ds.MindDataset(path, shuffle=False)
    present = dataset.get_col_names()
    missing = [c for c in PROMPT_COLUMNS if c not in present]
    if missing:
        raise KeyError(f"{path}: missing column(s) {missing}; it has {sorted(present)}")
    columns: Dict[str, list] = {c: [] for c in PROMPT_COLUMNS}
    for row in dataset.create_dict_iterator(output_numpy=True, num_epochs=1):
        for c in PROMPT_COLUMNS:
            columns[c].append(row[c])
    widths = {len(ids) for ids in columns["prompt_ids"]}
    if len(widths) > 1:
        raise ValueError(f"{path}: prompt_ids rows have lengths {sorted(widths)}; expected right-padded rows")
    return {
        "prompt_ids": np.stack(columns["prompt_ids"]).astype(np.int32),
        "prompt_length": np.array(columns["prompt_length"], dtype=np.int32),
        "prompt": [str(s) for s in columns["prompt"]],
        "solution": [str(s) for s in columns["solution"]],
        "answer": [str(s) for s in columns["answer"]],
    }
