"""fp32 matmul GFLOP/s of MindSpore (graph mode) or PyTorch on given shapes: the peak a benchmark's
measured rate is set against, taken in the same process, right after the measurement, under the same
machine load."""

from __future__ import annotations

from typing import Dict

import numpy as np

from benchmarks.harness import timed

SQUARES = {"square 1024": (1024, 1024, 1024), "square 2048": (2048, 2048, 2048)}


def matmul_gflops(framework: str, shapes: Dict[str, tuple], repeats: int = 3) -> Dict[str, float]:
    """fp32 GFLOP/s of (m, k) @ (k, n) for each label -> (m, k, n) (median of `repeats` after one
    untimed call) in "mindspore" (graph mode) or "torch"; "peak" is the best of the shapes."""
    if framework == "mindspore":
        import mindspore as ms
        from mindspore import nn, ops

        class MatMul(nn.Cell):
            def construct(self, a, b):
                return ops.matmul(a, b)

        net = MatMul()
        make = lambda a, b: lambda x=ms.Tensor(a), y=ms.Tensor(b): net(x, y).asnumpy()  # noqa: E731
    else:
        import torch

        make = lambda a, b: lambda x=torch.from_numpy(a), y=torch.from_numpy(b): torch.matmul(x, y)  # noqa: E731
    rng = np.random.default_rng(0)
    out = {}
    for label, (m, k, n) in shapes.items():
        fn = make(rng.random((m, k), np.float32), rng.random((k, n), np.float32))
        fn()
        out[label] = 2 * m * k * n / timed(fn, repeats)[0] / 1e9
    out["peak"] = max(out.values())
    return out
