"""LoRA dropout in the policy's update (actor_config.lora_dropout, mindgrpo/models/lora_dropout.py): the layerwise
update's graphs and activation recompute make the whole training graph's masks (the same gradients); a pipeline
stage's forward keys its layers as the whole model does; the masks act (other keys, other gradients) and the scoring
pass, the reference with it, has none; lora_dropout 0 leaves the update as it was; a LoRA run with dropout resumed
after step 1 gives step 2 as the run that went on."""

import dataclasses

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindgrpo.grpo.actor import PolicyUpdater, Scorer
from mindgrpo.grpo.layerwise import LayerwiseGradStep
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.packing import Batching
from mindgrpo.memory.policy import MemoryPolicy
from mindgrpo.models.lora import adapter_state
from mindgrpo.models.lora_dropout import update_key
from mindgrpo.models.qwen2 import Qwen2ForCausalLM, StageSpec
from mindgrpo.models.scoring import DroppedTokenLogProbs, StageHidden

from fakes import ragged_experience as experience  # tests/grpo is on sys.path under pytest
from fakes import with_adapters as adapted
from test_layerwise import QWEN2

pytestmark = pytest.mark.usefixtures("graph_mode")  # tests/grpo/conftest.py

P = 0.3
LOSS = dict(beta=0.04, kl_kind="k3")


def with_adapters(p=P, stage=None, cfg=QWEN2):
    """The micro Qwen2 (2 layers) with rank-4 adapters of dropout p on all seven projections, B random."""
    return adapted(cfg, p, stage)


def step_call(up, exp, key):
    """Loss, metrics and the accumulated gradients of one training-step call with the dropout key `key` (None:
    no key in the feed)."""
    feed = (Tensor(exp.score_pos), Tensor(exp.labels)) + (() if key is None else (Tensor(key),))
    up.buffer.restore()
    loss, metrics = up.step_graph(
        Tensor(exp.input_ids), ms.mutable(feed), Tensor(exp.mask), Tensor(exp.advantages),
        Tensor(np.zeros_like(exp.mask)), Tensor(exp.ref_logp), Tensor(np.float32(exp.mask.sum())),
        Tensor(np.float32(len(exp))), None)
    grads = {q.name: b.asnumpy().copy() for q, b in zip(up.params, up.buffer.bufs)}
    up.adamw.zero_grads()
    return float(loss.asnumpy()), [float(m.asnumpy()) for m in metrics], grads


def updater(lm, **memory):
    return PolicyUpdater(lm, GRPOLoss(**LOSS), Batching(4), detach_old=True, use_ref=True, seed=5,
                         memory=MemoryPolicy(**memory))


@pytest.mark.slow
def test_layerwise_and_recompute_make_the_whole_graphs_masks():
    exp = experience()
    key = update_key(5, 0, 0)
    whole, layerwise, recompute = updater(with_adapters()), updater(with_adapters(), layerwise_update=True), \
        updater(with_adapters(), recompute=True)
    # the layerwise update with its layers' activations kept (models/saved_layer.py): the masks made again there
    saved = updater(with_adapters(), layerwise_update=True, recompute_num_layers=0)
    assert whole.dropout and isinstance(layerwise.step_graph, LayerwiseGradStep) and layerwise.step_graph.dropout
    assert saved.step_graph.dropout and saved.step_graph.recomputed == 0
    a = step_call(whole, exp, key)
    for other in (layerwise, recompute, saved):
        b = step_call(other, exp, key)
        assert b[0] == pytest.approx(a[0], rel=1e-6, abs=1e-7)
        np.testing.assert_allclose(b[1], a[1], rtol=1e-6, atol=1e-7)
        assert sorted(b[2]) == sorted(a[2]) and len(a[2]) == 2 * 7 * QWEN2.num_hidden_layers
        for name, grad in a[2].items():
            assert np.any(grad != 0), name
            np.testing.assert_allclose(b[2][name], grad, rtol=0, atol=1e-6, err_msg=name)
    # the masks act: another key, other gradients (and nll, the training forward's log-probs)
    c = step_call(whole, exp, update_key(5, 1, 0))
    assert max(np.abs(c[2][n] - a[2][n]).max() for n in a[2]) > 1e-3 and c[1][6] != a[1][6]


@pytest.mark.slow
def test_an_update_keys_its_micro_batches_and_the_layerwise_one_moves_the_adapters_alike():
    """PolicyUpdater.update on two micro-batches (each its key from the seed, the optimizer step and its index):
    whole graph and layerwise give the same step; the dropout moves the adapters elsewhere than p = 0 does."""
    exp = experience()
    runs = {}
    for name, p, memory in (("whole", P, {}), ("layerwise", P, {"layerwise_update": True}), ("p0", 0.0, {})):
        lm = with_adapters(p)
        up = PolicyUpdater(lm, GRPOLoss(**LOSS), Batching(2), detach_old=True, use_ref=True, seed=5,
                           memory=MemoryPolicy(**memory))
        assert up.dropout == (p > 0)
        runs[name] = (up.update(exp, lr=1e-2), adapter_state(lm))
    (m_whole, a_whole), (m_layer, a_layer), (m_p0, a_p0) = runs["whole"], runs["layerwise"], runs["p0"]
    assert m_layer["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-5)
    for name, value in a_whole.items():
        np.testing.assert_allclose(a_layer[name], value, rtol=0, atol=1e-6, err_msg=name)
    assert abs(m_p0["grad_norm"] - m_whole["grad_norm"]) > 1e-3 * m_whole["grad_norm"]


def test_scoring_and_the_reference_have_no_dropout():
    """The scorer (old log-probs; with the adapters off, the reference) gives the same bits with p > 0 as with 0."""
    from mindgrpo.models.lora import adapters_off

    exp = experience()
    dropped, plain = with_adapters(P), with_adapters(0.0)
    np.testing.assert_array_equal(Scorer(dropped, 4)(exp), Scorer(plain, 4)(exp))
    with adapters_off(dropped), adapters_off(plain):
        np.testing.assert_array_equal(Scorer(dropped, 4)(exp), Scorer(plain, 4)(exp))


@pytest.mark.slow
def test_a_pipeline_stages_forward_keys_its_layers_as_the_whole_model():
    """The first of two stages (layer 0) hands its hidden states to the second (layer 1): with the dropout key in
    both feeds the log-probs are the whole model's training forward's (each layer keyed by its index in the model)."""
    exp = experience()
    key = Tensor(update_key(5, 3, 1))
    ids, pos, labels = Tensor(exp.input_ids), Tensor(exp.score_pos), Tensor(exp.labels)
    cfg = dataclasses.replace(QWEN2, tie_word_embeddings=False)  # stages hold the embedding and the head apart
    whole = DroppedTokenLogProbs(with_adapters(cfg=cfg), with_entropy=False)(ids, pos, labels, key)[0].asnumpy()
    first = with_adapters(stage=StageSpec(0, 1, first=True, last=False), cfg=cfg)
    last = with_adapters(stage=StageSpec(1, None, first=False, last=True), cfg=cfg)
    h = StageHidden(first, dropout=True)(ids, ms.mutable((key,)))
    staged = DroppedTokenLogProbs(last, with_entropy=False)(h, pos, labels, key)[0].asnumpy()
    np.testing.assert_allclose(staged * exp.mask, whole * exp.mask, rtol=0, atol=1e-6)
    plain = DroppedTokenLogProbs(with_adapters(cfg=cfg), with_entropy=False)(ids, pos, labels,
                                                                             Tensor(update_key(5, 3, 2)))[0].asnumpy()
    assert np.abs((plain - whole) * exp.mask).max() > 1e-3  # another micro-batch's masks give other log-probs


@pytest.mark.slow
def test_packed_rows_take_the_dropout():
    exp = experience()
    runs = {}
    for p in (P, 0.0):
        up = PolicyUpdater(with_adapters(p), GRPOLoss(**LOSS), Batching(4, max_tokens=64, packing=True),
                           detach_old=True, use_ref=True, seed=5)
        runs[p] = up.update(exp, lr=1e-2)
    assert np.isfinite(runs[P]["grad_norm"]) and abs(runs[P]["grad_norm"] - runs[0.0]["grad_norm"]) > 1e-4


def test_dropout_zero_and_the_warm_start_have_no_key():
    """lora_dropout 0 keeps the update's graphs as they were (no key, no mask op); a LoRA run's warm start trains
    the base with the adapters off: no dropout either."""
    from mindgrpo.models.lora import base_trains

    up = updater(with_adapters(0.0))
    assert not up.dropout and type(up.step_graph.policy_loss.scorer).__name__ == "TokenLogProbs"
    lm = with_adapters(P)
    with base_trains(lm):
        assert not updater(lm).dropout
    assert updater(lm).dropout


@pytest.mark.slow  # builds and compiles a trainer: about a minute of CPU
def test_a_run_with_dropout_resumed_after_step_1_gives_step_2_again(tmp_path):
    """The micro LoRA run with lora_dropout 0.1: step 1, a checkpoint, step 2; then the checkpoint resumed and step 2
    again: the same loss, KL, nll and gradient norm (the masks are keyed by the restored optimizer step, nothing
    else to restore). Another seed's masks give another step 2."""
    from mindgrpo.config import GRPOConfig, load_config
    from mindgrpo.grpo import builder
    from mindgrpo.utils.progress import Progress

    from fakes import one_layer_micro
    from test_one_copy import MICRO, NoLog

    model = one_layer_micro(tmp_path)
    cfg = load_config(GRPOConfig, None, MICRO + [
        "actor_config.lora_rank=4", "actor_config.lora_alpha=8", "actor_config.lora_dropout=0.1",
        "rl_config.beta=0.05", "rl_config.max_steps=2", f"actor_config.model={model}",
        f"rl_config.output_dir={tmp_path}"])
    parts = builder.build(cfg, builder.Paths(output_dir=str(tmp_path)))
    trainer = builder.make_trainer(cfg, parts, NoLog(), Progress(2), str(tmp_path))
    assert trainer.updater.dropout
    trainer.train_step()
    trainer.step = 1
    saved = trainer.save()
    keys = ("loss", "kl", "nll", "grad_norm")
    went_on = trainer.train_step()
    trainer.resume(saved)
    assert trainer.step == 1 and trainer.updater.optimizer_steps == 1
    resumed = trainer.train_step()
    for k in keys:
        assert resumed[k] == went_on[k], (k, resumed[k], went_on[k])
    trainer.resume(saved)
    trainer.updater.seed += 1  # other masks
    other = trainer.train_step()
    assert other["grad_norm"] != went_on["grad_norm"] and other["nll"] != went_on["nll"]
