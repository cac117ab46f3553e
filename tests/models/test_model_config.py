"""A model config file's floats must be finite, like the GRPO config's."""

import dataclasses

import pytest

from mindgrpo.models.config import Qwen2Config


@pytest.mark.parametrize("line", ["rope_theta: .inf", "rms_norm_eps: .nan", "param_init_std: -.inf"])
def test_non_finite_model_config_values_are_refused(tmp_path, line):
    path = tmp_path / "model.yaml"
    path.write_text(f"vocab_size: 64\nhidden_size: 16\nintermediate_size: 32\nnum_hidden_layers: 1\n"
                    f"num_attention_heads: 2\nnum_key_value_heads: 1\n{line}\n")
    with pytest.raises(ValueError, match=f"{line.split(':')[0]} must be a finite number"):
        Qwen2Config.load(str(path))


def test_model_type_picks_the_switches_and_a_config_may_override_them():
    assert (Qwen2Config().qk_norm, Qwen2Config().attention_bias) == (False, True)
    q3 = Qwen2Config(model_type="qwen3")
    assert (q3.qk_norm, q3.attention_bias) == (True, False)
    assert Qwen2Config(model_type="qwen2", qk_norm=True).qk_norm is True
    with pytest.raises(ValueError, match="model_type must be one of \\['qwen2', 'qwen3'\\]"):
        Qwen2Config(model_type="llama")
    with pytest.raises(ValueError, match="attention_bias: true is not supported for qwen3"):
        Qwen2Config(model_type="qwen3", attention_bias=True)
    with pytest.raises(ValueError, match="qk_norm must be true or false"):
        Qwen2Config(model_type="qwen3", qk_norm="yes")
    with pytest.raises(ValueError, match="head_dim must be a positive even integer"):
        Qwen2Config(head_dim=7)


def test_our_yaml_may_name_its_model_type(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("model_type: qwen3\nvocab_size: 64\nhidden_size: 16\nintermediate_size: 32\n"
                    "num_hidden_layers: 1\nnum_attention_heads: 2\nnum_key_value_heads: 1\nhead_dim: 12\n"
                    "param_init_std: 0.5\n")
    cfg = Qwen2Config.load(str(path))
    assert (cfg.model_type, cfg.qk_norm, cfg.attention_bias, cfg.d, cfg.param_init_std) == ("qwen3", True, False, 12, 0.5)
    path.write_text(path.read_text() + "qk_nrom: true\n")
    with pytest.raises(ValueError, match="unknown model config key\\(s\\) \\['qk_nrom'\\]"):
        Qwen2Config.load(str(path))


@pytest.mark.parametrize("model_type, head_dim, tied", [("qwen2", None, False), ("qwen3", 24, True), ("qwen3", 8, False)])
def test_hf_config_and_parameter_count_match_transformers(tmp_path, model_type, head_dim, tied):
    """Our config read from transformers' config.json, written back and read by transformers: the
    same model; num_params equals the HF model's parameter count (an independent count)."""
    import json

    import transformers

    kind = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[model_type]
    extra = {"head_dim": head_dim} if head_dim else {}
    hf_cfg = getattr(transformers, kind + "Config")(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tied, **extra)
    hf_cfg.save_pretrained(str(tmp_path))
    cfg = Qwen2Config.load(str(tmp_path / "config.json"))
    assert cfg.model_type == model_type and cfg.d == (head_dim or 8) and cfg.tie_word_embeddings == tied
    model = getattr(transformers, kind + "ForCausalLM")(hf_cfg)
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    back = transformers.AutoConfig.from_pretrained(str(tmp_path / "ours"))
    assert type(back).__name__ == kind + "Config" and back.head_dim == cfg.d
    assert Qwen2Config.load(str(tmp_path / "ours" / "config.json")) == dataclasses.replace(cfg, head_dim=cfg.d)
