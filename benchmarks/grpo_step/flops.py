"""The useful FLOPs of the GRPO update, and the matmul shapes its peak is measured on."""

from __future__ import annotations

from typing import Dict, List


def update_flops(model: dict, prompt_lens: List[int], new_tokens: int) -> float:
    """Useful FLOPs of one forward + backward (3x the forward) over the real tokens."""
    h, i, v = model["hidden_size"], model["intermediate_size"], model["vocab_size"]
    n_layers = model["num_hidden_layers"]
    d = h // model["num_attention_heads"]
    q, kv = model["num_attention_heads"] * d, model["num_key_value_heads"] * d
    per_token = 2 * (h * q + 2 * h * kv + q * h + 3 * h * i)  # q, k, v, o, gate, up, down
    forward = 0.0
    for p in prompt_lens:
        s = p + new_tokens
        forward += n_layers * (s * per_token + 4 * s * s * q)  # + QK^T and AV, (S, S) per head
        forward += 2 * new_tokens * h * v  # the vocabulary projection of the scored positions
    return 3 * forward


def peak_shapes(m: dict, s: int, new_tokens: int, micro_batch: int) -> Dict[str, tuple]:
    """Square matmuls and the update's two largest matmuls of one micro-batch of model config m,
    sequences of s tokens (prompt + response)."""
    return {"square 1024": (1024, 1024, 1024), "square 2048": (2048, 2048, 2048),
            "MLP up (B*S, H) @ (H, I)": (micro_batch * s, m["hidden_size"], m["intermediate_size"]),
            "vocab head (B*R, H) @ (H, V)": (micro_batch * new_tokens, m["hidden_size"], m["vocab_size"])}
