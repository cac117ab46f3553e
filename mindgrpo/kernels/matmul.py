"""An fp32 MatMul for MindSpore's CPU backend: OpenBLAS's sgemm as `ops.Custom` "aot" kernels (`sgemm.cc`, built
by `build.py`), with their backward through the same kernels; `matmul(...)` stands in for `ops.MatMul(...)`.

MINDGRPO_CPU_KERNELS: unset or 1 -> ours on device_target CPU for fp32; 0 -> MindSpore's MatMul everywhere.
Ascend (and GPU) always keep MindSpore's MatMul, and so does every compute dtype but fp32. When the library is
absent or does not load, MindSpore's MatMul is used, with one log line saying why.

`rows_matmul(...)` is what the model uses (its projections, their LoRA adapters and the vocabulary head; the rollout
engine's products on its fused weights and its head, `mindgrpo/inference/layers.py`): ours
for a product of at least MIN_ROWS token rows whose other two sizes are at least MIN_WIDTH, MindSpore's
otherwise (decode's few rows; narrow layers such as the tiny model's or a LoRA rank's), chosen when the graph is
compiled: the shapes of our graphs are static, so the `if` on shapes in `RowsMatMul.construct` is a constant.

MindSpore 2.10's CPU MatMul runs oneDNN's `gemm:jit:f32` on AVX2 machines (DEVELOPERS.md);
`python -m benchmarks.matmul_peak` sets the two side by side with PyTorch's, `--rows` by row count."""

from __future__ import annotations

import ctypes
import logging
import os
from functools import lru_cache
from typing import Optional

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.kernels.build import library_path

logger = logging.getLogger(__name__)

ENV = "MINDGRPO_CPU_KERNELS"
# Where the model takes ours: at least MIN_ROWS token rows, and the product's two other sizes (the layer's in and
# out features) at least MIN_WIDTH. `python -m benchmarks.matmul_peak --rows` (docs/cpu_kernels.md, "The
# threshold", has the tables): below 512 rows neither side won clearly, and narrow products (the tiny model's width 128,
# microseconds each) measured noise either way, so they keep MindSpore's and the tiny recipe's numerics.
MIN_ROWS = 512
MIN_WIDTH = 256


def switched_on() -> bool:
    """MINDGRPO_CPU_KERNELS (unset: on) and device_target CPU; a value other than 0 or 1 is refused."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{ENV}={value!r}: expected 0 (MindSpore's MatMul) or 1 (ours on CPU, fp32)")
    return value == "1" and ms.get_context("device_target") == "CPU"


def threads() -> int:
    """As many threads as MindSpore's own CPU kernels use: its runtime_num_threads, at most the usable cores."""
    cores = len(os.sched_getaffinity(0))
    return max(1, min(cores, int(ms.get_context("runtime_num_threads") or cores)))


@lru_cache(maxsize=None)
def library() -> Optional[str]:
    """The built library's path with OpenBLAS's threads set, or None (logged once) when it is absent or fails."""
    path = library_path()
    if path is None or not os.path.exists(path):
        logger.warning("%s: no kernel library (%s); MindSpore's MatMul is used. Build it: python -m "
                       "mindgrpo.kernels.build", ENV, "scipy-openblas32 not installed" if path is None else path)
        return None
    try:
        ctypes.CDLL(path).MindgrpoSetThreads(ctypes.c_int(threads()))
    except (OSError, AttributeError) as e:
        logger.warning("%s: the kernel library %s does not load (%s); MindSpore's MatMul is used", ENV, path, e)
        return None
    return path


# Output shapes of c = op(a) @ op(b) for the three kernels: N plain, T transposed.
_SHAPES = {
    "NN": lambda a, b: [a[0], b[1]],
    "NT": lambda a, b: [a[0], b[0]],
    "TN": lambda a, b: [a[1], b[1]],
}


def _kernel(path: str, name: str, bprop=None):
    return ops.Custom(f"{path}:MatMul{name}", out_shape=_SHAPES[name], out_dtype=lambda a, b: a,
                      func_type="aot", bprop=bprop)


def _differentiable(path: str, name: str):
    """The kernel `name` with its backward through the plain kernels (graph code: named functions, no lambdas):
    NN  c = a b      -> da = dc b^T (NT),  db = a^T dc (TN)
    NT  c = a b^T    -> da = dc b (NN),    db = dc^T a (TN)
    TN  c = a^T b    -> da = b dc^T (NT),  db = a dc (NN)"""
    nn_, nt, tn = (_kernel(path, n) for n in ("NN", "NT", "TN"))

    def bprop_nn(a, b, out, dc):
        return nt(dc, b), tn(a, dc)

    def bprop_nt(a, b, out, dc):
        return nn_(dc, b), tn(dc, a)

    def bprop_tn(a, b, out, dc):
        return nt(b, dc), nn_(a, dc)

    return _kernel(path, name, {"NN": bprop_nn, "NT": bprop_nt, "TN": bprop_tn}[name])


def matmul(transpose_a: bool = False, transpose_b: bool = False, dtype=ms.float32):
    """A primitive for c (M, N) = op(a) @ op(b) on 2-D tensors, as `ops.MatMul(transpose_a, transpose_b)`:
    ours when switched on (CPU, fp32, the library loaded), else MindSpore's. Both transposed: MindSpore's."""
    name = {(False, False): "NN", (False, True): "NT", (True, False): "TN"}.get((transpose_a, transpose_b))
    if name is None or dtype != ms.float32 or not switched_on():
        return ops.MatMul(transpose_a=transpose_a, transpose_b=transpose_b)
    path = library()
    if path is None:
        return ops.MatMul(transpose_a=transpose_a, transpose_b=transpose_b)
    return _differentiable(path, name)


class RowsMatMul(nn.Cell):
    """c = op(a) @ op(b) on 2-D tensors with ours when a's leading dimension (the token rows: x (N, in) forward,
    dy (N, out) in both gradients) is at least `min_rows`, a's other one and b's free one (the layer's in and out
    features) at least `min_width`, and both are fp32; else MindSpore's MatMul. Shapes and dtypes are constants
    when the graph is compiled (static shapes), so each compiled product holds one of the two."""

    def __init__(self, ours, transpose_a: bool, transpose_b: bool, min_rows: int, min_width: int):
        super().__init__()
        self.ours = ours
        self.theirs = ops.MatMul(transpose_a=transpose_a, transpose_b=transpose_b)
        self.free_b = 0 if transpose_b else 1  # b's dimension that is not summed over
        self.min_rows, self.min_width = min_rows, min_width

    def construct(self, a, b):
        if self.takes(a, b):
            return self.ours(a, b)
        return self.theirs(a, b)

    def takes(self, a, b) -> bool:
        """Whether ours computes op(a) @ op(b): the rule above on their shapes and dtypes (constants when a graph is
        compiled). Graph code may call it to choose between ours and a product of its own (the rollout engine's
        head)."""
        return a.shape[0] >= self.min_rows and a.shape[1] >= self.min_width and b.shape[self.free_b] >= self.min_width \
            and a.dtype == ms.float32 and b.dtype == ms.float32


def rows_matmul(transpose_a: bool = False, transpose_b: bool = False, dtype=ms.float32, min_rows: int = MIN_ROWS,
                min_width: int = MIN_WIDTH):
    """What the model's projections and head call: `RowsMatMul` over ours when `matmul(...)` gives ours, else
    MindSpore's MatMul itself (switched off, Ascend/GPU, a compute dtype but fp32, no library: the graph is as
    it was before these kernels)."""
    ours = matmul(transpose_a, transpose_b, dtype)
    if not isinstance(ours, ops.Custom):
        return ours
    return RowsMatMul(ours, transpose_a, transpose_b, min_rows, min_width)
