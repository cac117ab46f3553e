"""Training on conversations: a trajectory is the prompt, then model turns and tool turns; the tool turns are
context only. pack's response_masks zero them in the mask, so no loss term, KL, correction or metric counts them:
the numpy objective equals the one over the model's tokens alone, laid out without the tool turns; in the
training graph, changing a tool turn's labels changes nothing, changing its ids changes the loss only through
the context, and zero-advantage trajectories give no gradient."""

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindgrpo.grpo.actor import PolicyUpdater
from mindgrpo.grpo.experience import pack
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.objective import grpo_loss
from mindgrpo.grpo.packing import Batching
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
# (token, is the model's) per trajectory: model turn, tool turn, model turn (the last without a tool turn)
TRAJECTORIES = [
    [(20, 1), (21, 1), (40, 0), (41, 0), (42, 0), (22, 1), (23, 1)],
    [(24, 1), (43, 0), (25, 1), (26, 1), (44, 0), (45, 0), (27, 1)],
    [(28, 1), (29, 1), (30, 1)],
]
ADVANTAGES = np.array([1.0, -0.5, 0.7], np.float32)


def packed(trajectories=TRAJECTORIES, advantages=ADVANTAGES, **kw):
    return pack(PROMPTS, [[t for t, _ in tr] for tr in trajectories], advantages, step=8,
                response_masks=[np.array([m for _, m in tr], bool) for tr in trajectories], **kw)


def test_pack_masks_the_tool_turns_and_keeps_them_as_context():
    logp = [np.linspace(-1, -2, len(tr)).astype(np.float32) for tr in TRAJECTORIES]
    exp = packed(rollout_logp=logp)
    for i, tr in enumerate(TRAJECTORIES):
        n_p, ids, model = len(PROMPTS[i]), [t for t, _ in tr], [m for _, m in tr]
        assert list(exp.input_ids[i, n_p:n_p + len(ids)]) == ids  # the whole trajectory is the context
        assert list(exp.mask[i, :len(ids)]) == model and not exp.mask[i, len(ids):].any()
        assert (exp.rollout_logp[i, :len(ids)] == logp[i] * np.array(model)).all()
    assert list(exp.response_lens) == [7, 7, 3]  # token budgets and packing take whole trajectories
    with pytest.raises(ValueError, match="response 0: its mask has 2 entries for 7 tokens"):
        pack(PROMPTS, [[t for t, _ in tr] for tr in TRAJECTORIES], ADVANTAGES, response_masks=[np.ones(2, bool)] * 3)


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_the_objective_is_that_of_the_models_tokens_alone(agg_mode):
    rng = np.random.default_rng(0)
    exp = packed()
    b, r = exp.mask.shape
    logp, old, ref, roll = (rng.normal(-1.5, 0.3, (b, r)).astype(np.float32) for _ in range(4))
    kw = dict(beta=0.04, kl_kind="k3", agg_mode=agg_mode, rollout_correction="tis_token")
    loss, metrics = grpo_loss(logp, old, ref, exp.advantages, exp.mask, rollout_logp=roll, **kw)
    # the model's tokens alone, each trajectory's in a row of its own (no tool turns in between)
    keep = [np.flatnonzero(exp.mask[i]) for i in range(b)]
    width = max(len(k) for k in keep)
    dense = [np.zeros((b, width), np.float32) for _ in range(5)]
    for i, k in enumerate(keep):
        for out, full in zip(dense, (logp, old, ref, roll, exp.mask)):
            out[i, :len(k)] = full[i, k]
    alone, alone_metrics = grpo_loss(*dense[:3], exp.advantages, dense[4], rollout_logp=dense[3], **kw)
    assert loss == pytest.approx(alone, rel=1e-6)
    assert metrics.keys() == alone_metrics.keys()
    for key in metrics:
        assert metrics[key] == pytest.approx(alone_metrics[key], rel=1e-5, abs=1e-7), key
    # whatever sits at the tool turns' positions (other token ids, other log-probs) changes nothing
    tool = exp.mask == 0
    noisy = [np.where(tool, rng.normal(-5, 2, (b, r)), a).astype(np.float32) for a in (logp, old, ref, roll)]
    again, again_metrics = grpo_loss(*noisy[:3], exp.advantages, exp.mask, rollout_logp=noisy[3], **kw)
    assert again == loss and again_metrics == metrics


MICRO = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)


@pytest.mark.usefixtures("graph_mode")  # tests/grpo/conftest.py
def test_in_the_training_graph_tool_turns_are_context_only():
    lm = Qwen2ForCausalLM(MICRO, seed=3)
    updater = PolicyUpdater(lm, GRPOLoss(beta=0.0), Batching(4), detach_old=True, use_ref=False)

    def step(exp, labels=None):
        """Loss, metrics and this call's gradients (the buffers accumulate: the difference)."""
        before = [b.asnumpy().copy() for b in updater.buffer.bufs]
        loss, metrics = updater.step_graph(
            Tensor(exp.input_ids), ms.mutable((Tensor(exp.score_pos), Tensor(exp.labels if labels is None else labels))),
            Tensor(exp.mask), Tensor(exp.advantages), Tensor(np.zeros_like(exp.mask)), None,
            Tensor(np.float32(exp.mask.sum())), Tensor(np.float32(len(exp))), None)
        grads = [b.asnumpy() - a for a, b in zip(before, updater.buffer.bufs)]
        return float(loss.asnumpy()), [float(m.asnumpy()) for m in metrics], grads

    exp = packed()
    base = step(exp)
    assert base[0] != 0 and all(np.abs(g).sum() > 0 for g in base[2])
    # other labels at the tool turns (the ids they would be scored as): nothing changes
    labels = np.where(exp.mask == 0, 63, exp.labels).astype(np.int32)
    same = step(exp, labels)
    assert same[0] == base[0] and same[1] == base[1]
    for a, b in zip(same[2], base[2]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    # other ids in the tool turns themselves: the later model tokens see another context, so other gradients
    # (the loss value is -mean(A) whatever the log-probs: the old log-probs are the detached current ones)
    changed = [[(t + 7 if not m else t, m) for t, m in tr] for tr in TRAJECTORIES]
    other = step(packed(changed))
    assert other[0] == base[0] and any(np.abs(a - b).max() > 1e-4 for a, b in zip(other[2], base[2]))
    # zero advantages (and no KL): no gradient at all, however long the trajectories
    zero = step(packed(advantages=np.zeros(3, np.float32)))
    assert zero[0] == 0 and all((g == 0).all() for g in zero[2])
