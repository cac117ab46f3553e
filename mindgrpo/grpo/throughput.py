"""Throughput per step with MindSpeed-RL's definitions, and the update's model FLOPs utilisation:
pure functions of the step's lengths, phase times and the model's shape.

    tokens = (mean prompt + mean response tokens) * samples       # the step's B samples
    perf/e2e_tokens_per_s_per_device     = tokens / devices / step seconds
    perf/<phase>_tokens_per_s_per_device = tokens / devices / the phase's seconds   (rollout, reference, update)
    perf/mfu = update FLOPs / (update seconds * devices * peak FLOP/s of one device)

The update's FLOPs are the model's, not the implementation's: forward + backward (3 x the forward)
over each sample's real tokens, per pass over the batch (`passes`: rl_config.num_iterations). The
forward of a sample of s tokens, r of them response tokens, is 2 x the decoder's matmul weights x s,
the attention's 4 x nh x d per (query, key) pair of each layer over the s (s + 1) / 2 causal pairs,
and the vocabulary head 2 x H x V on the r response tokens only (only their log-probs are needed).
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence

import numpy as np

# the phases of a step (the trainer's Progress phase names) and their perf/ names
PHASES = {"rollout": "rollout", "ref": "reference", "update": "update"}
# a device's peak FLOP/s when rl_config.device_peak_tflops is not given (README, "Throughput")
DEFAULT_PEAK_TFLOPS = {"Ascend": 313.0, "CPU": 0.12}


def forward_flops(seq_lengths: Sequence[int], response_lengths: Sequence[int], *, hidden: int, intermediate: int,
                  layers: int, heads: int, kv_heads: int, head_dim: int, vocab: int) -> float:
    """The model FLOPs of one forward pass over samples of seq_lengths (B,) tokens, response_lengths
    (B,) of them scored by the head."""
    s = np.asarray(seq_lengths, np.float64)
    r = np.asarray(response_lengths, np.float64)
    q, kv = heads * head_dim, kv_heads * head_dim
    per_token = layers * 2 * (hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * intermediate)
    attention = layers * 4 * heads * head_dim * s * (s + 1) / 2
    return float((per_token * s + attention).sum() + 2 * hidden * vocab * r.sum())


def update_flops(seq_lengths: Sequence[int], response_lengths: Sequence[int], passes: int = 1, **shape) -> float:
    """Forward + backward (3 x forward) over the batch, `passes` times."""
    return 3.0 * passes * forward_flops(seq_lengths, response_lengths, **shape)


def model_shape(config) -> Dict[str, int]:
    """forward_flops' keyword arguments from a Qwen2Config."""
    return {"hidden": config.hidden_size, "intermediate": config.intermediate_size,
            "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads, "head_dim": config.hidden_size // config.num_attention_heads,
            "vocab": config.vocab_size}


def perf_metrics(prompt_lengths: Sequence[int], response_lengths: Sequence[int], devices: int,
                 seconds: Mapping[str, float], flops: float, peak_tflops: float) -> Dict[str, float]:
    """perf/* of one step: prompt_lengths and response_lengths (B,) of its samples, the devices of the
    run, seconds {"step": ..., "rollout": ..., "ref": ..., "update": ...} (a phase absent or 0 is left
    out), the update's FLOPs and one device's peak in TFLOP/s."""
    p = np.asarray(prompt_lengths, np.float64)
    r = np.asarray(response_lengths, np.float64)
    tokens = (p.mean() + r.mean()) * p.size
    out = {"perf/tokens": float(tokens)}
    if seconds.get("step", 0) > 0:
        out["perf/e2e_tokens_per_s_per_device"] = float(tokens / devices / seconds["step"])
    for phase, name in PHASES.items():
        if seconds.get(phase, 0) > 0:
            out[f"perf/{name}_tokens_per_s_per_device"] = float(tokens / devices / seconds[phase])
    if seconds.get("update", 0) > 0:
        out["perf/update_tflops_per_device"] = float(flops / seconds["update"] / devices / 1e12)
        out["perf/mfu"] = float(flops / (seconds["update"] * devices * peak_tflops * 1e12))
    return out
