"""The benchmarks' model configs, and the same random weights on both sides (transformers and ours)."""

from __future__ import annotations

CONFIGS = {
    # hidden 256, 4 layers, 4 heads, 2 kv heads, tied; Qwen2.5's vocabulary or a small one
    "tiny-qwen-vocab": dict(vocab_size=151936, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "tiny-small-vocab": dict(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}
# tests only: a micro model that runs a GRPO step in seconds
EXTRA_CONFIGS = {"micro": dict(CONFIGS["tiny-small-vocab"], vocab_size=512, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2)}
ALL_CONFIGS = {**CONFIGS, **EXTRA_CONFIGS}


def hf_model(name: str, seed: int = 0, overrides: dict = None):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**(overrides or CONFIGS[name]), rope_theta=1000000.0, rms_norm_eps=1e-6,
                      max_position_embeddings=4096)
    return Qwen2ForCausalLM(cfg).eval()


def ours_from_hf(hf):
    """Our model with the HF model's weights (through the converter's name table)."""
    from mindgrpo.models.checkpoint import load_state
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.convert import check_state, hf_to_ms_name
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    cfg = Qwen2Config.from_hf_dict(hf.config.to_dict())
    lm = Qwen2ForCausalLM(cfg)
    state = {hf_to_ms_name(k): v.detach().numpy() for k, v in hf.state_dict().items()}
    load_state(lm, check_state(state, cfg, "hf"))
    return lm
