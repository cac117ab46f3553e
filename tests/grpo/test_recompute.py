"""Activation recompute (actor_config.recompute): the training graph recomputes each decoder
layer's forward in its backward pass, and its loss, metrics and every gradient are those of the
graph that keeps the intermediates."""

import glob
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindgrpo.config import ConfigError, GRPOConfig, load_config
from mindgrpo.grpo.actor import PolicyUpdater
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.packing import Batching
from mindgrpo.grpo.train_graph import GRPOGradStep, PolicyLoss
from mindgrpo.memory.policy import MemoryPolicy
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM

from fakes import ragged_experience as experience  # tests/grpo is on sys.path under pytest

pytestmark = pytest.mark.usefixtures("graph_mode")  # tests/grpo/conftest.py

# tests/grpo/micro_qwen2.yaml with one layer (each training graph compiles in about half the time of two)
MICRO = Qwen2Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)


def one_micro_batch(recompute: bool, save_graphs_to=None):
    """Loss, metrics and the accumulated gradients (name -> array) of one training-graph call on a
    fresh micro model (the same weights either way), built as PolicyUpdater builds it."""
    lm = Qwen2ForCausalLM(MICRO, seed=7)
    updater = PolicyUpdater(lm, GRPOLoss(beta=0.04, kl_kind="k3"), Batching(4), detach_old=True, use_ref=True,
                            memory=MemoryPolicy(recompute=recompute))
    exp = experience()
    if save_graphs_to is not None:
        ms.set_context(save_graphs=1, save_graphs_path=save_graphs_to)
    try:
        loss, metrics = updater.step_graph(
            Tensor(exp.input_ids), ms.mutable((Tensor(exp.score_pos), Tensor(exp.labels))), Tensor(exp.mask),
            Tensor(exp.advantages), Tensor(np.zeros_like(exp.mask)), Tensor(exp.ref_logp),
            Tensor(np.float32(exp.mask.sum())), Tensor(np.float32(len(exp))), None)
    finally:
        if save_graphs_to is not None:
            ms.set_context(save_graphs=0)
    names = [p.name for p in updater.params]
    grads = {n: b.asnumpy().copy() for n, b in zip(names, updater.buffer.bufs)}
    return float(loss.asnumpy()), [float(m.asnumpy()) for m in metrics], grads


def matmuls(folder) -> int:
    """MatMul and BatchMatMul nodes in the compiled graph MindSpore saved into folder (its last form)."""
    (final,) = glob.glob(os.path.join(folder, "hwopt_common_final_graph_*.ir"))
    with open(final) as f:
        text = f.read()
    return text.count("PrimFunc_MatMul(") + text.count("PrimFunc_BatchMatMul(")


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
def test_recompute_gives_the_same_loss_and_gradients(tmp_path):
    plain = one_micro_batch(False, str(tmp_path / "plain"))
    recomputed = one_micro_batch(True, str(tmp_path / "recomputed"))
    # the switch reaches the compiled graph: the layers' forward matmuls run again in the backward pass
    assert matmuls(tmp_path / "recomputed") > matmuls(tmp_path / "plain")
    assert recomputed[0] == pytest.approx(plain[0], rel=1e-6, abs=1e-7)
    np.testing.assert_allclose(recomputed[1], plain[1], rtol=1e-6, atol=1e-7)
    assert recomputed[2].keys() == plain[2].keys()
    for name, grad in plain[2].items():
        assert np.any(grad != 0), name  # every parameter gets a gradient: the comparison covers it
        np.testing.assert_allclose(recomputed[2][name], grad, rtol=1e-6, atol=1e-7, err_msg=name)


def test_recompute_is_off_by_default_and_refused_where_untested():
    assert GRPOConfig().actor_config.recompute is False
    assert load_config(GRPOConfig, overrides=["actor_config.recompute=true"]).actor_config.recompute
    for parallel in ("model_parallel=2", "pipeline_stage=2"):
        with pytest.raises(ConfigError) as info:
            load_config(GRPOConfig, overrides=["actor_config.recompute=true", f"actor_config.parallel_config.{parallel}"])
        assert info.value.key == "actor_config.recompute", str(info.value)
