"""data_tools/rlhf_data.py: GSM8K conversion parity with transformers, bad input, overwrite, options."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "data_tools" / "rlhf_data.py"
SHARED = REPO.parent / "shared"
QWEN_DIR = SHARED / "tokenizers" / "qwen2_5"
GSM8K_TEST = SHARED / "data" / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def cli():
    from data_tools import rlhf_data

    return rlhf_data


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from mindgrpo.data.synthetic import ArithmeticTask, TinyTokenizerSpec, ensure_tiny_tokenizer

    path = tmp_path_factory.mktemp("tok") / "tiny"
    ensure_tiny_tokenizer(str(path), TinyTokenizerSpec(vocab_size=400, task=ArithmeticTask(num_train=300, num_val=50)))
    return path


def tok_args(tok_dir):
    return [
        "--vocab_path", str(tok_dir / "vocab.json"),
        "--merges_file_path", str(tok_dir / "merges.txt"),
        "--tokenizer_config", str(tok_dir / "tokenizer_config.json"),
    ]


def run_script(args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def read_records(path):
    import mindspore.dataset as ds

    return list(ds.MindDataset(str(path), shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1))


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = [
    {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"},
    {"question": "What is 2 + 5?", "answer": "2 + 5 = 7\n#### 7"},
    {"question": "What is 9 - 3?", "answer": "9 - 3 = 6\n#### 6"},
]


def test_gsm8k_test_set_ids_equal_transformers(tmp_path):
    if not (QWEN_DIR / "vocab.json").is_file() or not GSM8K_TEST.is_file():
        pytest.skip(f"needs the real Qwen2.5 tokenizer and GSM8K under {SHARED} (read-only ../shared is absent)")
    transformers = pytest.importorskip("transformers", reason="transformers (dev dependency) is the reference")
    from mindgrpo.data.templates import R1_SYSTEM

    out = tmp_path / "gsm8k_test.mindrecord"
    result = run_script([
        "--vocab_path", str(QWEN_DIR / "vocab.json"),
        "--merges_file_path", str(QWEN_DIR / "merges.txt"),
        "--tokenizer_config", str(QWEN_DIR / "tokenizer_config.json"),
        "--file_path", str(GSM8K_TEST),
        "--output_path", str(out),
    ])
    assert result.returncode == 0, result.stderr
    assert "wrote 1319 rows" in result.stdout and "dropped 0 over-long" in result.stdout

    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN_DIR))
    rows = [json.loads(line) for line in GSM8K_TEST.read_text(encoding="utf-8").splitlines()]
    texts = [
        hf.apply_chat_template(
            [{"role": "system", "content": R1_SYSTEM}, {"role": "user", "content": r["question"]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for r in rows
    ]
    expected = hf(texts, add_special_tokens=False)["input_ids"]
    records = read_records(out)
    assert len(records) == 1319
    for row, text, ids, record in zip(rows, texts, expected, records):
        n = int(record["prompt_length"])
        assert record["prompt_ids"].dtype == np.int32 and record["prompt_ids"].shape == (512,)
        assert record["prompt_ids"][:n].tolist() == ids
        assert (record["prompt_ids"][n:] == hf.pad_token_id).all()
        assert str(record["prompt"]) == text
        assert str(record["answer"]) == row["answer"]
        assert str(record["solution"]) == row["answer"].split("#### ")[-1]


@pytest.mark.parametrize(
    "lines, line_no, message",
    [
        ([GOOD[0], '{"question": "x", "answer": "#### 1"', GOOD[1]], 2, "malformed JSON"),
        ([GOOD[0], GOOD[1], {"question": "What?"}], 3, "missing key 'answer'"),
        ([GOOD[0], {"question": "Q", "answer": "no final answer"}], 2, "no final answer after '####'"),
        ([GOOD[0], "", '["a list"]'], 3, "expected a JSON object"),
        ([{"question": "", "answer": "#### 1"}], 1, "non-empty string"),
    ],
)
def test_bad_input_stops_naming_file_and_line(cli, tok_dir, tmp_path, capsys, lines, line_no, message):
    src = write_jsonl(tmp_path / "raw.jsonl", lines)
    out = tmp_path / "out" / "data.mindrecord"
    code = cli.main([*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith(f"{src}:{line_no}: ") and message in err[0], err
    assert not out.parent.exists() or os.listdir(out.parent) == []


def test_bad_input_through_the_real_command(tok_dir, tmp_path):
    src = write_jsonl(tmp_path / "raw.jsonl", [GOOD[0], GOOD[1], "{not json}"])
    out = tmp_path / "data.mindrecord"
    result = run_script([*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out)])
    assert result.returncode != 0
    assert result.stderr.strip().startswith(f"{src}:3: malformed JSON")
    assert sorted(os.listdir(tmp_path)) == ["raw.jsonl"]


def test_skip_invalid_counts_the_bad_rows(cli, tok_dir, tmp_path, capsys):
    src = write_jsonl(tmp_path / "raw.jsonl", [GOOD[0], "{oops", GOOD[1], {"q": 1}, GOOD[2]])
    out = tmp_path / "data.mindrecord"
    code = cli.main([*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out), "--skip_invalid"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "wrote 3 rows" in captured.out and "skipped 2 invalid" in captured.out
    assert f"skipped {src}:2: malformed JSON" in captured.err and f"skipped {src}:4: missing key" in captured.err
    assert [str(r["solution"]) for r in read_records(out)] == ["2", "7", "6"]


def test_existing_output_refused_without_overwrite(cli, tok_dir, tmp_path, capsys):
    src = write_jsonl(tmp_path / "raw.jsonl", GOOD)
    out = tmp_path / "data.mindrecord"
    base = [*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out)]
    assert cli.main([*base, "--limit", "1"]) == 0
    before = (out.read_bytes(), Path(str(out) + ".db").read_bytes())
    capsys.readouterr()
    assert cli.main(base) == 1
    assert "already exists" in capsys.readouterr().err
    assert (out.read_bytes(), Path(str(out) + ".db").read_bytes()) == before
    assert cli.main([*base, "--overwrite"]) == 0
    assert len(read_records(out)) == 3
    assert sorted(os.listdir(tmp_path)) == ["data.mindrecord", "data.mindrecord.db", "raw.jsonl"]


def test_json_list_math_type_and_key_mapping(cli, tok_dir, tmp_path, capsys):
    rows = [
        {"problem": "Find $x$ if $2x = 3$.", "solution": "So $x = \\boxed{\\frac{3}{2}}$."},
        {"problem": "Sum of 1 and 2?", "solution": "It is \\boxed{3}, not \\boxed{4}... no: \\boxed{3}."},
    ]
    src = tmp_path / "math.json"
    src.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    out = tmp_path / "math.mindrecord"
    args = [*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out), "--dataset_type", "auto"]
    assert cli.main(args) == 0
    records = read_records(out)
    assert [str(r["solution"]) for r in records] == ["\\frac{3}{2}", "3"]
    assert str(records[0]["answer"]) == rows[0]["solution"]

    mapped = [{"q": "What is 2 * 3?", "work": "2 * 3 = 6", "final": 6}]
    src = tmp_path / "mapped.json"
    src.write_text(json.dumps(mapped), encoding="utf-8")
    out = tmp_path / "mapped.mindrecord"
    args = [*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out), "--template", "raw",
            "--map_keys", "question=q,answer=work,solution=final"]
    assert cli.main(args) == 0
    (record,) = read_records(out)
    assert str(record["prompt"]) == "What is 2 * 3?"
    assert (str(record["answer"]), str(record["solution"])) == ("2 * 3 = 6", "6")

    src = tmp_path / "bad.json"
    src.write_text('[\n  {"problem": "a", "solution": "\\\\boxed{1}"},\n  {"problem": "b"}\n]', encoding="utf-8")
    capsys.readouterr()
    assert cli.main([*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(tmp_path / "b.mindrecord"),
                     "--dataset_type", "math"]) == 1
    assert capsys.readouterr().err.startswith(f"{src}:3: missing key 'solution'")


def test_long_prompts_dropped_or_truncated(cli, tok_dir, tmp_path, capsys):
    from mindgrpo.data.tokenizer import QwenTokenizer

    tok = QwenTokenizer.from_dir(str(tok_dir))
    long_q = "What is " + " + ".join(["1"] * 40) + "?"
    src = write_jsonl(tmp_path / "raw.jsonl", [GOOD[0], {"question": long_q, "answer": "#### 40"}, GOOD[1]])
    limit = len(tok.encode(GOOD[0]["question"])) + 2
    base = [*tok_args(tok_dir), "--file_path", str(src), "--template", "raw", "--max_prompt_length", str(limit)]

    assert cli.main([*base, "--output_path", str(tmp_path / "drop.mindrecord")]) == 0
    assert "dropped 1 over-long, truncated 0" in capsys.readouterr().out
    assert [str(r["solution"]) for r in read_records(tmp_path / "drop.mindrecord")] == ["2", "7"]

    assert cli.main([*base, "--output_path", str(tmp_path / "cut.mindrecord"), "--truncate", "left"]) == 0
    assert "dropped 0 over-long, truncated 1" in capsys.readouterr().out
    cut = read_records(tmp_path / "cut.mindrecord")[1]
    assert int(cut["prompt_length"]) == limit
    assert cut["prompt_ids"].tolist() == tok.encode(long_q)[-limit:]


@pytest.mark.parametrize(
    "extra", [["--map_keys", "prompt=q"], ["--max_prompt_length", "0"], ["--limit", "0"], ["--truncate", "middle"]]
)
def test_usage_errors(cli, tok_dir, extra):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*tok_args(tok_dir), "--file_path", "x.jsonl", "--output_path", "y", *extra])
    assert exit_info.value.code == 2


def test_missing_input_file(cli, tok_dir, tmp_path, capsys):
    assert cli.main([*tok_args(tok_dir), "--file_path", str(tmp_path / "missing.jsonl"),
                     "--output_path", str(tmp_path / "y.mindrecord")]) == 1
    assert "missing.jsonl" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_non_utf8_byte_names_file_and_line_and_can_be_skipped(cli, tok_dir, tmp_path, capsys):
    src = tmp_path / "raw.jsonl"
    src.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in GOOD[:2])
                    + b'{"question": "What is 4 + 4?\xff", "answer": "#### 8"}\n' + json.dumps(GOOD[2]).encode())
    out = tmp_path / "data.mindrecord"
    base = [*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out)]
    assert cli.main(base) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{src}:3: not UTF-8 text (byte 0xff at column 29)"]
    assert not out.exists()
    assert cli.main([*base, "--skip_invalid"]) == 0
    captured = capsys.readouterr()
    assert "wrote 3 rows" in captured.out and "skipped 1 invalid" in captured.out
    assert [str(r["solution"]) for r in read_records(out)] == ["2", "7", "6"]


def test_non_utf8_byte_in_a_json_list_names_its_line(cli, tok_dir, tmp_path, capsys):
    src = tmp_path / "raw.json"
    src.write_bytes(b'[\n  {"question": "Q1", "answer": "#### 1"},\n  {"question": "Q\xe92",\n   "answer": "#### 2"}\n]')
    out = tmp_path / "data.mindrecord"
    base = [*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out)]
    assert cli.main(base) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"{src}:3: not UTF-8 text (byte 0xe9 at column 18)"]
    assert cli.main([*base, "--skip_invalid"]) == 0
    assert [str(r["solution"]) for r in read_records(out)] == ["1"]


@pytest.mark.parametrize("swap", ["both", "merges_as_vocab", "vocab_as_merges"])
def test_swapped_or_wrong_tokenizer_files_name_the_file(tok_dir, tmp_path, swap):
    vocab, merges = tok_dir / "vocab.json", tok_dir / "merges.txt"
    given = {"both": (merges, vocab), "merges_as_vocab": (merges, merges), "vocab_as_merges": (vocab, vocab)}[swap]
    src = write_jsonl(tmp_path / "raw.jsonl", GOOD)
    out = tmp_path / "data.mindrecord"
    result = run_script(["--vocab_path", str(given[0]), "--merges_file_path", str(given[1]),
                         "--file_path", str(src), "--output_path", str(out)])
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    bad = merges if swap != "vocab_as_merges" else vocab
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}"), lines
    assert "swapped?" in lines[0] and len(lines[0]) < 300
    assert sorted(os.listdir(tmp_path)) == ["raw.jsonl"]


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncate_cuts_the_question_and_keeps_the_template(cli, tok_dir, tmp_path, capsys, side):
    from mindgrpo.data.templates import get_template
    from mindgrpo.data.tokenizer import QwenTokenizer

    tok = QwenTokenizer.from_dir(str(tok_dir))
    before, after = get_template("qwen_chat").parts()
    long_q = "What is " + " + ".join(str(d) for d in range(1, 10)) * 3 + "?"
    src = write_jsonl(tmp_path / "raw.jsonl", [GOOD[0], {"question": long_q, "answer": "#### 135"}])
    limit = len(tok.encode(before + long_q + after)) - 10
    out = tmp_path / f"{side}.mindrecord"
    assert cli.main([*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out), "--template", "qwen_chat",
                     "--max_prompt_length", str(limit), "--truncate", side]) == 0
    assert "truncated 1" in capsys.readouterr().out
    short, cut = read_records(out)
    assert str(short["prompt"]) == before + GOOD[0]["question"] + after  # not truncated: as before
    n = int(cut["prompt_length"])
    text = str(cut["prompt"])
    assert n == limit and tok.decode(cut["prompt_ids"][:n]) == text
    assert text.startswith(before) and text.endswith(after)  # the template whole, the assistant header included
    question = text[len(before):len(text) - len(after)]
    assert len(question) < len(long_q)
    assert long_q.endswith(question) if side == "left" else long_q.startswith(question)


QWEN3_TEMPLATE = REPO / "tests" / "data" / "qwen3_template" / "tokenizer_config.json"


def test_tools_go_into_the_system_turn_by_the_chat_template(cli, tok_dir, tmp_path, capsys):
    from mindgrpo.data.templates import R1_SYSTEM, render_chat
    from mindgrpo.tools import tool_schema

    src = write_jsonl(tmp_path / "raw.jsonl", GOOD[:2])
    out = tmp_path / "tools.mindrecord"
    assert cli.main([*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(out), "--tools",
                     "calculator,python", "--chat_template", str(QWEN3_TEMPLATE), "--max_prompt_length", "2048"]) == 0
    assert "template chat_template(qwen3_template; tools calculator,python)" in capsys.readouterr().out
    for row, record in zip(GOOD[:2], read_records(out)):
        expected = render_chat([{"role": "system", "content": R1_SYSTEM}, {"role": "user", "content": row["question"]}],
                               [tool_schema("calculator"), tool_schema("python")], tokenizer_config=str(QWEN3_TEMPLATE))
        assert str(record["prompt"]) == expected and '"name": "calculator"' in expected
    assert cli.main([*tok_args(tok_dir), "--file_path", str(src), "--output_path", str(tmp_path / "x.mindrecord"),
                     "--tools", "search", "--chat_template", str(QWEN3_TEMPLATE)]) == 1
    assert "unknown tool 'search'" in capsys.readouterr().err
    assert not (tmp_path / "x.mindrecord").exists()
