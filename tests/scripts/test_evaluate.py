"""scripts/evaluate.py: a run on a random micro model whose summary.json agrees with its samples.jsonl
(recomputed here by enumeration and counting), the same samples however the problems are chunked,
bad input refused in one line naming the file, and GSM8K problems (a MindRecord made by
data_tools/rlhf_data.py, and the .jsonl itself) with the real Qwen2.5 tokenizer and a random model of
its vocabulary (skipped when ../shared is absent)."""

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
QWEN_DIR = SHARED / "tokenizers" / "qwen2_5"
GSM8K = SHARED / "data" / "gsm8k" / "test.jsonl"

# a reward right on about half of random completions, so that pass@k, mean@K and maj@K are not all 0
PLUGIN = ("from mindgrpo.rewards import register_reward\n\n"
          "@register_reward('even_length')\n"
          "def even_length(completions, **_):\n"
          "    return [1.0 if len(c) % 2 == 0 else 0.0 for c in completions]\n")


@pytest.fixture(scope="module")
def cli():
    from scripts import evaluate

    return evaluate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny tokenizer, a random 1-layer model (policy.ckpt + config.json) and the synthetic task's
    validation problems as a prompt MindRecord, in one folder."""
    from mindgrpo.data.synthetic import ArithmeticTask, TinyTokenizerSpec, ensure_tiny_tokenizer, write_arithmetic_dataset
    from mindgrpo.models.checkpoint import model_state, save_ms_checkpoint
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    d = tmp_path_factory.mktemp("model")
    task = ArithmeticTask(num_train=40, num_val=12)
    tok = ensure_tiny_tokenizer(str(d), TinyTokenizerSpec(vocab_size=400, task=task))
    cfg = Qwen2Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    save_ms_checkpoint({k: ("F32", a) for k, a in model_state(Qwen2ForCausalLM(cfg)).items()}, str(d / "policy.ckpt"))
    (d / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    write_arithmetic_dataset(str(d / "data"), tok, task, template="raw", max_prompt_length=32)
    (d / "my_rewards.py").write_text(PLUGIN)
    return d


def read_outputs(out):
    summary = json.loads((out / "summary.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return summary, samples


def recompute(samples, K):
    """pass@k by enumerating every draw of k of a problem's K samples, mean@K, maj@K by counting votes."""
    by_problem = {}
    for s in samples:
        by_problem.setdefault(s["problem"], []).append(s)
    out = {}
    k = 1
    while True:
        k = min(k, K)
        rates = [np.mean([any(rows[j]["correct"] for j in d) for d in itertools.combinations(range(K), k)])
                 for rows in by_problem.values()]
        out[f"pass@{k}"] = float(np.mean(rates))
        if k == K:
            break
        k *= 2
    out[f"mean@{K}"] = float(np.mean([s["correct"] for s in samples]))
    maj = []
    for rows in by_problem.values():
        votes = Counter(r["answer_key"] for r in rows if r["answer_key"] is not None)
        if not votes:
            maj.append(0.0)
            continue
        top = max(votes.values())
        winner = next(r for r in rows if r["answer_key"] is not None and votes[r["answer_key"]] == top)
        maj.append(float(winner["correct"]))
    out[f"maj@{K}"] = float(np.mean(maj))
    return out


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
def test_summary_agrees_with_the_samples_and_chunking_changes_no_sample(cli, model_dir, tmp_path, capsys):
    common = ["--model", str(model_dir / "policy.ckpt"), "--data", str(model_dir / "data" / "val.mindrecord"),
              "--n", "4", "--temperature", "1.0", "--max_tokens", "8", "--limit", "6", "--seed", "3",
              "--reward", "even_length", "--reward_plugin", str(model_dir / "my_rewards.py"), "--num_workers", "1"]
    assert cli.main([*common, "--output", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    assert "pass@4" in captured.out and "tok/s" in captured.err and "ETA" in captured.err
    summary, samples = read_outputs(tmp_path / "a")
    assert len(samples) == 24 and summary["problems"] == 6 and summary["n"] == 4
    assert [(s["problem"], s["sample"]) for s in samples] == [(p, j) for p in range(6) for j in range(4)]
    assert all(s["correct"] == (s["score"] >= 1.0) for s in samples)
    assert 0 < summary["metrics"]["mean@4"] < 1  # the check below is not between zeros
    assert summary["metrics"] == pytest.approx(recompute(samples, 4), abs=1e-12)
    assert summary["generated_tokens"] == sum(s["tokens"] for s in samples)
    # 8 slots take 2 problems of 4 samples per call: three calls instead of one, the same samples
    assert cli.main([*common, "--output", str(tmp_path / "b"), "--max_num_seqs", "8"]) == 0
    _, chunked = read_outputs(tmp_path / "b")
    assert [s["completion"] for s in chunked] == [s["completion"] for s in samples]


def test_greedy_pass_at_1_is_the_accuracy(cli, model_dir, tmp_path):
    assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--data", str(model_dir / "data" / "val.mindrecord"),
                     "--max_tokens", "6", "--limit", "5", "--num_workers", "0", "--output", str(tmp_path)]) == 0
    summary, samples = read_outputs(tmp_path)
    assert sorted(summary["metrics"]) == ["maj@1", "mean@1", "pass@1"]
    assert summary["metrics"]["pass@1"] == pytest.approx(np.mean([s["correct"] for s in samples]))
    assert summary["temperature"] == 0.0 and len(samples) == 5


def one_error_line(capsys):
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_input_is_one_line_naming_the_file(cli, model_dir, tmp_path, capsys):
    from mindgrpo.data.mindrecord import write_mindrecord

    data = str(model_dir / "data" / "val.mindrecord")
    base = ["--model", str(model_dir / "policy.ckpt"), "--data", data, "--output", str(tmp_path / "out"),
            "--num_workers", "0", "--max_tokens", "4"]
    capsys.readouterr()
    missing = tmp_path / "nope.ckpt"
    assert cli.main([*base, "--model", str(missing), "--tokenizer_dir", str(model_dir)]) == 1
    assert one_error_line(capsys) == f"evaluate: error: {missing}: no such file or folder (the weights path does not exist)"
    assert cli.main([*base, "--data", str(tmp_path / "none.mindrecord")]) == 1
    assert one_error_line(capsys) == f"evaluate: error: {tmp_path / 'none.mindrecord'}: no such file (--data)"
    assert cli.main([*base, "--tokenizer_dir", str(tmp_path)]) == 1
    assert one_error_line(capsys).startswith(f"evaluate: error: {tmp_path / 'vocab.json'}: no such file")
    odd = str(tmp_path / "odd.mindrecord")
    write_mindrecord(odd, {"prompt_ids": {"type": "int32", "shape": [-1]}, "question": {"type": "string"}},
                     [[{"prompt_ids": np.array([1, 2], np.int32), "question": "q"}]])
    assert cli.main([*base, "--data", odd]) == 1
    line = one_error_line(capsys)
    assert line.startswith(f"evaluate: error: {odd}: missing column(s)") and "solution" in line
    assert cli.main([*base, "--n", "4"]) == 1
    assert "--temperature 0" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.fixture(scope="module")
def qwen_vocab_model(tmp_path_factory):
    """A random 1-layer model of Qwen2.5's vocabulary and 3 GSM8K test problems as a MindRecord."""
    if not (QWEN_DIR / "vocab.json").is_file() or not GSM8K.is_file():
        pytest.skip(f"the Qwen2.5 tokenizer or GSM8K is not under {SHARED} (read-only ../shared is absent)")
    from data_tools import rlhf_data
    from mindgrpo.models.checkpoint import model_state, save_ms_checkpoint
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    d = tmp_path_factory.mktemp("qwen_vocab")
    cfg = Qwen2Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    save_ms_checkpoint({k: ("F32", a) for k, a in model_state(Qwen2ForCausalLM(cfg)).items()}, str(d / "model.ckpt"))
    (d / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    assert rlhf_data.main(["--vocab_path", str(QWEN_DIR / "vocab.json"), "--merges_file_path",
                           str(QWEN_DIR / "merges.txt"), "--tokenizer_config", str(QWEN_DIR / "tokenizer_config.json"),
                           "--file_path", str(GSM8K), "--output_path", str(d / "gsm8k.mindrecord"), "--limit", "3"]) == 0
    return d


@pytest.mark.slow  # 30 s of CPU: 104 s wall beside other jobs (load 7)
def test_gsm8k_mindrecord_and_jsonl_with_a_random_qwen_vocabulary_model(cli, qwen_vocab_model, tmp_path):
    d = qwen_vocab_model
    common = ["--model", str(d / "model.ckpt"), "--tokenizer_dir", str(QWEN_DIR), "--n", "2", "--temperature", "1.0",
              "--max_tokens", "8", "--num_workers", "1", "--max_num_seqs", "8"]
    assert cli.main([*common, "--data", str(d / "gsm8k.mindrecord"), "--output", str(tmp_path / "mr")]) == 0
    summary, samples = read_outputs(tmp_path / "mr")
    assert summary["problems"] == 3 and len(samples) == 6 and summary["reward"] == "accuracy"
    assert summary["metrics"] == pytest.approx(recompute(samples, 2), abs=1e-12)
    first = json.loads(GSM8K.read_text().splitlines()[0])
    assert samples[0]["solution"] == first["answer"].rsplit("####", 1)[1].strip()
    # the .jsonl, templated here as rlhf_data.py templates it: the same prompts, so the same samples
    assert cli.main([*common, "--data", str(GSM8K), "--limit", "3", "--output", str(tmp_path / "jsonl")]) == 0
    _, from_jsonl = read_outputs(tmp_path / "jsonl")
    assert [(s["prompt"], s["completion"]) for s in from_jsonl] == [(s["prompt"], s["completion"]) for s in samples]


def test_a_reward_plugin_with_a_syntax_error_is_one_line_naming_its_line(cli, model_dir, tmp_path, capsys):
    broken = tmp_path / "broken_rewards.py"
    broken.write_text("from mindgrpo.rewards import register_reward\n\n"
                      "@register_reward('oops')\n"
                      "def oops(completions, **_)\n"
                      "    return [0.0 for _ in completions]\n")
    capsys.readouterr()
    assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--data", str(model_dir / "data" / "val.mindrecord"),
                     "--output", str(tmp_path / "out"), "--num_workers", "0", "--max_tokens", "4",
                     "--reward", "oops", "--reward_plugin", str(broken)]) == 1
    assert one_error_line(capsys) == f"evaluate: error: {broken}:4: SyntaxError: expected ':' (--reward_plugin)"
    assert not (tmp_path / "out").exists()


def test_jsonl_rows_without_answers_say_which_keys_are_read(cli, model_dir, tmp_path, capsys):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": "What is 1 + 1?"}) + "\n")
    capsys.readouterr()
    assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--tokenizer_dir", str(model_dir), "--data",
                     str(questions), "--output", str(tmp_path / "out"), "--num_workers", "0"]) == 1
    line = one_error_line(capsys)
    assert line == (f"evaluate: error: {questions}:1: a row needs a question and its answer, read from the keys "
                    "question and answer (GSM8K: the final answer after '####') or problem and solution (MATH: the "
                    "final answer in the last \\boxed{}); this row has ['question']")
    assert "--map_keys" not in line and "--dataset_type" not in line


def test_an_output_that_is_a_file_is_refused_before_any_work(cli, model_dir, tmp_path, capsys, monkeypatch):
    taken = tmp_path / "results"
    taken.write_text("not a folder")
    import mindgrpo.models.checkpoint as checkpoint

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before --output was checked")

    monkeypatch.setattr(checkpoint, "load_model", no_model)
    capsys.readouterr()
    for output in (taken, taken / "sub"):
        assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--data", str(model_dir / "data" / "val.mindrecord"),
                         "--output", str(output), "--num_workers", "0", "--max_tokens", "4"]) == 1
        assert one_error_line(capsys) == (f"evaluate: error: --output {output}: {taken} is a file; --output names "
                                          "the folder for summary.json and samples.jsonl")
    assert taken.read_text() == "not a folder"


def test_a_wrong_tokenizer_names_tokenizer_dir(cli, model_dir, tmp_path, capsys):
    """A tokenizer of more tokens than the model's vocabulary, given with --tokenizer_dir: the line names the flag
    and its folder, not the data."""
    from mindgrpo.data.synthetic import ArithmeticTask, TinyTokenizerSpec, ensure_tiny_tokenizer

    other = tmp_path / "other_tokenizer"
    tok = ensure_tiny_tokenizer(str(other), TinyTokenizerSpec(vocab_size=600, task=ArithmeticTask(num_train=40,
                                                                                                 num_val=12)))
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n")
    capsys.readouterr()
    for data in (questions, model_dir / "data" / "val.mindrecord"):
        assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--tokenizer_dir", str(other), "--data", str(data),
                         "--output", str(tmp_path / "out"), "--num_workers", "0", "--max_tokens", "4"]) == 1
        line = one_error_line(capsys)
        assert line.startswith(f"evaluate: error: --tokenizer_dir {other}: its tokenizer has {tok.vocab_size} "
                               f"tokens, more than the model's vocabulary of "), line
        assert line.endswith("pass the tokenizer the model was trained with"), line


@pytest.fixture(scope="module")
def reward_model_dir(model_dir, tmp_path_factory):
    """A random HF reward model (Qwen2ForSequenceClassification, one label) of the tiny tokenizer's vocabulary,
    the tokenizer's files beside it."""
    import shutil

    from hf_models import make_hf_reward_model
    from mindgrpo.data.tokenizer import QwenTokenizer

    d = tmp_path_factory.mktemp("rm")
    tok = QwenTokenizer.from_dir(str(model_dir))
    hf = make_hf_reward_model(str(d), vocab=tok.vocab_size, hidden=32, inter=64, layers=1, heads=4, kv_heads=2,
                              max_pos=128, seed=11, std=0.3)
    for f in model_dir.iterdir():
        if f.name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
            shutil.copy(f, d / f.name)
    return d, hf, tok


@pytest.mark.slow
def test_score_only_writes_each_row_back_with_transformers_score(cli, reward_model_dir, tmp_path, capsys):
    from hf_models import hf_reward_scores
    from mindgrpo.data.templates import render_prompt

    d, hf, tok = reward_model_dir
    rows = [{"prompt": "1+2=", "completion": "3", "id": 0}, {"prompt": "12+30=", "completion": "42 done", "id": 1},
            {"prompt": "7+8=", "completion": "14", "id": 2, "label": "rejected"}, {"prompt": "5+5=", "completion": "10"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for template in ("raw", "qwen_r1"):
        out = tmp_path / f"{template}.jsonl"
        assert cli.main(["--score_only", "--input", str(tmp_path / "rows.jsonl"), "--reward_model", str(d),
                         "--output", str(out), "--template", template, "--rm_micro_batch_size", "3"]) == 0
        got = [json.loads(line) for line in out.read_text().splitlines()]
        assert [{k: v for k, v in g.items() if k != "score"} for g in got] == rows  # every row, in order
        texts = [(r["prompt"] if template == "raw" else render_prompt(template, r["prompt"])) + r["completion"]
                 for r in rows]
        seqs = [tok.encode(t) for t in texts]
        s = max(len(q) for q in seqs)
        ids, mask = np.zeros((len(seqs), s), np.int64), np.zeros((len(seqs), s), np.int64)
        for i, q in enumerate(seqs):
            ids[i, :len(q)], mask[i, :len(q)] = q, 1
        assert 0 not in [t for q in seqs for t in q]  # HF pools at the last token that is not its pad id 0
        ref = hf_reward_scores(hf, ids, mask)
        assert np.abs(np.array([g["score"] for g in got]) - ref).max() <= 1e-4
    assert "scored 4 rows" in capsys.readouterr().err


def test_score_only_bad_rows_are_one_line_naming_file_and_line(cli, reward_model_dir, tmp_path, capsys):
    d, _, _ = reward_model_dir
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n')
    out = tmp_path / "out.jsonl"
    assert cli.main(["--score_only", "--input", str(tmp_path / "rows.jsonl"), "--reward_model", str(d),
                     "--output", str(out)]) == 1
    err = one_error_line(capsys)
    assert f"rows.jsonl:2" in err and "completion" in err and not out.exists()
    assert cli.main(["--score_only", "--input", str(tmp_path / "rows.jsonl"), "--output", str(out)]) == 1
    assert "--score_only needs --reward_model" in one_error_line(capsys)


@pytest.mark.slow
def test_reward_model_scores_every_sample_beside_pass_at_k(cli, model_dir, reward_model_dir, tmp_path):
    d, _, _ = reward_model_dir
    assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--data", str(model_dir / "data" / "val.mindrecord"),
                     "--n", "2", "--temperature", "1.0", "--max_tokens", "6", "--limit", "3", "--num_workers", "0",
                     "--reward_model", str(d), "--output", str(tmp_path)]) == 0
    summary, samples = read_outputs(tmp_path)
    scores = np.array([s["rm_score"] for s in samples]).reshape(3, 2)
    assert np.ptp(scores) > 0 and "pass@2" in summary["metrics"]
    np.testing.assert_allclose(summary["reward_model"]["per_problem"], scores.mean(1), rtol=1e-6)
    assert summary["reward_model"]["mean"] == pytest.approx(scores.mean())


TOOLS_TEMPLATE = Path(__file__).resolve().parents[2] / "model_configs" / "qwen_grpo" / "tiny_tools" / \
    "tokenizer_config.json"
QUESTIONS = [("What is 123 + 456 + 789?", 1368), ("What is 500 + 321 + 99?", 920), ("What is 111 + 222 + 333?", 666)]


def scripted_tool_engine(tokenizer, made):
    """RolloutEngine as evaluate.py uses it, a script instead of a model, driving the real ToolTurns as the engine
    does: sample 0 of a problem calls the calculator on the question's sum, then boxes what the tool answered
    (read from the appended tool turn); sample 1 boxes 0 at once."""
    import re

    from mindgrpo.inference.engine import Completion

    stop = tokenizer.stop_token_ids[0]

    class Engine:
        def __init__(self, lm, pad_token_id, max_num_seqs, max_model_len):
            self.max_num_seqs, self.max_model_len, self.calls = max_num_seqs, max_model_len, []
            self.last_stats = {"seconds": 1.0, "turns_cut": 0}  # it appends every tool turn
            made.append(self)

        def generate(self, prompts, params, prompt_index=None, turns=None):
            self.calls.append((len(prompts), list(prompt_index), turns))
            out = []
            for i, prompt in enumerate(prompts):
                question = tokenizer.decode(prompt).split("What is ")[1].split("?")[0]
                for j in range(params.n):
                    request = i * params.n + j
                    text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
                            % question) if j == 0 else "\\boxed{0}"
                    ids = tokenizer.encode(text) + [stop]
                    mask = [True] * len(ids)
                    if turns.end_turn(request, i, ids):
                        ready = []
                        while not ready:
                            ready = [t for r, t in turns.poll(True) if r == request]
                        answer = re.search(r"<tool_response>\n(.*?)\n</tool_response>", tokenizer.decode(ready[0]))
                        final = tokenizer.encode("\\boxed{%s}" % answer.group(1)) + [stop]
                        ids, mask = ids + ready[0] + final, mask + [False] * len(ready[0]) + [True] * len(final)
                    mask = np.array(mask)
                    logp = np.where(mask, -0.5, 0.0).astype(np.float32)
                    out.append(Completion(i, ids, "stop", logp, logp, mask, int((~mask).any())))
            return out

    return Engine


def test_tools_run_in_the_evaluation_and_their_metrics_are_reported(cli, model_dir, tmp_path, monkeypatch, capsys):
    """--tools calculator on .jsonl problems: the prompts offer the tool through the chat template (as the trainer
    writes them), the engine gets the conversations (all problems in one call), the rewards see the trajectory and
    the tool_calls column, summary.json reports tool/* and turns/* beside pass@k, the tool workers are closed.
    A scripted engine and a stand-in model (no graphs): the conversations and the tool pool are real."""
    import types

    from mindgrpo.data.tokenizer import QwenTokenizer
    from mindgrpo.models import checkpoint

    tokenizer, made = QwenTokenizer.from_dir(str(model_dir)), []
    monkeypatch.setattr("mindgrpo.inference.engine.RolloutEngine", scripted_tool_engine(tokenizer, made))
    lm = types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=tokenizer.vocab_size),
                               rope_cos=np.zeros((512, 1)))
    monkeypatch.setattr(checkpoint, "load_model", lambda path, config=None: lm)
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": f"{a} #### {a}"}) + "\n" for q, a in QUESTIONS))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    common = ["--model", str(model_dir / "policy.ckpt"), "--tokenizer_dir", str(model_dir), "--data", str(data),
              "--template", "raw", "--n", "2", "--temperature", "1.0", "--max_tokens", "64", "--num_workers", "0",
              "--chat_template", str(TOOLS_TEMPLATE)]
    assert cli.main([*common, "--tools", "calculator", "--max_turns", "1", "--tool_response_max_tokens", "16",
                     "--tool_num_workers", "1", "--output", str(tmp_path / "out")]) == 0
    summary, samples = read_outputs(tmp_path / "out")
    (calls, index, turns), = made[0].calls
    assert calls == 3 and index == [0, 1, 2] and turns is not None
    assert made[0].max_model_len > max(len(tokenizer.encode(s["prompt"])) for s in samples) + 64  # + the tool turn
    assert all(s["prompt"].startswith("<|im_start|>system\nTools: calculator(expression)\n") for s in samples)
    assert [s["correct"] for s in samples] == [True, False] * 3  # the tool's sums, boxed
    assert [s["turns"] for s in samples] == [1, 0] * 3
    assert samples[0]["tool_calls"] == [{"name": "calculator", "arguments": {"expression": "123 + 456 + 789"},
                                         "status": "ok", "response": "1368"}]
    assert summary["metrics"]["mean@2"] == 0.5 and summary["tools"] == "calculator"
    conv = summary["conversations"]
    assert conv["tool/calls_mean"] == 0.5 and conv["tool/errors"] == conv["tool/timeouts"] == 0
    assert conv["turns/mean"] == 0.5 and conv["tool/samples_with_calls"] == 0.5 and conv["turns/masked_fraction"] > 0
    assert "tool/calls_mean" in capsys.readouterr().out  # the printed table
    assert not list(tmp.glob("mindgrpo-tools-*"))  # the tool workers' folder, removed at the end
    # flags that cannot act, or name nothing registered: one line naming the flag
    capsys.readouterr()
    assert cli.main([*common, "--max_turns", "2", "--output", str(tmp_path / "no")]) == 1
    line = one_error_line(capsys)
    assert line.startswith("evaluate: error: --max_turns: has no effect without generate_config.tools"), line
    assert cli.main([*common, "--tools", "abacus", "--output", str(tmp_path / "no")]) == 1
    assert one_error_line(capsys).startswith("evaluate: error: --tools: names unknown tool(s) ['abacus']")
    assert not (tmp_path / "no").exists()

