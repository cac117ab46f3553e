"""LoRA dropout (mindgrpo/models/lora_dropout.py): the graph's mask against a numpy implementation of the hash the
module documents, written here on uint32 words; its keep fraction; a row-parallel piece's mask is the whole
input's at its columns; and the training graph against PEFT (torch) on the same random Qwen2 with its adapters,
PEFT's dropout modules replaced by multiplication with this test's numpy masks: logits and the adapters' gradients
of the GRPO loss."""

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from hf_models import padded_batch

from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import GradBuffer
from mindgrpo.grpo.train_graph import GRPOGradStep, PolicyLoss
from mindgrpo.models.lora import ALL_LINEAR, LoraSpec, adapter_parameters, add_adapters
from mindgrpo.models.lora_dropout import dropout_mask, host_layer_key, layer_key, projection_key, update_key
from mindgrpo.models.scoring import causal_bias, positions

from test_lora import BETA, _torch_grpo_grads, grpo_batch, make_pair  # tests/models is on sys.path under pytest

M32 = np.uint64(0xFFFFFFFF)


def _w(v):
    return np.asarray(v, np.uint64) & M32


def mix(h):
    """lowbias32 on uint32 words (held in uint64, masked after every product)."""
    h = _w(h)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x7FEB352D)) & M32
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(0x846CA68B)) & M32
    return h ^ (h >> np.uint64(16))


def np_update_key(seed, step, micro_batch, replica):
    h = mix(seed)
    for v in (step, micro_batch, replica):
        h = mix(h + np.uint64(v))
    return int(h)


def np_projection_key(key, layer, k):
    return int(mix(_w(np.uint64(key) + np.uint64(7 * layer + k) * np.uint64(0x9E3779B9))))


def np_mask(pkey, n, width, offset, p):
    """(n, width) float32: 1 / (1 - p) where kept, 0 where dropped (the docstring's hash)."""
    rows = mix(np.uint64(pkey) ^ np.arange(n, dtype=np.uint64))[:, None]
    cols = mix(_w((np.arange(width, dtype=np.uint64) + np.uint64(offset)) * np.uint64(0x85EBCA6B)))[None, :]
    h = _w(rows + cols)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x7FEB352D)) & M32
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(0x846CA68B)) & M32
    keep = (h >> np.uint64(8)) >= np.uint64(int(np.ceil(p * 2 ** 24)))
    return keep.astype(np.float32) * np.float32(1.0 / (1.0 - p))


def signed(v: int) -> np.int32:
    return np.int32(v - (1 << 32) if v >= 1 << 31 else v)


class _Mask(nn.Cell):
    def __init__(self, layer, k, n, width, offset, p):
        super().__init__()
        self.layer, self.k, self.n, self.width, self.offset = layer, k, n, width, offset
        self.thresh, self.scale = int(np.ceil(p * 2 ** 24)), 1.0 / (1.0 - p)

    def construct(self, key):
        pkey = projection_key(layer_key(key, self.layer), self.k)
        return dropout_mask(pkey, self.n, self.width, self.offset, self.thresh, self.scale, ms.float32)


@pytest.mark.parametrize("p", [0.05, 0.3])
def test_graph_mask_is_the_documented_hash_and_keeps_one_minus_p(p):
    key = update_key(1234, 17, 3, 1)
    assert int(key) == int(signed(np_update_key(1234, 17, 3, 1)))
    n, width, layer, k = 300, 160, 5, 6
    got = _Mask(layer, k, n, width, 0, p)(Tensor(key)).asnumpy()
    want = np_mask(np_projection_key(np_update_key(1234, 17, 3, 1), layer, k), n, width, 0, p)
    np.testing.assert_array_equal(got, want)
    assert host_layer_key(int(key), layer) == signed(int(_w(np.uint64(np_update_key(1234, 17, 3, 1))
                                                            + np.uint64(7 * layer * 0x9E3779B9))))
    kept = (got > 0).mean()
    se = np.sqrt(p * (1 - p) / got.size)
    assert abs(kept - (1 - p)) < 4 * se, (kept, 1 - p, se)
    # other projections, layers and keys draw other masks; rows and columns are not repeats of each other
    other = _Mask(layer, k - 1, n, width, 0, p)(Tensor(key)).asnumpy()
    assert 0 < (other != got).mean() and abs((other != got).mean() - 2 * p * (1 - p)) < 6 * np.sqrt(2 * p / got.size)
    assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[:, 0], got[:, 1])


def test_a_row_parallel_pieces_mask_is_the_whole_masks_columns():
    """o and down split x by columns under tensor parallelism: piece k's mask (offset k * in / tp, the
    `lora_offset` RowParallelLinear sets) is the one-device mask's columns."""
    from mindgrpo.parallel.comm import Group
    from mindgrpo.parallel.tp_layers import RowParallelLinear

    key, n, width, p = update_key(5, 2, 0), 40, 96, 0.2
    whole = _Mask(1, 3, n, width, 0, p)(Tensor(key)).asnumpy()
    for index in range(2):  # the pieces are made without a communication world (no collective runs here)
        group = Group(ranks=(0, 1), rank=index, name="tp_pieces")
        offset = RowParallelLinear(np.zeros((8, width // 2), np.float32), None, ms.float32, group).lora_offset
        assert offset == index * (width // 2)
        piece = _Mask(1, 3, n, width // 2, offset, p)(Tensor(key)).asnumpy()
        np.testing.assert_array_equal(piece, whole[:, offset:offset + width // 2])


def test_the_config_takes_a_dropout_in_range_into_the_spec():
    from mindgrpo.config import GRPOConfig, load_config
    from mindgrpo.grpo.builder import lora_config

    cfg = load_config(GRPOConfig, overrides=["actor_config.lora_rank=8", "actor_config.lora_dropout=0.05"])
    assert lora_config(cfg).dropout == 0.05


class _DroppedLogits(nn.Cell):
    """Right-padded ids (B, S), the micro-batch's dropout key -> logits (B, S, V) of the training forward."""

    def __init__(self, lm):
        super().__init__(auto_prefix=False)
        self.lm = lm

    def construct(self, ids, key):
        b, s = ids.shape
        h = self.lm.hidden_states(ids, positions(b, s), causal_bias(s), None, key)
        return self.lm.logits(self.lm.model.norm_out(h).reshape(b * s, -1)).reshape(b, s, -1)


def _peft_masks(peft_model, key, b, s, p):
    """PEFT's lora_dropout modules replaced by multiplication with this test's numpy masks of `key`."""
    import torch

    class Times(torch.nn.Module):
        def __init__(self, mask):
            super().__init__()
            self.mask = torch.tensor(mask)

        def forward(self, x):
            return x * self.mask.reshape(x.shape)

    layers = peft_model.base_model.model.model.layers
    for i, layer in enumerate(layers):
        for k, proj in enumerate(ALL_LINEAR):
            block = layer.self_attn if k < 4 else layer.mlp
            lin = getattr(block, proj)
            width = lin.in_features
            lin.lora_dropout["default"] = Times(np_mask(np_projection_key(key, i, k), b * s, width, 0, p))


def test_training_forward_and_gradients_match_peft_with_the_same_masks(tmp_path):
    import torch

    from mindgrpo.models.checkpoint import load_model
    from mindgrpo.models.lora import adapter_state, load_adapter_state

    p = 0.25
    peft_model, hf_dir, plain, _ = make_pair(tmp_path, "qwen2")
    lm = load_model(hf_dir)  # the same adapters, with PEFT's dropout p
    add_adapters(lm, LoraSpec(rank=plain.lora.rank, alpha=plain.lora.alpha, dropout=p))
    load_adapter_state(lm, adapter_state(plain), "PEFT's adapter")
    rng = np.random.default_rng(7)
    ids, mask = padded_batch(rng, 512, [16, 11, 7], 16)
    b, s = ids.shape
    key = update_key(3, 1, 0)
    raw = int(np.uint32(np.int64(key) & 0xFFFFFFFF))
    with torch.no_grad():
        base = peft_model(input_ids=torch.tensor(ids, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    _peft_masks(peft_model, raw, b, s, p)
    with torch.no_grad():
        ref = peft_model(input_ids=torch.tensor(ids, dtype=torch.long),
                         attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    ours = _DroppedLogits(lm)(Tensor(ids), Tensor(key)).asnumpy()
    keep = mask.astype(bool)
    assert np.abs(ref - base)[keep].max() > 0.05  # the masks change the logits
    assert np.abs(ours - ref)[keep].max() <= 1e-4

    prompt = np.array([5, 3, 2])
    lp = torch.log_softmax(torch.tensor(ref), -1).numpy()
    score_pos, labels, valid, old, refl, adv = grpo_batch(rng, ids, mask, prompt, lp)
    loss_ref, grads_ref = _torch_grpo_grads(peft_model, ids, mask, score_pos, labels, valid, adv, old, refl)

    params = [q for q in lm.get_parameters() if q.requires_grad]
    assert [q.name for q in params] == [q.name for q in adapter_parameters(lm)]
    buffer = GradBuffer(params)
    step = GRPOGradStep(PolicyLoss(lm, GRPOLoss(beta=BETA, kl_kind="k3"), detach_old=False, use_ref=True,
                                   dropout=True), params, buffer)
    loss, _ = step(Tensor(ids), ms.mutable((Tensor(score_pos), Tensor(labels), Tensor(key))), Tensor(valid),
                   Tensor(adv), Tensor(old), Tensor(refl), Tensor(np.float32(valid.sum())), Tensor(np.float32(3)),
                   None)
    assert abs(float(loss.asnumpy()) - loss_ref) <= 1e-5
    grads = {q.name: g.asnumpy() for q, g in zip(params, buffer.bufs)}
    assert sorted(grads) == sorted(grads_ref)
    assert max(np.abs(g).max() for g in grads_ref.values()) > 1e-2
    worst = max(np.abs(grads[n] - grads_ref[n]).max() for n in grads)
    assert worst <= 1e-5, worst
