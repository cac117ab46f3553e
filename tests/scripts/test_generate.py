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
