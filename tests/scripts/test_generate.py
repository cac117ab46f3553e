"""scripts/generate.py refuses, in one line, a prompt longer than the model's context and missing weights."""

import json

import pytest


@pytest.fixture(scope="module")
def cli():
    from scripts import generate

    return generate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny tokenizer and a 64-position model (policy.ckpt + config.json) in one folder."""
    from mindgrpo.data.synthetic import ArithmeticTask, TinyTokenizerSpec, ensure_tiny_tokenizer
    from mindgrpo.models.checkpoint import model_state, save_ms_checkpoint
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    d = tmp_path_factory.mktemp("model")
    tok = ensure_tiny_tokenizer(str(d), TinyTokenizerSpec(vocab_size=400, task=ArithmeticTask(num_train=300, num_val=50)))
    cfg = Qwen2Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    save_ms_checkpoint({k: ("F32", a) for k, a in model_state(Qwen2ForCausalLM(cfg)).items()}, str(d / "policy.ckpt"))
    (d / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return d


def test_a_prompt_longer_than_the_context_is_one_line(cli, model_dir, capsys):
    from mindgrpo.data.tokenizer import QwenTokenizer

    long = "What is " + " + ".join(["1"] * 40) + "?"
    n = len(QwenTokenizer.from_dir(str(model_dir)).encode(long))
    assert n + 8 > 64
    capsys.readouterr()
    assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--prompt", "What is 1 + 1?", "--prompt", long,
                     "--max_tokens", "8", "--greedy"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"generate: error: prompt 2 is {n} tokens; with --max_tokens 8 it needs {n + 8} positions, more than the "
        "model's context of 64 (max_position_embeddings)"]


def test_missing_weights_say_the_path_does_not_exist(cli, model_dir, tmp_path, capsys):
    missing = tmp_path / "policy.ckpt"
    capsys.readouterr()
    assert cli.main(["--model", str(missing), "--tokenizer_dir", str(model_dir), "--prompt", "x"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"generate: error: {missing}: no such file or folder (the weights path does not exist)"]


def test_an_empty_prompt_is_one_line_naming_it(cli, model_dir, capsys):
    capsys.readouterr()
    assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--prompt", "What is 1 + 1?", "--prompt", "",
                     "--max_tokens", "4", "--greedy"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "generate: error: prompt 2 (--prompt) is empty"]


@pytest.mark.parametrize("sampling, flag", [(["--greedy"], "--greedy"), (["--temperature", "0"], "--temperature 0")])
def test_greedy_with_several_samples_is_refused_as_evaluate_refuses_it(cli, model_dir, capsys, sampling, flag):
    """generate.py and evaluate.py give the same answer, in the same words, to n identical greedy samples."""
    from scripts import evaluate

    capsys.readouterr()
    assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--prompt", "What is 1 + 1?", "--n", "2",
                     *sampling]) == 1
    ours = capsys.readouterr().err.strip().splitlines()
    assert ours == [f"generate: error: --n 2 with {flag} draws 2 identical greedy samples; use --n 1, or sample "
                    "with --temperature > 0"]
    assert evaluate.main(["--model", str(model_dir / "policy.ckpt"), "--data", str(model_dir / "none.jsonl"),
                          "--output", str(model_dir / "out"), "--n", "2", "--temperature", "0"]) == 1
    theirs = capsys.readouterr().err.strip().splitlines()
    assert [line.split(": error: ", 1)[1] for line in theirs] == \
        [ours[0].split(": error: ", 1)[1].replace(flag, "--temperature 0")]


def run_layout(model_dir, folder, tokenizer: bool):
    """A training run's checkpoint folder: checkpoints/step_00000001/{policy.ckpt, config.json}, and the run's
    tokenizer in checkpoints/tokenizer when `tokenizer`."""
    import shutil

    step = folder / "checkpoints" / "step_00000001"
    step.mkdir(parents=True)
    for name in ("policy.ckpt", "config.json"):
        shutil.copy(model_dir / name, step / name)
    if tokenizer:
        (folder / "checkpoints" / "tokenizer").mkdir()
        for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
            shutil.copy(model_dir / name, folder / "checkpoints" / "tokenizer" / name)
    return step / "policy.ckpt"


def test_a_checkpoint_without_a_tokenizer_says_to_pass_tokenizer_dir(cli, model_dir, tmp_path, capsys):
    policy = run_layout(model_dir, tmp_path, tokenizer=False)
    capsys.readouterr()
    assert cli.main(["--model", str(policy), "--prompt", "What is 1 + 1?", "--max_tokens", "4", "--greedy"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("generate: error: no tokenizer (vocab.json, merges.txt) in ")
    assert str(policy.parent) in lines[0] and str(tmp_path / "checkpoints" / "tokenizer") in lines[0]
    assert lines[0].endswith("pass --tokenizer_dir DIR, the folder of the tokenizer the model was trained with")


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_a_runs_checkpoint_finds_the_tokenizer_beside_the_checkpoints(cli, model_dir, tmp_path, capsys):
    """checkpoints/step_N/policy.ckpt alone: the tokenizer comes from checkpoints/tokenizer, the same greedy
    tokens as with --tokenizer_dir."""
    policy = run_layout(model_dir, tmp_path, tokenizer=True)
    common = ["--prompt", "What is 1 + 1?", "--max_tokens", "4", "--greedy"]
    capsys.readouterr()
    assert cli.main(["--model", str(policy), *common]) == 0
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert cli.main(["--model", str(model_dir / "policy.ckpt"), "--tokenizer_dir", str(model_dir), *common]) == 0
    given = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(found) == 1 and found == given
