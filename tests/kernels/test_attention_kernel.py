"""mindgrpo/kernels/attention.py: the packed rows' causal attention kernel (forward, CPU, fp32) against an fp64
numpy attention with explicit masks (tests/attention_reference.py, an independent implementation) and
against `BlockAttention`'s MindSpore ops on the same inputs; the switch.

The inputs are packed rows as `models/reward_model.pack_rows` makes them: sequences with ids 1, 2, ... side by
side, then padding (id 0) to the row's end; runs longer than the kernel's 128-query tasks, a row of one sequence
and a row of padding only. Tolerance: the outputs are averages of values of order 1 with softmax weights; both
sides compute in fp32 and sum in other orders, so they agree to a few units of 1e-7 per element: 1e-5 leaves room
and is far below what a wrong key range, head or stride gives (differences of order 0.1 and more)."""

import mindspore as ms
import numpy as np
import pytest

from attention_reference import whole_row_attention  # tests/ is on the path (pyproject.toml)

from mindgrpo.kernels import matmul as kmatmul
from mindgrpo.kernels.attention import segment_attention
from mindgrpo.models.block_attention import BlockAttention


def packed(lengths_by_row, width):
    """segments (B, S) int32: each row's sequences' ids 1, 2, ... over their lengths, then 0 to the width."""
    seg = np.zeros((len(lengths_by_row), width), np.int32)
    for r, lengths in enumerate(lengths_by_row):
        at = 0
        for j, n in enumerate(lengths):
            seg[r, at:at + n] = j + 1
            at += n
    return seg


CASES = {
    "gqa_runs_across_tasks": (7 * 2, 2, 64, [[300, 17, 40], [5], [1, 1, 1, 200]], 384),
    "one_sequence_a_row": (4, 4, 16, [[130], [64], [129]], 160),
    "padding_only_row": (6, 3, 8, [[], [33, 31]], 96),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kernel_equals_masked_attention_and_the_blocks(built, kernels_on, case):
    nh, nkv, d, lengths, width = CASES[case]
    rng = np.random.default_rng(len(case))
    seg = packed(lengths, width)
    b = len(lengths)
    q, k, v = (rng.standard_normal((b, n, width, d)).astype(np.float32) for n in (nh, nkv, nkv))
    scale = d ** -0.5
    op = segment_attention()
    assert op is not None
    ours = op(ms.Tensor(q * np.float32(scale)), ms.Tensor(k), ms.Tensor(v), ms.Tensor(seg)).asnumpy()
    ours = ours.transpose(0, 2, 1, 3).reshape(b, width, nh * d)
    want = whole_row_attention(q, k, v, seg, scale)  # the padding's outputs too (a run of its own)
    assert np.abs(ours - want).max() < 1e-5, (case, np.abs(ours - want).max())

    kernel, blocks = BlockAttention(nh, nkv, scale), BlockAttention(nh, nkv, scale)
    assert kernel.kernel is not None
    blocks.kernel = None  # MindSpore's ops in blocks of queries, before its first call
    feed = (ms.Tensor(q), ms.Tensor(k), ms.Tensor(v), ms.Tensor(seg))
    with_kernel, theirs = kernel(*feed).asnumpy(), blocks(*feed).asnumpy()
    assert with_kernel.shape == theirs.shape == (b, width, nh * d)
    assert np.abs(with_kernel - theirs).max() < 1e-5
    assert np.abs(with_kernel - ours).max() < 1e-6  # q scaled in the graph, not in numpy: one rounding apart


def test_the_switch_and_other_dtypes_keep_mindspores_ops(built, monkeypatch):
    monkeypatch.setenv(kmatmul.ENV, "0")
    assert segment_attention() is None and BlockAttention(2, 1, 1.0).kernel is None
    monkeypatch.setenv(kmatmul.ENV, "1")
    assert segment_attention(ms.float16) is None and segment_attention() is not None
