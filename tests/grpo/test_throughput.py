"""perf/* (mindgrpo/grpo/throughput.py): model FLOPs and tokens per second per device against hand
computations."""

import pytest

from mindgrpo.grpo.throughput import forward_flops, perf_metrics, update_flops

SHAPE = dict(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, vocab=10)


def test_forward_flops_hand_case():
    # one sample of 3 tokens, 2 of them scored. Per token and layer: q 4x4, k and v 4x2 each, o 4x4, MLP
    # 3 x 4x8 weights = 144 multiply-adds, 288 FLOPs, x 3 tokens = 864; attention 4 x nh 2 x d 2 per
    # causal pair, 6 pairs = 96; the head 2 x 4 x 10 per scored token x 2 = 160
    assert forward_flops([3], [2], **SHAPE) == 864 + 96 + 160
    # two samples add up; the update is 3 forwards per pass
    assert forward_flops([3, 1], [2, 1], **SHAPE) == 1120 + (288 + 4 * 2 * 2 * 1 + 80)
    assert update_flops([3], [2], passes=2, **SHAPE) == 6 * 1120


def test_perf_metrics_hand_case():
    m = perf_metrics([10, 12], [5, 3], devices=2, seconds={"step": 4.0, "rollout": 1.0, "ref": 0.5, "update": 2.0},
                     flops=1e12, peak_tflops=0.5)
    # (mean prompt 11 + mean response 4) x 2 samples = 30 tokens over 2 devices
    assert m == pytest.approx({"perf/tokens": 30.0, "perf/e2e_tokens_per_s_per_device": 30 / 2 / 4,
                               "perf/rollout_tokens_per_s_per_device": 15.0,
                               "perf/reference_tokens_per_s_per_device": 30.0,
                               "perf/update_tokens_per_s_per_device": 7.5,
                               "perf/update_tflops_per_device": 0.25, "perf/mfu": 0.5})
    # no reference phase (beta 0): no reference figure
    assert "perf/reference_tokens_per_s_per_device" not in perf_metrics(
        [1], [1], 1, {"step": 1.0, "update": 1.0}, 1.0, 1.0)
