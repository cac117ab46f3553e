"""mindgrpo.kernels.panels: the rollout engine's weights as panels and PanelMatMul, against an fp64 numpy product.

Tolerance: fp32 rounding per element, K u / (1 - K u) * (|x| @ |W|) with u = 2^-24, as in test_matmul.py. A wrong
panel order, row block or thread split is off by the size of the entries, orders of magnitude above it."""

import ctypes

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from mindgrpo.kernels import matmul as kmatmul
from mindgrpo.kernels import panels as kpanels

U = 2.0 ** -24

pytestmark = pytest.mark.usefixtures("kernels_on")  # tests/kernels/conftest.py


@pytest.fixture(scope="module")
def avx512(built):
    if not ctypes.CDLL(kmatmul.library()).MindgrpoPanels():
        pytest.skip("this CPU has no AVX-512: the engine keeps row-major weights and rows_matmul")


class PanelProduct(nn.Cell):
    """x, w (K, N) -> x @ w through the graph code the engine runs: w cut into panels, then PanelMatMul."""

    def __init__(self):
        super().__init__()
        self.op = kpanels.panel_matmul()

    def construct(self, x, w):
        return self.op(x, kpanels.to_panels(w))


def exact_and_bound(x, w):
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    k = x.shape[1]
    return x64 @ w64, k * U / (1 - k * U) * (np.abs(x64) @ np.abs(w64))


# (M, K, N): a decode step's rows at the Qwen2.5-0.5B engine's fused widths (q/k/v, o, gate-up, down), a row of
# each count a tile takes (1 to 8, then 9), rows across the row blocks of a long K (512 KB / (4 x 4864): blocks of 24),
# a prefill's many rows, a product too small to split over threads
SHAPES = [(16, 896, 1152), (16, 896, 896), (16, 896, 9728), (16, 4864, 896), (1, 256, 256), (7, 300, 512),
          (9, 256, 288), (61, 4864, 320), (600, 896, 512), (3, 256, 32 * 8)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_panel_matmul_is_exact_to_fp32_rounding(avx512, m, k, n):
    rng = np.random.default_rng(m * 7 + n)
    x = rng.standard_normal((m, k), np.float32)
    w = rng.standard_normal((k, n), np.float32)
    c = PanelProduct()(ms.Tensor(x), ms.Tensor(w)).asnumpy()
    exact, bound = exact_and_bound(x, w)
    assert c.shape == (m, n)
    assert np.all(np.abs(c - exact) <= bound), (m, k, n, np.max(np.abs(c - exact) / bound))


def test_to_panels_is_the_documented_layout(avx512):
    w = np.arange(64 * 96, dtype=np.float32).reshape(64, 96)

    class Cut(nn.Cell):
        def construct(self, w):
            return kpanels.to_panels(w)

    p = Cut()(ms.Tensor(w)).asnumpy()
    assert p.shape == kpanels.panel_shape(w.shape) == (3, 64, 32)
    for panel in range(3):
        np.testing.assert_array_equal(p[panel], w[:, 32 * panel:32 * panel + 32])
    assert kpanels.out_features(ms.Tensor(p)) == 96 and kpanels.out_features(ms.Tensor(w)) == 96


def test_which_models_fit_and_when_the_op_is_given(avx512, monkeypatch):
    assert kpanels.fits([(896, 1152), (896, 896), (896, 9728), (4864, 896), (1152,)])
    assert not kpanels.fits([(128, 256), (128, 128)])  # the tiny model: narrower than MIN_WIDTH
    assert not kpanels.fits([(256, 272)])  # N not a multiple of 32
    assert not kpanels.fits([(512,)])  # no matrix
    assert isinstance(kpanels.panel_matmul(), ops.Custom)
    assert kpanels.panel_matmul(ms.float16) is None
    monkeypatch.setenv(kmatmul.ENV, "0")
    assert kpanels.panel_matmul() is None
