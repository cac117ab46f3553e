"""Weights stored as panels for the rollout engine's products on the CPU (`panels.cc`), and the matmul that reads them.

    to_panels(w (K, N)) -> (N/32, K, 32), panel p holding W's columns 32p .. 32p+31, row by row
    op(x (M, K), panels) -> x @ W (M, N)

At a decode step's few rows a product reads the whole of W for little arithmetic; a row-major W is read 128 bytes
a row, a row apart, and MindSpore's MatMul (oneDNN) or OpenBLAS first copy it into panels of their own, every call.
Stored as panels once (when the engine remakes its fused weight copies, each generate call), W streams from memory
as it lies. docs/cpu_kernels.md, "Few rows", has the measurements.

`panel_matmul(...)` gives the op where it runs: CPU, fp32, MINDGRPO_CPU_KERNELS on, the library loaded and a CPU
with AVX-512; else None, and the engine keeps row-major copies and `matmul.rows_matmul`. `fits(shapes)` says
whether every copy of a model can be cut so: each (K, N) at least MIN_WIDTH both ways (the tiny model's width 128
keeps MindSpore's MatMul and its numerics) and N a multiple of WIDTH."""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Iterable, Optional

import mindspore as ms
from mindspore import ops

from mindgrpo.kernels.matmul import MIN_WIDTH, library, switched_on

WIDTH = 32  # columns of W in a panel: panels.cc's kWidth


def _out_shape(x, panels):
    return [x[0], panels[0] * WIDTH]


def _out_dtype(x, panels):
    return x


@lru_cache(maxsize=None)
def _cpu_has_avx512(path: str) -> bool:
    return bool(ctypes.CDLL(path).MindgrpoPanels())


def panel_matmul(dtype=ms.float32) -> Optional[ops.Custom]:
    """The op x (M, K), panels (N/32, K, 32) -> (M, N) for this compute dtype, or None (switched off, not CPU, not
    fp32, no library, no AVX-512). Forward only: the engine does not train."""
    if dtype != ms.float32 or not switched_on():
        return None
    path = library()
    if path is None or not _cpu_has_avx512(path):
        return None
    return ops.Custom(f"{path}:PanelMatMul", out_shape=_out_shape, out_dtype=_out_dtype, func_type="aot")


def fits(shapes: Iterable[tuple]) -> bool:
    """Whether every 2-D (K, N) of shapes is at least MIN_WIDTH both ways with N a multiple of WIDTH."""
    two_d = [s for s in shapes if len(s) == 2]
    return bool(two_d) and all(min(s) >= MIN_WIDTH and s[1] % WIDTH == 0 for s in two_d)


def panel_shape(shape: tuple) -> tuple:
    """(K, N) -> (N/32, K, 32); other ranks as they are (a bias)."""
    if len(shape) != 2:
        return shape
    k, n = shape
    return (n // WIDTH, k, WIDTH)


def to_panels(w):
    """Graph code: w (K, N) -> (N/32, K, 32), a copy in panel order."""
    k, n = w.shape
    return w.reshape(k, n // WIDTH, WIDTH).transpose(1, 0, 2)


def out_features(w) -> int:
    """N of a weight given row-major (K, N) or as panels (N/32, K, 32) (a constant in a graph)."""
    return w.shape[0] * WIDTH if len(w.shape) == 3 else w.shape[1]
