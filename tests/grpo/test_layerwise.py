"""The layerwise update (actor_config.layerwise_update): one compiled decoder-layer graph run for every
layer, forward then backward from the last layer to the first, gives the loss, the metrics and every
gradient of the whole-model training graph (within 1e-6; bit for bit on this machine), on Qwen2 with
tied embeddings and on Qwen3 (QK-norm, no q/k/v bias) with its own head; one optimizer step through
`PolicyUpdater.update` moves the weights alike."""

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindgrpo.config import ConfigError, GRPOConfig, load_config
from mindgrpo.grpo.actor import PolicyUpdater
from mindgrpo.grpo.layerwise import LayerwiseGradStep
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.packing import Batching
from mindgrpo.memory.policy import MemoryPolicy
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM

from fakes import ragged_experience as experience  # tests/grpo is on sys.path under pytest
from fakes import with_adapters

pytestmark = pytest.mark.usefixtures("graph_mode")  # tests/grpo/conftest.py

# tests/grpo/micro_qwen2.yaml (two layers: the backward loop hands a gradient from layer to layer); Qwen3 with one
QWEN2 = Qwen2Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
QWEN3 = Qwen2Config(model_type="qwen3", vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                    tie_word_embeddings=False)


def updater(cfg, layerwise, loss=None, head_rows=0, recompute_num_layers=None):
    lm = Qwen2ForCausalLM(cfg, seed=7)
    return lm, PolicyUpdater(lm, loss or GRPOLoss(beta=0.04, kl_kind="k3"), Batching(4), detach_old=True,
                             use_ref=True, memory=MemoryPolicy(layerwise_update=layerwise, head_rows=head_rows,
                                                               recompute_num_layers=recompute_num_layers))


def one_micro_batch(up, exp, rollout_logp=None):
    """Loss, metrics and the accumulated gradients (name -> array) of one training-step call."""
    loss, metrics = up.step_graph(
        Tensor(exp.input_ids), ms.mutable((Tensor(exp.score_pos), Tensor(exp.labels))), Tensor(exp.mask),
        Tensor(exp.advantages), Tensor(np.zeros_like(exp.mask)), Tensor(exp.ref_logp),
        Tensor(np.float32(exp.mask.sum())), Tensor(np.float32(len(exp))),
        None if rollout_logp is None else Tensor(rollout_logp))
    grads = {p.name: b.asnumpy().copy() for p, b in zip(up.params, up.buffer.bufs)}
    return float(loss.asnumpy()), [float(m.asnumpy()) for m in metrics], grads


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_head_rows_give_the_loss_metrics_and_gradients_of_the_whole_micro_batch():
    """actor_config.head_rows_per_graph: the head graph called on 1 or 3 of the micro-batch's 4 rows at a time (3:
    a group of 3 and one of 1, each its own compiled shape) gives the loss, the metrics (token means weighted by
    each call's tokens, the mismatch maximum a maximum) and the gradients of the whole-model graph on the whole
    micro-batch, with the rollout's log-probs given (the mismatch metrics and a truncated importance correction);
    a loss with a top-entropy quantile (over one call's tokens) keeps the whole micro-batch in its head."""
    exp = experience()
    assert len(exp) == 4 and (exp.mask.sum(-1) > 0).all()
    rollout = (exp.ref_logp + 0.05 * np.random.default_rng(4).standard_normal(exp.mask.shape)).astype(np.float32)
    loss = GRPOLoss(beta=0.04, kl_kind="k3", rollout_correction="tis_token")
    _, whole = updater(QWEN2, False, loss)
    a = one_micro_batch(whole, exp, rollout * exp.mask)
    assert len(a[1]) == 14 and a[1][8] > 0  # with the mismatch and correction metrics; abs_diff_max > 0
    for rows in (1, 3):
        _, split = updater(QWEN2, True, loss, head_rows=rows)
        assert split.step_graph.head_rows == rows
        b = one_micro_batch(split, exp, rollout * exp.mask)
        assert b[0] == pytest.approx(a[0], rel=1e-6, abs=1e-7), rows
        np.testing.assert_allclose(b[1], a[1], rtol=1e-6, atol=1e-7, err_msg=str(rows))
        for name, grad in a[2].items():
            assert np.any(grad != 0), name
            np.testing.assert_allclose(b[2][name], grad, rtol=1e-6, atol=1e-7, err_msg=f"{rows} {name}")
    _, quantile = updater(QWEN2, True, GRPOLoss(beta=0.04, kl_kind="k3", top_entropy_quantile=0.5), head_rows=1)
    assert quantile.step_graph.head_rows == 0


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
@pytest.mark.parametrize("cfg, recompute", [(QWEN2, None), (QWEN2, 1), (QWEN3, 0)],
                         ids=["qwen2-tied", "qwen2-tied-one-saved", "qwen3-saved"])
def test_layerwise_gives_the_loss_and_gradients_of_the_whole_graph(cfg, recompute):
    """recompute (actor_config.recompute_num_layers): None, every layer runs its forward again in its backward; 1,
    the first does and the second keeps its activations (models/saved_layer.py); 0, every layer keeps them."""
    exp = experience()
    (lm_a, whole), (lm_b, layerwise) = updater(cfg, False), updater(cfg, True, recompute_num_layers=recompute)
    assert isinstance(layerwise.step_graph, LayerwiseGradStep) and not isinstance(whole.step_graph, LayerwiseGradStep)
    assert layerwise.step_graph.recomputed == (cfg.num_hidden_layers if recompute is None else recompute)
    a, b = one_micro_batch(whole, exp), one_micro_batch(layerwise, exp)
    assert b[0] == pytest.approx(a[0], rel=1e-6, abs=1e-7)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-6, atol=1e-7)
    assert b[2].keys() == a[2].keys()
    for name, grad in a[2].items():
        assert np.any(grad != 0), name  # every parameter gets a gradient: the comparison covers it
        np.testing.assert_allclose(b[2][name], grad, rtol=1e-6, atol=1e-7, err_msg=name)
    if cfg is QWEN3 or recompute is not None:
        return
    # one optimizer step through PolicyUpdater.update (the graphs above, compiled once): the same metrics, the
    # weights moved alike
    whole.adamw.zero_grads()
    layerwise.adamw.zero_grads()
    ma, mb = whole.update(exp, lr=1e-3), layerwise.update(exp, lr=1e-3)
    assert ma.keys() == mb.keys() and ma["grad_norm"] > 0
    for key in ma:
        assert mb[key] == pytest.approx(ma[key], rel=1e-6, abs=1e-7), key
    start = {p.name: p.asnumpy() for p in Qwen2ForCausalLM(cfg, seed=7).get_parameters()}
    moved = {p.name: p.asnumpy() for p in lm_b.get_parameters()}
    for p in lm_a.get_parameters():
        assert not np.array_equal(p.asnumpy(), start[p.name]), p.name
        np.testing.assert_allclose(moved[p.name], p.asnumpy(), rtol=1e-6, atol=1e-7, err_msg=p.name)


def test_layerwise_is_off_by_default_and_refused_where_it_does_not_apply():
    assert GRPOConfig().actor_config.layerwise_update is None  # unset: rl_config.memory decides (docs/memory.md)
    assert load_config(GRPOConfig, overrides=["actor_config.layerwise_update=true"]).actor_config.layerwise_update
    for other in ("actor_config.parallel_config.model_parallel=2", "actor_config.parallel_config.pipeline_stage=2",
                  "actor_config.recompute=true"):
        with pytest.raises(ConfigError) as info:
            load_config(GRPOConfig, overrides=["actor_config.layerwise_update=true", other])
        assert info.value.key == "actor_config.layerwise_update", str(info.value)
    packed = ["actor_config.layerwise_update=true", "actor_config.packing=true",
              "actor_config.max_tokens_per_micro_batch=1024"]
    assert load_config(GRPOConfig, overrides=packed).actor_config.layerwise_update  # packed rows: a bias like any
    with pytest.raises(ConfigError) as info:  # Ascend's flash kernel is no additive bias the layer graphs take
        load_config(GRPOConfig, overrides=packed + ["actor_config.packed_attention=flash"])
    assert info.value.key == "actor_config.layerwise_update", str(info.value)


@pytest.mark.parametrize("cfg, temperature", [(QWEN2, 1.0), (QWEN3, 0.7)], ids=["qwen2-tied", "qwen3-T0.7"])
def test_layerwise_scoring_gives_the_log_probs_of_the_whole_graph(cfg, temperature):
    """ref_config.layerwise: the Scorer's log-probs through one layer graph run per layer equal the whole-model
    graph's (the path the reference took before), micro-batch by micro-batch over ragged rows, over token-budget
    micro-batches and over packed rows (each sample apart in its row: the bias the embed graph makes)."""
    from mindgrpo.grpo.actor import Scorer
    from mindgrpo.grpo.layerwise import LayerwiseLogProbs

    exp = experience()
    lm = Qwen2ForCausalLM(cfg, seed=7)
    whole, layerwise = Scorer(lm, 2, temperature), Scorer(lm, 2, temperature, layerwise=True)
    assert isinstance(layerwise.graph, LayerwiseLogProbs) and not isinstance(whole.graph, LayerwiseLogProbs)
    a, b = whole(exp), layerwise(exp)
    assert a.shape == exp.labels.shape and np.all(a[exp.mask > 0] < 0) and np.all(a[exp.mask == 0] == 0)
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    for tokens in (dict(max_tokens=32), dict(max_tokens=64, packing=True)):
        by_tokens = Scorer(lm, 2, temperature, layerwise=True, **tokens)
        assert by_tokens.batching.layout != "rows" and isinstance(by_tokens.graph, LayerwiseLogProbs)
        np.testing.assert_allclose(by_tokens(exp), a, rtol=1e-6, atol=1e-6, err_msg=str(tokens))
    layerwise.release()  # compiled again on the next call: the same numbers
    np.testing.assert_allclose(layerwise(exp), b, rtol=0, atol=0)


def test_layerwise_scoring_is_off_by_default_and_refused_where_it_does_not_apply():
    from mindgrpo.grpo.actor import Scorer

    assert GRPOConfig().ref_config.layerwise is None  # unset: rl_config.memory decides (docs/memory.md)
    on = ["rl_config.beta=0.04", "ref_config.layerwise=true"]
    assert load_config(GRPOConfig, overrides=on).ref_config.layerwise
    for other in ("ref_config.parallel_config.model_parallel=2", "ref_config.parallel_config.pipeline_stage=2"):
        with pytest.raises(ConfigError) as info:
            load_config(GRPOConfig, overrides=on + [other])
        assert info.value.key == "ref_config.layerwise", str(info.value)
    packed = ["actor_config.packing=true", "actor_config.max_tokens_per_micro_batch=1024"]
    assert load_config(GRPOConfig, overrides=on + packed).ref_config.layerwise  # token budgets and packed rows too
    with pytest.raises(ConfigError) as info:  # not Ascend's flash kernel: the layer graphs take an additive bias
        load_config(GRPOConfig, overrides=on + packed + ["actor_config.packed_attention=flash"])
    assert info.value.key == "ref_config.layerwise", str(info.value)
    with pytest.raises(ConfigError) as info:  # no reference model: the key cannot act
        load_config(GRPOConfig, overrides=["ref_config.layerwise=true"])
    assert info.value.key == "ref_config.layerwise", str(info.value)
    with pytest.raises(ValueError, match="no flash attention"):
        Scorer(Qwen2ForCausalLM(QWEN2, seed=7), 2, max_tokens=64, packing=True, attention="flash", layerwise=True)


@pytest.mark.parametrize("clip", [1e-3, 0.0], ids=["clipped", "no-clip"])
def test_layerwise_optimizer_step_is_bit_for_bit_the_whole_one(clip):
    """LayerwiseAdamW (the norm and AdamW's step group by group, with the layerwise update) against optim.AdamW on
    the same gradients: the same norm, weights and moments bit for bit over two steps, weight decay on (the norms
    and biases exempt), clipping active or off; the accumulators zeroed after each step."""
    from mindgrpo.grpo.layerwise import LayerwiseAdamW
    from mindgrpo.grpo.optim import AdamW, GradBuffer, adam_scalars

    sides = []
    for layerwise in (False, True):
        lm = Qwen2ForCausalLM(QWEN2, seed=7)
        params = [p for p in lm.get_parameters() if p.requires_grad]
        buffer = GradBuffer(params)
        opt = AdamW(params, buffer, 0.9, 0.999, 1e-8, weight_decay=0.1)
        sides.append((params, buffer, LayerwiseAdamW(opt, params) if layerwise else opt))
    assert len(sides[1][2].groups) == 2 + QWEN2.num_hidden_layers  # embedding, each layer, the final norm
    rng = np.random.default_rng(3)
    for step in (1, 2):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in sides[0][0]]
        norms = []
        for params, buffer, opt in sides:
            for b, g in zip(buffer.bufs, grads):
                b.set_data(Tensor(g))
            norm = opt.grad_norm()
            bc1, bc2 = adam_scalars(step, 0.9, 0.999)
            opt(Tensor(np.float32(1e-2)), bc1, bc2, Tensor(np.float32(clip)), norm)
            norms.append(norm.asnumpy())
            assert all(not b.asnumpy().any() for b in buffer.bufs)
        assert norms[0] == norms[1] and norms[0] > 0
        for a, b, ma, mb, va, vb in zip(sides[0][0], sides[1][0], sides[0][2].m, sides[1][2].whole.m,
                                        sides[0][2].v, sides[1][2].whole.v):
            assert np.array_equal(a.asnumpy(), b.asnumpy()), a.name
            assert np.array_equal(ma.asnumpy(), mb.asnumpy()) and np.array_equal(va.asnumpy(), vb.asnumpy()), a.name
    start = {p.name: p.asnumpy() for p in Qwen2ForCausalLM(QWEN2, seed=7).get_parameters()}
    assert all(not np.array_equal(p.asnumpy(), start[p.name]) for p in sides[1][0])


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_an_update_that_releases_drops_its_graphs_before_the_optimizer_step_and_moves_the_weights_alike():
    """PolicyUpdater.update(release=True) (the step's last update under rl_config.release_graphs): the training
    graphs go once the gradients are in and the norm's group graphs once the norm is, before AdamW's group graphs
    run; the weights and metrics are those of an update that keeps them, bit for bit, and the next update
    compiles them again."""
    exp = experience()
    (lm_a, kept), (lm_b, dropped) = updater(QWEN2, True, head_rows=1), updater(QWEN2, True, head_rows=1)
    for step in range(2):
        ma, mb = kept.update(exp, lr=1e-3), dropped.update(exp, lr=1e-3, release=True)
        assert ma == mb and ma["grad_norm"] > 0, step
        assert kept.step_graph is not None and kept.adamw.norm_graphs
        assert dropped.step_graph is None and not dropped.adamw.norm_graphs and dropped.adamw.adam_graphs
        for a, b in zip(lm_a.get_parameters(), lm_b.get_parameters()):
            np.testing.assert_array_equal(b.asnumpy(), a.asnumpy(), err_msg=a.name)


@pytest.mark.slow
def test_layerwise_with_lora_gives_the_adapters_gradients_and_log_probs_of_the_whole_graph():
    """LoRA on the layer graphs (the adapters graph inputs beside the base weights): the update's loss, metrics
    and adapter gradients (the only ones: the base is frozen) equal the whole-model graph's, with every layer
    running its forward again in its backward and with every layer keeping its activations
    (actor_config.recompute_num_layers 0); the scoring pass gives its log-probs, and with the adapters off (the
    LoRA reference) the base model's."""
    from mindgrpo.grpo.actor import Scorer
    from mindgrpo.models.lora import adapters_off

    exp = experience()
    loss = GRPOLoss(beta=0.04, kl_kind="k3")
    whole = PolicyUpdater(with_adapters(QWEN2), loss, Batching(4), detach_old=True, use_ref=True)
    lm = with_adapters(QWEN2)
    a = one_micro_batch(whole, exp)
    assert sorted(a[2]) and len(a[2]) == 2 * 7 * QWEN2.num_hidden_layers
    assert all(".lora_" in name for name in a[2])
    for recompute in (None, 0):
        layerwise = PolicyUpdater(lm if recompute is None else with_adapters(QWEN2), loss, Batching(4),
                                  detach_old=True, use_ref=True,
                                  memory=MemoryPolicy(layerwise_update=True, recompute_num_layers=recompute))
        assert isinstance(layerwise.step_graph, LayerwiseGradStep) and layerwise.step_graph.lora
        b = one_micro_batch(layerwise, exp)
        assert b[0] == pytest.approx(a[0], rel=1e-6, abs=1e-7), recompute
        np.testing.assert_allclose(b[1], a[1], rtol=1e-6, atol=1e-7)
        assert sorted(b[2]) == sorted(a[2])
        for name, grad in a[2].items():
            assert np.any(grad != 0), name
            np.testing.assert_allclose(b[2][name], grad, rtol=1e-5, atol=1e-7, err_msg=f"{recompute} {name}")

    scored, by_layer = Scorer(lm, 2), Scorer(lm, 2, layerwise=True)
    np.testing.assert_allclose(by_layer(exp), scored(exp), rtol=1e-6, atol=1e-7)
    base = Scorer(Qwen2ForCausalLM(QWEN2, seed=7), 2)(exp)
    with adapters_off(lm):
        off = by_layer(exp)
    assert not np.allclose(off, scored(exp))  # the adapters matter ...
    np.testing.assert_allclose(off, base, rtol=1e-6, atol=1e-7)  # ... and off, the base model's log-probs
