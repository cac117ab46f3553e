"""Prompt MindRecord writer and reader (tiny synthetic tokenizer; no files from outside the repo)."""

import os

import numpy as np
import pytest

from mindgrpo.data.mindrecord import (
    PROMPT_SCHEMA,
    PromptRow,
    encode_prompts,
    load_prompt_dataset,
    write_mindrecord,
    write_prompt_dataset,
)
from mindgrpo.data.templates import get_template, render_prompt

ROWS = [
    PromptRow("What is 1 + 2?", "1 + 2 = 3. \\boxed{3}", "3"),
    PromptRow("What is 10 - 4?", "10 - 4 = 6. \\boxed{6}", "6"),
    PromptRow("Caf\u00e9 costs $5; what is 5 * 3? " * 3, "15", "15"),  # non-ASCII, longer
]


def read_with_minddataset(path):
    import mindspore.dataset as ds

    return list(ds.MindDataset(path, shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1))


def test_rows_round_trip_through_minddataset(tiny, tmp_path):
    path = str(tmp_path / "p.mindrecord")
    summary = write_prompt_dataset(path, ROWS, tiny, template="qwen_chat", max_prompt_length=256)
    assert summary.written == 3 and summary.dropped == 0 and summary.truncated == 0
    assert sorted(os.listdir(tmp_path)) == ["p.mindrecord", "p.mindrecord.db"]  # no temporary folder left

    raw = read_with_minddataset(path)
    assert len(raw) == 3
    for row, record in zip(ROWS, raw):
        prompt = render_prompt("qwen_chat", row.question)
        ids = tiny.encode(prompt)
        assert record["prompt_ids"].dtype == np.int32 and record["prompt_ids"].shape == (256,)
        assert int(record["prompt_length"]) == len(ids)
        assert record["prompt_ids"][: len(ids)].tolist() == ids
        assert (record["prompt_ids"][len(ids) :] == tiny.pad_token_id).all()
        assert str(record["prompt"]) == prompt
        assert str(record["solution"]) == row.solution and str(record["answer"]) == row.answer
    lengths = [int(r["prompt_length"]) for r in raw]
    assert (summary.min_length, summary.max_length) == (min(lengths), max(lengths))
    assert summary.mean_length == pytest.approx(sum(lengths) / 3)

    loaded = load_prompt_dataset(path)
    assert loaded["prompt_ids"].shape == (3, 256) and loaded["prompt_ids"].dtype == np.int32
    assert loaded["prompt_length"].tolist() == lengths
    assert loaded["solution"] == ["3", "6", "15"]
    assert loaded["answer"] == [r.answer for r in ROWS]


def test_over_long_prompts_are_dropped_or_cut(tiny):
    prompts = ["a b c d e f g h", "a b", "x y z w v u t s r q"]
    full = tiny.encode_batch(prompts)
    limit = len(full[0])  # the first just fits, the third is longer
    assert len(full[2]) > limit

    enc = encode_prompts(prompts, tiny, limit)
    assert enc.kept == [0, 1] and enc.truncated == 0 and enc.ids.shape == (2, limit)
    assert enc.lengths.tolist() == [limit, len(full[1])]
    assert enc.texts == prompts[:2]

    left = encode_prompts(prompts, tiny, limit, truncate="left")
    right = encode_prompts(prompts, tiny, limit, truncate="right")
    assert left.kept == [0, 1, 2] and left.truncated == 1
    assert left.ids[2].tolist() == full[2][-limit:]
    assert right.ids[2].tolist() == full[2][:limit]
    assert (left.texts[2], right.texts[2]) == (" w v u t s r q", "x y z w v u t")
    with pytest.raises(ValueError, match="truncate"):
        encode_prompts(prompts, tiny, limit, truncate="middle")


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_cuts_the_question_and_keeps_the_template(tiny, side):
    before, after = get_template("qwen_chat").parts()
    question = "What is " + " + ".join(str(d) for d in range(1, 10)) + "?"
    head, body, tail = tiny.encode(before), tiny.encode(question), tiny.encode(after)
    assert head + body + tail == tiny.encode(before + question + after)  # the pieces tokenize apart here
    limit = len(head) + len(tail) + 6
    enc = encode_prompts([question], tiny, limit, truncate=side, template="qwen_chat")
    kept = body[-6:] if side == "left" else body[:6]
    assert enc.truncated == 1 and enc.lengths.tolist() == [limit]
    assert enc.ids[0].tolist() == head + kept + tail  # the assistant header included
    assert enc.texts[0] == before + tiny.decode(kept) + after
    assert enc.texts[0] == tiny.decode(enc.ids[0])


def test_truncation_cuts_at_a_character_boundary(tiny):
    question = "What is \u4f60\u597d 1 + 2?"  # each CJK character is three byte-level tokens here
    before, after = get_template("qwen_chat").parts()
    head, tail = len(tiny.encode(before)), len(tiny.encode(after))
    # 4 question tokens end inside the first CJK character, 8 from the end start inside the second
    right = encode_prompts([question], tiny, head + tail + 4, truncate="right", template="qwen_chat")
    left = encode_prompts([question], tiny, head + tail + 8, truncate="left", template="qwen_chat")
    assert right.texts[0] == before + "What is " + after
    assert left.texts[0] == before + " 1 + 2?" + after
    assert right.ids[0, : right.lengths[0]].tolist() == tiny.encode(right.texts[0])
    assert left.ids[0, : left.lengths[0]].tolist() == tiny.encode(left.texts[0])


def test_truncation_refuses_a_template_longer_than_the_limit(tiny):
    with pytest.raises(ValueError, match="template 'qwen_r1' takes .* no room for the question"):
        encode_prompts(["What is 1 + 1?"], tiny, 8, truncate="left", template="qwen_r1")


def test_existing_output_is_refused_unless_overwrite(tiny, tmp_path):
    path = str(tmp_path / "p.mindrecord")
    write_prompt_dataset(path, ROWS[:1], tiny, template="raw", max_prompt_length=64)
    with pytest.raises(FileExistsError, match="p.mindrecord"):
        write_prompt_dataset(path, ROWS[:2], tiny, template="raw", max_prompt_length=64)
    assert load_prompt_dataset(path)["solution"] == ["3"]
    write_prompt_dataset(path, ROWS[:2], tiny, template="raw", max_prompt_length=64, overwrite=True)
    assert load_prompt_dataset(path)["solution"] == ["3", "6"]
    # a lone index file also counts as an existing output
    os.unlink(path)
    with pytest.raises(FileExistsError, match=r"p.mindrecord.db"):
        write_prompt_dataset(path, ROWS[:1], tiny, template="raw", max_prompt_length=64)


def test_failed_write_leaves_nothing(tiny, tmp_path):
    def batches():
        yield [{"prompt_ids": np.zeros(4, np.int32), "prompt_length": np.int32(1), "prompt": "p",
                "solution": "s", "answer": "a"}]
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_mindrecord(str(tmp_path / "x.mindrecord"), PROMPT_SCHEMA, batches())
    with pytest.raises(ValueError, match="no rows"):  # every prompt over-long
        write_prompt_dataset(str(tmp_path / "y.mindrecord"), ROWS, tiny, max_prompt_length=4)
    assert os.listdir(tmp_path) == []


def test_reader_names_file_and_missing_column(tmp_path):
    path = str(tmp_path / "other.mindrecord")
    schema = {"prompt_ids": {"type": "int32", "shape": [-1]}, "prompt": {"type": "string"}}
    write_mindrecord(path, schema, [[{"prompt_ids": np.arange(3, dtype=np.int32), "prompt": "p"}]])
    missing = r"other.mindrecord: missing column\(s\) \['prompt_length', 'solution', 'answer'\]"
    with pytest.raises(KeyError, match=missing):
        load_prompt_dataset(path)
    with pytest.raises(FileNotFoundError, match="nothere.mindrecord"):
        load_prompt_dataset(str(tmp_path / "nothere.mindrecord"))
    os.unlink(path + ".db")
    with pytest.raises(FileNotFoundError, match="no index file"):
        load_prompt_dataset(path)


def test_next_write_removes_the_folder_of_a_killed_one(tiny, tmp_path):
    import subprocess
    import sys

    path = tmp_path / "p.mindrecord"
    # a writer that dies after staging part of its output (its folder stays, its process is gone)
    died = f"""
import os
from mindgrpo.utils.staging import staging_dir
stage = staging_dir({str(path)!r})
open(os.path.join(stage, "p.mindrecord"), "wb").write(b"partial")
os._exit(9)
"""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert subprocess.run([sys.executable, "-c", died], env=dict(os.environ, PYTHONPATH=repo)).returncode == 9
    (left,) = os.listdir(tmp_path)
    assert left.startswith(".p.mindrecord.tmp-")
    head, _, rand = left.rsplit("-", 2)
    running = tmp_path / f"{head}-{os.getpid()}-{rand}"  # a live writer's: kept
    running.mkdir()
    write_prompt_dataset(str(path), ROWS, tiny, template="raw", max_prompt_length=64)
    assert sorted(os.listdir(tmp_path)) == sorted(["p.mindrecord", "p.mindrecord.db", running.name])
