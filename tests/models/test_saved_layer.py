"""A decoder layer cut into pieces that keep their inputs (mindgrpo/models/saved_layer.py): the forward is the
layer's bit for bit, and the backward from the kept tensors gives MindSpore's autodiff of the whole layer (the layer
run again from its input under `ops.GradOperation`: the layerwise update's recompute graphs) for the input's gradient
and every weight's, or with LoRA every adapter's (dropout's masks included), on Qwen2 (q/k/v biases) and Qwen3
(QK-norm); the memory plan counts what the pieces keep."""

import dataclasses

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindgrpo.config import GRPOConfig
from mindgrpo.grpo.layerwise import _AdaptedLayer, _AdaptedLayerGrad, _Embed, _LayerGrad
from mindgrpo.memory.plan import saved_activation_bytes, sequence_lengths
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.lora import LoraSpec, adapter_parameters, add_adapters
from mindgrpo.models.qwen2 import LayerGraph, Qwen2ForCausalLM
from mindgrpo.models.saved_layer import LayerBackward, SavingLayer, accumulated

QWEN2 = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64)
QWEN3 = Qwen2Config(model_type="qwen3", vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64)
B, S = 2, 10


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=previous)


def accumulators(params):
    return ms.mutable(tuple(ms.Parameter(Tensor(np.zeros(p.shape, np.float32)), name=f"acc{i}")
                            for i, p in enumerate(params)))


@pytest.mark.parametrize("cfg", [QWEN2, QWEN3], ids=["qwen2", "qwen3"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-dropout"])
def test_the_pieces_give_the_layers_forward_and_its_autodiff(cfg, lora):
    lm = Qwen2ForCausalLM(cfg, seed=3)
    rng = np.random.default_rng(5)
    for p in lm.get_parameters():  # norms and biases away from their initial ones and zeros: their gradients show
        if p.name.endswith(("norm.weight", ".bias")):
            p.set_data(Tensor((1.0 + 0.1 * rng.standard_normal(p.shape)).astype(np.float32)))
    if lora:
        add_adapters(lm, LoraSpec(rank=4, alpha=8.0, dropout=0.25), seed=1)
        for p in adapter_parameters(lm):  # B away from zeros: A gets a gradient
            if p.name.endswith(".lora_b"):
                p.set_data(Tensor(rng.normal(0, 0.05, p.shape).astype(np.float32)))
    layer = lm.model.layers[0]
    ids = Tensor(rng.integers(0, cfg.vocab_size, (B, S)).astype(np.int32))
    x, cos, sin, bias = _Embed(lm)(ids)
    w = ms.mutable(tuple(layer.weights()))
    a = ms.mutable(tuple(layer.lora_weights())) if lora else ()
    drop = Tensor(np.int32(987654)) if lora else None
    dy = Tensor(rng.standard_normal((B, S, cfg.hidden_size)).astype(np.float32))
    trained = [p for k, p in enumerate(a) if k % 3 != 2] if lora else list(w)
    acc_ref, acc = accumulators(trained), accumulators(trained)
    if lora:
        y_ref = _AdaptedLayer(layer)(x, cos, sin, bias, w, a, drop)
        dx_ref = _AdaptedLayerGrad(layer)(x, cos, sin, bias, w, a, drop, dy, acc_ref)
    else:
        y_ref = LayerGraph(layer)(x, cos, sin, bias, w)
        dx_ref = _LayerGrad(layer)(x, cos, sin, bias, w, dy, acc_ref)

    y, saved = SavingLayer(layer)(x, cos, sin, bias, w, a, drop)
    np.testing.assert_array_equal(y.asnumpy(), y_ref.asnumpy())
    dx = LayerBackward(layer, lora)(*saved, cos, sin, bias, w, a, drop, dy, acc)
    np.testing.assert_allclose(dx.asnumpy(), dx_ref.asnumpy(), rtol=1e-6, atol=1e-6)
    assert accumulated(layer, lora) == ([k for k in range(len(a)) if k % 3 != 2] if lora else list(range(len(w))))
    for p, got, want in zip(trained, acc, acc_ref):
        assert np.abs(want.asnumpy()).max() > 0, p.name  # every trained weight has a gradient: the check covers it
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=p.name)

    # the plan's count of what a layer keeps is the bytes of the tensors the pieces return
    gcfg = GRPOConfig()
    gcfg = dataclasses.replace(gcfg, actor_config=dataclasses.replace(gcfg.actor_config, recompute_num_layers=0,
                                                                     micro_batch_size=1))
    per_token = saved_activation_bytes(cfg, gcfg) / sequence_lengths(gcfg.generate_config)[0]  # 1 row, 1 layer
    assert per_token * B * S == sum(t.asnumpy().nbytes for t in saved)
    off = dataclasses.replace(gcfg, actor_config=dataclasses.replace(gcfg.actor_config, recompute_num_layers=None))
    assert saved_activation_bytes(cfg, off) == 0
