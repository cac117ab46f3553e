"""Rollout/training mismatch: the rollout corrections (truncated and masked importance weights per
token and per sequence), the mismatch metrics, and their wiring through the training graph, the
updater and the trainer, on given rollout log-probs.

TRL computes its vLLM importance-sampling ratio inside the 440-line `_generate_and_score_completions`
(TRL 1.16.0 grpo_trainer.py lines 2660-2708) and its mismatch metrics there too (lines 2860-2870):
`trl_is_ratio` and `trl_mismatch` restate those lines; the ratio then goes through TRL's own
`_compute_loss` (`TRLLoss` of test_algos.py), which applies it.
"""

import math
from dataclasses import replace

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import Tensor, nn

from mindgrpo.config import ConfigError, GRPOConfig, load_config
from mindgrpo.grpo import algos, corrections, ms_algos, ms_corrections
from mindgrpo.grpo.actor import PolicyUpdater, Scorer
from mindgrpo.grpo.corrections import ROLLOUT_CORRECTIONS, mismatch_metrics
from mindgrpo.grpo.experience import pack
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.objective import grpo_loss
from mindgrpo.grpo.optim import AdamWSettings
from mindgrpo.grpo.packing import Batching
from mindgrpo.grpo.train_graph import CORRECTION_KEYS, METRIC_KEYS, MISMATCH_KEYS
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from test_algos import HAND_ADV, HAND_MASK, TRLLoss, random_batch, torch_of

LN = math.log
FP32_CONST = 1e-7
# our mode -> TRL's vllm_importance_sampling_mode and its (clip_min, clip_max) for threshold c
TRL_MODES = {
    "tis_token": ("token_truncate", lambda c: (None, c)),
    "tis_sequence": ("sequence_truncate", lambda c: (None, c)),
    "mask_token": ("token_mask", lambda c: (1 / c, c)),
    "mask_sequence": ("sequence_mask", lambda c: (1 / c, c)),
}
# old log-probs by hand: token ratios to a rollout log-prob of 0: [0.5, 0.9, (padding)], [1.0, 3.0, 0.2]
HAND_OLD = np.log([[0.5, 0.9, 1.0], [1.0, 3.0, 0.2]])


def trl_is_ratio(old, sampling, mask, mode, clip_min, clip_max):
    """TRL 1.16.0 grpo_trainer.py lines 2660-2708 (no tool mask)."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), value=0.0)


def trl_mismatch(old, sampling, mask):
    """TRL 1.16.0 grpo_trainer.py lines 2860-2870: sampling/sampling_logp_difference/{mean, max}."""
    delta = torch.abs(old - sampling)
    delta = delta[mask.bool() & ~torch.isnan(delta)]
    return torch.mean(delta).item(), torch.max(delta).item()


def correct(mode, old=HAND_OLD, rollout=np.zeros((2, 3)), mask=HAND_MASK, threshold=2.0):
    return ROLLOUT_CORRECTIONS.get(mode)(old, rollout, mask, rollout_correction_threshold=threshold)


# ---------------------------------------------------------------------------------------
# by hand, loops, TRL
# ---------------------------------------------------------------------------------------


def test_corrections_by_hand():
    # threshold 2: tokens keep weights in [0.5, 2]; padding has weight 1 (its log-ratio is masked to 0)
    np.testing.assert_allclose(correct("tis_token"), [[0.5, 0.9, 1.0], [1.0, 2.0, 0.2]], rtol=1e-15)
    np.testing.assert_allclose(correct("mask_token"), [[0.5, 0.9, 1.0], [1.0, 0.0, 0.0]], rtol=1e-15)
    # sequences: 0.5 * 0.9 = 0.45 and 1 * 3 * 0.2 = 0.6
    np.testing.assert_allclose(correct("tis_sequence"), [[0.45], [0.6]], rtol=1e-15)
    np.testing.assert_allclose(correct("mask_sequence"), [[0.0], [0.6]], rtol=1e-15)
    assert ROLLOUT_CORRECTIONS.get("none")(HAND_OLD, np.zeros((2, 3)), HAND_MASK) is None
    # a huge log-ratio is capped (tis) or dropped (mask), never inf or nan
    huge = np.array([[800.0, -800.0]])
    np.testing.assert_array_equal(correct("tis_token", huge, np.zeros((1, 2)), np.ones((1, 2))), [[2.0, 0.0]])
    np.testing.assert_array_equal(correct("mask_sequence", huge[:, :1], np.zeros((1, 1)), np.ones((1, 1))), [[0.0]])


def test_correction_metrics_by_hand():
    ratios = {"tis_token": ((0.5 + 0.9 + 1 + 2 + 0.2) / 5, 2.0, 1 / 5),  # mean, max, clipfrac over 5 tokens
              "mask_token": ((0.5 + 0.9 + 1 + 0 + 0) / 5, 1.0, 2 / 5),
              "tis_sequence": ((2 * 0.45 + 3 * 0.6) / 5, 0.6, 0.0),
              "mask_sequence": ((3 * 0.6) / 5, 0.6, 2 / 5)}
    for mode, (mean, high, clipped) in ratios.items():
        _, m = grpo_loss(HAND_OLD, HAND_OLD, None, HAND_ADV, HAND_MASK, rollout_logp=np.zeros((2, 3)),
                         rollout_correction=mode)
        assert m["rollout_correction/weight_mean"] == pytest.approx(mean, rel=1e-12), mode
        assert m["rollout_correction/weight_max"] == pytest.approx(high, rel=1e-12), mode
        assert m["rollout_correction/clipfrac"] == pytest.approx(clipped), mode
    # the weight multiplies the policy loss: on-policy (ratio 1) ppo_clip per-token loss is -A,
    # token-mean with tis_token: -(0.5 + 0.9) * 1 + (1 + 2 + 0.2) * 1 = 1.8 over 5 tokens
    loss, _ = grpo_loss(HAND_OLD, HAND_OLD, None, HAND_ADV, HAND_MASK, rollout_logp=np.zeros((2, 3)),
                        rollout_correction="tis_token")
    assert loss == pytest.approx(1.8 / 5)
    # no rollout log-probs, or "none": no weight, no metrics
    for kw in (dict(rollout_correction="tis_token"), dict(rollout_logp=np.zeros((2, 3)))):
        loss, m = grpo_loss(HAND_OLD, HAND_OLD, None, HAND_ADV, HAND_MASK, **kw)
        assert loss == pytest.approx((-1 - 1 + 1 + 1 + 1) / 5) and not any("rollout" in k for k in m)


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(HAND_OLD, np.zeros((2, 3)), HAND_MASK)
    d = [LN(0.5), LN(0.9), 0.0, LN(3.0), LN(0.2)]  # train - rollout on the 5 tokens
    assert m["mismatch/abs_diff_mean"] == pytest.approx(sum(abs(x) for x in d) / 5)
    assert m["mismatch/abs_diff_max"] == pytest.approx(LN(5.0))
    assert m["mismatch/k3"] == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / 5)
    assert m["mismatch/log_ppl_ratio"] == pytest.approx(-sum(d) / 5)
    assert mismatch_metrics(HAND_OLD, HAND_OLD, np.zeros((2, 3)))["mismatch/abs_diff_max"] == 0.0


def test_mismatch_metrics_loop_vs_vectorised():
    rng = np.random.default_rng(30)
    _, train, rollout, _, mask = random_batch(rng, B=8, spread=0.6)
    mask[3] = 0.0  # an empty row counts for nothing
    m = mismatch_metrics(train, rollout, mask)
    diffs = [train[i, j] - rollout[i, j] for i in range(8) for j in range(7) if mask[i, j]]
    n = len(diffs)
    assert m["mismatch/abs_diff_mean"] == pytest.approx(sum(abs(d) for d in diffs) / n, rel=1e-12)
    assert m["mismatch/abs_diff_max"] == max(abs(d) for d in diffs)
    # k3 of KL(rollout || train) per token: with x = log(train / rollout), exp(x) - x - 1 >= 0
    assert m["mismatch/k3"] == pytest.approx(sum(math.exp(d) - d - 1 for d in diffs) / n, rel=1e-12)
    # training perplexity / rollout perplexity, each exp(-mean log-prob) over the same tokens
    ppl_train = math.exp(-sum(train[i, j] for i in range(8) for j in range(7) if mask[i, j]) / n)
    ppl_rollout = math.exp(-sum(rollout[i, j] for i in range(8) for j in range(7) if mask[i, j]) / n)
    assert math.exp(m["mismatch/log_ppl_ratio"]) == pytest.approx(ppl_train / ppl_rollout, rel=1e-12)


@pytest.mark.parametrize("mode", list(TRL_MODES))
def test_corrections_loop_vs_vectorised(mode):
    rng = np.random.default_rng(31)
    _, old, rollout, _, mask = random_batch(rng, B=8, spread=0.6)
    c = 1.5
    w = correct(mode, old, rollout, mask, c)
    for i in range(8):
        toks = [j for j in range(7) if mask[i, j]]
        if mode.endswith("sequence"):
            r = math.exp(sum(old[i, j] - rollout[i, j] for j in toks))
            expected = min(r, c) if mode.startswith("tis") else (r if 1 / c <= r <= c else 0.0)
            assert w[i, 0] == pytest.approx(expected, rel=1e-12)
            continue
        for j in toks:
            r = math.exp(old[i, j] - rollout[i, j])
            expected = min(r, c) if mode.startswith("tis") else (r if 1 / c <= r <= c else 0.0)
            assert w[i, j] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("loss_type,agg", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean")])
@pytest.mark.parametrize("mode", list(TRL_MODES))
def test_corrections_match_trl(mode, loss_type, agg):
    rng = np.random.default_rng(32)
    logp, old, ref, adv, mask = random_batch(rng, B=8, spread=0.5)
    rollout = old + rng.normal(0.0, 0.3, old.shape)  # the engine's log-probs, a little off
    c = 1.6 if mode.endswith("token") else 1.5
    trl_mode, (lo, hi) = TRL_MODES[mode][0], TRL_MODES[mode][1](c)
    t_logp, t_old, t_ref, t_adv, t_mask, t_rollout = torch_of(logp, old, ref, adv, mask, rollout)
    ratio = trl_is_ratio(t_old, t_rollout, t_mask, trl_mode, lo, hi)
    expected, _ = TRLLoss(loss_type, 0.04, 0.2, 0.28, 10)(t_logp, t_old, t_ref, t_adv, t_mask, is_ratio=ratio)
    loss, m = grpo_loss(logp, old, ref, adv, mask, beta=0.04, kl_kind="k3", agg_mode=agg, clip_low=0.2,
                        clip_high=0.28, rollout_logp=rollout, rollout_correction=mode, rollout_correction_threshold=c)
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    assert 0 < m["rollout_correction/clipfrac"] < 1  # the case truncates or masks some, not all
    mean, high = trl_mismatch(t_old, t_rollout, t_mask)
    mm = mismatch_metrics(old, rollout, mask)
    assert mm["mismatch/abs_diff_mean"] == pytest.approx(mean, rel=1e-12)
    assert mm["mismatch/abs_diff_max"] == pytest.approx(high, rel=1e-12)


# ---------------------------------------------------------------------------------------
# MindSpore
# ---------------------------------------------------------------------------------------


def t(x, dtype=ms.float64):
    return Tensor(np.asarray(x), dtype)


class LossAndMismatch(nn.Cell):
    """GRPOLoss with a rollout correction, and the mismatch metrics of the same inputs (one graph)."""

    def __init__(self, **kw):
        super().__init__()
        self.loss = GRPOLoss(**kw)

    def construct(self, logp, old_logp, ref_logp, advantages, mask, rollout_logp):
        loss, metrics = self.loss(logp, old_logp, ref_logp, advantages, mask, None, None, None, rollout_logp)
        return loss, metrics, ms_corrections.mismatch_metrics(old_logp, rollout_logp, mask)


@pytest.mark.parametrize("mode", ["none"] + list(TRL_MODES))
def test_ms_corrections_match_numpy(graph_mode, mode):
    rng = np.random.default_rng(33)
    logp, old, ref, adv, mask = random_batch(rng, B=8, spread=0.5)
    rollout = old + rng.normal(0.0, 0.25, old.shape)
    kw = dict(beta=0.04, kl_kind="k3", agg_mode="token-mean", rollout_correction=mode,
              rollout_correction_threshold=1.6)
    loss, metrics, mismatch = LossAndMismatch(**kw)(t(logp), t(old), t(ref), t(adv), t(mask), t(rollout))
    np_loss, np_metrics = grpo_loss(logp, old, ref, adv, mask, rollout_logp=rollout, **kw)
    assert loss.asnumpy() == pytest.approx(np_loss, rel=FP32_CONST, abs=FP32_CONST)
    assert set(metrics) == set(np_metrics)
    for key, value in np_metrics.items():
        assert metrics[key].asnumpy() == pytest.approx(value, rel=FP32_CONST, abs=FP32_CONST), key
    # the graph's mismatch metrics, in MISMATCH_KEYS order (float64 inputs: only rounding differs)
    np_mismatch = mismatch_metrics(old, rollout, mask)
    assert np_mismatch["mismatch/abs_diff_max"] > 0.5
    for key, value in zip(MISMATCH_KEYS, mismatch):
        assert value.asnumpy() == pytest.approx(np_mismatch[key], rel=1e-12, abs=1e-15), key


def test_ms_correction_gradient_matches_trl_autograd(graph_mode):
    rng = np.random.default_rng(34)
    logp, old, ref, adv, mask = random_batch(rng, B=6, spread=0.5)
    rollout = old + rng.normal(0.0, 0.25, old.shape)
    t_logp, t_old, t_ref, t_adv, t_mask, t_rollout = torch_of(logp, old, ref, adv, mask, rollout)
    t_logp.requires_grad_(True)
    ratio = trl_is_ratio(t_old, t_rollout, t_mask, "token_truncate", None, 1.2)
    expected, _ = TRLLoss("dapo", 0.04, 0.2, 0.28, 10)(t_logp, t_old, t_ref, t_adv, t_mask, is_ratio=ratio)
    expected.backward()
    cell = GRPOLoss(beta=0.04, kl_kind="k3", clip_low=0.2, clip_high=0.28, rollout_correction="tis_token",
                    rollout_correction_threshold=1.2)
    fn = ms.value_and_grad(cell, grad_position=0, has_aux=True)
    (loss, m), grad = fn(t(logp), t(old), t(ref), t(adv), t(mask), None, None, None, t(rollout))
    assert loss.asnumpy() == pytest.approx(expected.item(), rel=FP32_CONST)
    np.testing.assert_allclose(grad.asnumpy(), t_logp.grad.numpy(), rtol=FP32_CONST, atol=1e-12)
    assert m["rollout_correction/clipfrac"].asnumpy() > 0


TINY = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=64)


def tiny_experience(rng, rows=6):
    prompts = [list(rng.integers(2, 64, rng.integers(2, 5))) for _ in range(rows)]
    responses = [list(rng.integers(2, 64, rng.integers(1, 9))) for _ in range(rows)]
    return pack(prompts, responses, rng.normal(size=rows).astype(np.float32), step=8)


def test_updater_reports_mismatch_and_applies_the_correction(graph_mode):
    """Three micro-batches: the step's loss and metrics are the numpy ones of the whole batch, the
    maxima combined as maxima, the means weighted by tokens."""
    rng = np.random.default_rng(35)
    lm = Qwen2ForCausalLM(TINY, seed=3)
    exp = tiny_experience(rng)
    train = Scorer(lm, micro_batch_size=2)(exp)  # (B, R), 0 on padding
    exp.sampling_logp = ((train + rng.normal(0.0, 0.3, train.shape)) * exp.mask).astype(np.float32)
    loss = GRPOLoss(agg_mode="token-mean", rollout_correction="tis_token", rollout_correction_threshold=1.3)
    updater = PolicyUpdater(lm, loss, Batching(2), detach_old=True, use_ref=False,
                            optimizer=AdamWSettings(beta2=0.99))
    out = updater.update(exp, lr=0.0)
    assert set(METRIC_KEYS + MISMATCH_KEYS + CORRECTION_KEYS) <= set(out)
    np_loss, np_m = grpo_loss(train, train, None, exp.advantages, exp.mask, rollout_logp=exp.sampling_logp,
                              rollout_correction="tis_token", rollout_correction_threshold=1.3)
    np_m.update(mismatch_metrics(train, exp.sampling_logp, exp.mask))
    assert out["loss"] == pytest.approx(np_loss, rel=1e-5, abs=1e-6)
    for key in MISMATCH_KEYS + CORRECTION_KEYS:
        assert out[key] == pytest.approx(np_m[key], rel=1e-5, abs=1e-6), key
    assert 0 < out["rollout_correction/clipfrac"] < 1 and np.isfinite(out["grad_norm"])
    # without the engine's log-probs, the plain metrics only: test_variants.py (a second graph here)


# ---------------------------------------------------------------------------------------
# config and trainer
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, needle", [
    (["rl_config.rollout_correction=tis"], "valid names: mask_sequence, mask_token, none, tis_sequence, tis_token"),
    (["rl_config.rollout_correction=tis_token", "rl_config.rollout_correction_threshold=1"], "must be > 1"),
    (["rl_config.rollout_correction_threshold=3"], "rollout_correction is 'none', which does not read it"),
])
def test_config_refuses(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(GRPOConfig, None, overrides)


def test_trainer_uses_the_rollout_logprobs(graph_mode):
    """The trainer's phases on a scripted engine's rollouts, given rollout log-probs: with
    old_logprobs_from_rollout the engine's log-probs are the old ones and no scoring pass is built;
    a correction without the engine's log-probs is an error naming the key."""
    from test_dynamic_sampling import informative, make_trainer

    trainer, _ = make_trainer(informative, rollout_correction="tis_token", old_logprobs_from_rollout=True,
                              num_mini_batches=3)
    assert trainer.old_scorer is None and not trainer.updater.step_graph.policy_loss.detach_old
    r, _ = trainer.collect()
    adv, _ = trainer.advantages(r)
    exp = trainer.build_experience(r, adv)
    with pytest.raises(ValueError, match="old_logprobs_from_rollout needs"):
        trainer.old_logprobs(exp)
    with pytest.raises(ValueError, match="rollout_correction=tis_token needs"):
        trainer.update(exp)
    rng = np.random.default_rng(36)
    exp.rollout_logp = (-rng.random(exp.mask.shape) * exp.mask).astype(np.float32)
    exp.sampling_logp = (exp.rollout_logp + 0.1 * exp.mask).astype(np.float32)  # top-p renormalised: higher
    trainer.old_logprobs(exp)
    assert exp.old_logp is exp.rollout_logp
    out = trainer.update(exp)
    assert out["mismatch/ppl_ratio"] == pytest.approx(math.exp(out["mismatch/log_ppl_ratio"]))
    assert np.isfinite(out["loss"]) and out["rollout_correction/weight_max"] <= 1.0 + 1e-6


def test_registries_twin_and_settings_are_config_keys():
    from mindgrpo.config import RLConfig

    for np_reg, ms_reg in ((algos.POLICY_LOSSES, ms_algos.POLICY_LOSSES), (algos.KL_ESTIMATORS, ms_algos.KL_ESTIMATORS),
                           (algos.AGG_MODES, ms_algos.AGG_MODES),
                           (corrections.ROLLOUT_CORRECTIONS, ms_corrections.ROLLOUT_CORRECTIONS)):
        assert ms_reg.names() == np_reg.names(), np_reg.kind
        for name in np_reg.names():
            assert ms_reg.params(name) == np_reg.params(name), name
    with pytest.raises(ValueError, match="not a name of its source registry"):
        ms_algos.POLICY_LOSSES.register("ppo")(lambda: None)
    fields = set(RLConfig.__dataclass_fields__)
    for registry in (algos.ADVANTAGES, algos.POLICY_LOSSES, corrections.ROLLOUT_CORRECTIONS):
        for name in registry.names():
            assert set(registry.params(name)) <= fields, name
    cfg = replace(RLConfig(), policy_loss="sapo")
    assert cfg.settings(algos.POLICY_LOSSES, "sapo") == {"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05}
