"""mindgrpo.kernels: OpenBLAS's sgemm as MindSpore `ops.Custom` kernels, against MindSpore's MatMul and an fp64
numpy product, forward and gradients, on the shape classes of benchmarks/matmul_peak.py; the switch and the
fallbacks; the build.

Tolerance: fp32 rounding, per element. A sum of K products computed in fp32 in any order is within
gamma_K * sum_i |a_i b_i| of the exact one, gamma_K = K u / (1 - K u), u = 2^-24 (Higham, "Accuracy and
Stability of Numerical Algorithms", 3.1): each side is checked against the fp64 product with that bound
(numpy in fp64, an independent implementation), and ours against MindSpore's with twice it. A wrong transpose,
block or stride is off by the size of the entries themselves, orders of magnitude above it."""

import logging
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from benchmarks.matmul_peak import SHAPE_CLASSES
from mindgrpo.kernels import build as kbuild
from mindgrpo.kernels import matmul as kmatmul

U = 2.0 ** -24


pytestmark = pytest.mark.usefixtures("kernels_on")  # tests/kernels/conftest.py


class Grads(nn.Cell):
    """(a, b, dc) -> (c, da, db) of c = op(a) @ op(b) with the given primitive."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.grad = ops.GradOperation(get_all=True, sens_param=True)

    def forward(self, a, b):
        return self.op(a, b)

    def construct(self, a, b, dc):
        da, db = self.grad(self.forward)(a, b, dc)
        return self.op(a, b), da, db


def reference(a, b, dc, ta, tb):
    """fp64 (c, da, db) and their error scales (|op(a)| @ |op(b)| etc., with each product's inner size)."""
    a64, b64, dc64 = (x.astype(np.float64) for x in (a, b, dc))
    oa, ob = (a64.T if ta else a64), (b64.T if tb else b64)
    c, da_op, db_op = oa @ ob, dc64 @ ob.T, oa.T @ dc64  # grads of op(a), op(b)
    scale = (np.abs(oa) @ np.abs(ob), np.abs(dc64) @ np.abs(ob.T), np.abs(oa.T) @ np.abs(dc64))
    inner = (oa.shape[1], ob.shape[1], oa.shape[0])
    exact = (c, da_op.T if ta else da_op, db_op.T if tb else db_op)
    bounds = tuple(k * U / (1 - k * U) * (s.T if t else s)
                   for k, s, t in zip(inner, scale, (False, ta, tb)))
    return exact, bounds



class OneOp(nn.Cell):
    """A graph of one product: op(a, b)."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, a, b):
        return self.op(a, b)


@pytest.mark.parametrize("label", [k for k in SHAPE_CLASSES if not k.startswith("square")])
def test_forward_and_gradients_match_mindspore_within_fp32_rounding(built, label):
    m, k, n, form = SHAPE_CLASSES[label]
    if label.startswith("head"):
        n //= 8  # the head's 16 rows and long N at 1/8 of the vocabulary (the same split); whole, 106 s under load
    ta, tb = form[0] == "T", form[1] == "T"
    rng = np.random.default_rng(list(SHAPE_CLASSES).index(label))  # str hashes change between processes
    a = rng.standard_normal((k, m) if ta else (m, k), np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), np.float32)
    dc = rng.standard_normal((m, n), np.float32)
    ours_op = kmatmul.matmul(ta, tb)
    assert isinstance(ours_op, ops.Custom)
    args = (ms.Tensor(a), ms.Tensor(b), ms.Tensor(dc))
    ours = [x.asnumpy() for x in Grads(ours_op)(*args)]
    theirs = [x.asnumpy() for x in Grads(ops.MatMul(ta, tb))(*args)]
    exact, bounds = reference(a, b, dc, ta, tb)
    for name, o, t, e, bound in zip(("c", "da", "db"), ours, theirs, exact, bounds):
        assert o.shape == t.shape == e.shape, name
        assert np.all(np.abs(o - e) <= bound), (label, name, np.max(np.abs(o - e) / bound))
        assert np.all(np.abs(t - e) <= bound), (label, name, "MindSpore's", np.max(np.abs(t - e) / bound))
        assert np.all(np.abs(o - t) <= 2 * bound), (label, name, np.max(np.abs(o - t) / bound))


def test_small_and_odd_shapes_are_exact(built):
    """Shapes the kernel's thread split meets at its edges: one row, a 17-row split, widths not a multiple of 16,
    each against fp64 within the fp32 bound."""
    rng = np.random.default_rng(1)
    for m, k, n in ((1, 7, 3), (17, 300, 1001), (2049, 64, 33)):
        a = rng.standard_normal((m, k), np.float32)
        b = rng.standard_normal((n, k), np.float32)
        c = OneOp(kmatmul.matmul(transpose_b=True))(ms.Tensor(a), ms.Tensor(b)).asnumpy()
        exact = a.astype(np.float64) @ b.T.astype(np.float64)
        bound = k * U / (1 - k * U) * (np.abs(a.astype(np.float64)) @ np.abs(b.T.astype(np.float64)))
        assert np.all(np.abs(c - exact) <= bound), (m, k, n)


def test_switched_off_and_unsupported_cases_keep_mindspores_matmul(built, monkeypatch):
    monkeypatch.setenv(kmatmul.ENV, "0")
    assert type(kmatmul.matmul(transpose_b=True)) is ops.MatMul
    monkeypatch.setenv(kmatmul.ENV, "1")
    assert isinstance(kmatmul.matmul(transpose_b=True), ops.Custom)
    assert type(kmatmul.matmul(transpose_b=True, dtype=ms.float16)) is ops.MatMul  # fp32 only
    assert type(kmatmul.matmul(True, True)) is ops.MatMul  # no kernel for both transposed
    op = kmatmul.matmul(True, True)
    assert op.transpose_a and op.transpose_b
    monkeypatch.setenv(kmatmul.ENV, "yes")
    with pytest.raises(ValueError, match="MINDGRPO_CPU_KERNELS='yes'"):
        kmatmul.matmul()


def test_a_missing_library_falls_back_with_one_log_line(built, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(kmatmul.ENV, "1")
    monkeypatch.setattr(kmatmul, "library_path", lambda: str(tmp_path / "absent.so"))
    kmatmul.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=kmatmul.__name__):
            ops_ = [kmatmul.matmul(transpose_b=True) for _ in range(3)]
        assert all(type(o) is ops.MatMul for o in ops_)
        lines = [r.getMessage() for r in caplog.records if r.name == kmatmul.__name__]
        assert len(lines) == 1 and "absent.so" in lines[0] and "mindgrpo.kernels.build" in lines[0], lines
        (tmp_path / "broken.so").write_text("not a library")  # present but does not load
        monkeypatch.setattr(kmatmul, "library_path", lambda: str(tmp_path / "broken.so"))
        kmatmul.library.cache_clear()
        assert type(kmatmul.matmul(transpose_b=True)) is ops.MatMul
        assert "does not load" in caplog.records[-1].getMessage()
    finally:
        monkeypatch.undo()
        kmatmul.library.cache_clear()


def test_build_writes_the_library_whole_or_not_at_all(built, monkeypatch, tmp_path):
    monkeypatch.setenv("MINDGRPO_KERNEL_DIR", str(tmp_path / "bad"))
    with pytest.raises(RuntimeError, match="failed|could not run"):
        kbuild.build(compiler="false")  # a compiler that fails
    assert os.listdir(tmp_path / "bad") == []  # no half-written library left behind
    monkeypatch.setenv("MINDGRPO_KERNEL_DIR", str(tmp_path / "good"))
    path = kbuild.build()
    assert path == kbuild.library_path() and os.path.dirname(path) == str(tmp_path / "good")
    assert os.listdir(tmp_path / "good") == [os.path.basename(path)]
    mtime = os.stat(path).st_mtime_ns
    assert kbuild.build() == path and os.stat(path).st_mtime_ns == mtime  # built once


def test_rows_matmul_takes_ours_from_min_rows_and_min_width_and_mindspores_below(built, monkeypatch):
    """RowsMatMul on either side of its thresholds (rows, then each of the two free sizes): bit for bit the product
    of the kernel it chose (ours and MindSpore's round the sums of K = 896 differently, so the two are told apart);
    fp16 inputs at many rows and a switched-off or fp16 factory give MindSpore's MatMul."""
    monkeypatch.setenv(kmatmul.ENV, "1")
    chooser = kmatmul.rows_matmul(transpose_b=True, min_rows=64, min_width=700)
    assert isinstance(chooser, kmatmul.RowsMatMul)
    rng = np.random.default_rng(5)
    told_apart = 0
    # (rows, in, out): below the rows, at the rows, above, then in or out one short of the width
    for m, k, n, taken in ((63, 896, 700, "theirs"), (64, 896, 700, "ours"), (200, 896, 700, "ours"),
                           (200, 896, 699, "theirs"), (200, 699, 896, "theirs")):
        a = rng.standard_normal((m, k), np.float32)
        b = rng.standard_normal((n, k), np.float32)
        got = OneOp(chooser)(ms.Tensor(a), ms.Tensor(b)).asnumpy()
        ours = OneOp(kmatmul.matmul(transpose_b=True))(ms.Tensor(a), ms.Tensor(b)).asnumpy()
        theirs = OneOp(ops.MatMul(transpose_b=True))(ms.Tensor(a), ms.Tensor(b)).asnumpy()
        np.testing.assert_array_equal(got, ours if taken == "ours" else theirs, err_msg=str((m, k, n)))
        told_apart += not np.array_equal(ours, theirs)
    assert told_apart == 5  # each case tells the two kernels apart
    # the free size of b in the other forms: NN b (K, N), TN a (K, M) with b (K, N)
    for ta, a_shape, b_shape, taken in ((False, (64, 896), (896, 699), "theirs"),
                                        (False, (64, 896), (896, 700), "ours"),
                                        (True, (600, 700), (600, 699), "theirs"),
                                        (True, (600, 700), (600, 896), "ours")):
        op = kmatmul.rows_matmul(transpose_a=ta, min_rows=64, min_width=700)
        a = rng.standard_normal(a_shape, np.float32)
        b = rng.standard_normal(b_shape, np.float32)
        got = OneOp(op)(ms.Tensor(a), ms.Tensor(b)).asnumpy()
        ours = OneOp(kmatmul.matmul(transpose_a=ta))(ms.Tensor(a), ms.Tensor(b)).asnumpy()
        theirs = OneOp(ops.MatMul(transpose_a=ta))(ms.Tensor(a), ms.Tensor(b)).asnumpy()
        np.testing.assert_array_equal(got, ours if taken == "ours" else theirs, err_msg=str((ta, a_shape, b_shape)))
        told_apart += not np.array_equal(ours, theirs)
    assert told_apart == 9
    half = np.float16
    a, b = rng.standard_normal((200, 896)).astype(half), rng.standard_normal((700, 896)).astype(np.float32)
    got = OneOp(chooser)(ms.Tensor(a), ms.Tensor(b.astype(half))).asnumpy()  # fp16 at many rows: MindSpore's
    theirs = OneOp(ops.MatMul(transpose_b=True))(ms.Tensor(a), ms.Tensor(b.astype(half))).asnumpy()
    np.testing.assert_array_equal(got, theirs)
    assert type(kmatmul.rows_matmul(transpose_b=True, dtype=ms.float16)) is ops.MatMul
    monkeypatch.setenv(kmatmul.ENV, "0")
    assert type(kmatmul.rows_matmul(transpose_b=True)) is ops.MatMul
