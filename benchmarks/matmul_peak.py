"""fp32 matmul GFLOP/s of MindSpore (graph mode), of our CPU kernel (`mindgrpo.kernels`, OpenBLAS's sgemm as a
MindSpore `ops.Custom`) or of PyTorch on given shapes: the peak a benchmark's measured rate is set against, taken
in the same process, right after the measurement, under the same machine load.

    python -m benchmarks.matmul_peak [--repeats 5] [--sides mindspore ours torch]

prints the three sides per shape class of the Qwen2.5-0.5B model (the projections at 16 and 512 rows, the MLP,
the vocabulary head at 16 rows, a 2048 square), timed in turns (`harness.alternate`) so that a change of the
machine's load hits every side alike. A shape class is (M, K, N, form): c (M, N) = op(a) @ op(b) with a (M, K)
and b (N, K) for form "NT" (a Linear layer, x W^T), b (K, N) for "NN" (its input's gradient, dy W), a (K, M) and
b (K, N) for "TN" (its weight's gradient, dy^T x)."""

from __future__ import annotations

import argparse
from typing import Callable, Dict

import numpy as np

from benchmarks.harness import alternate, timed

SQUARES = {"square 1024": (1024, 1024, 1024), "square 2048": (2048, 2048, 2048)}
H, I, V = 896, 4864, 151936  # Qwen2.5-0.5B: hidden, MLP, vocabulary
SHAPE_CLASSES = {
    "proj 16 NT": (16, H, H, "NT"),
    "proj 512 NT": (512, H, H, "NT"),
    "mlp 16 NT": (16, H, I, "NT"),
    "mlp 512 NT": (512, H, I, "NT"),
    "mlp down 512 NT": (512, I, H, "NT"),
    "mlp down 512 NN": (512, H, I, "NN"),
    "mlp grad 512 TN": (I, 512, H, "TN"),
    "head 16 NT": (16, H, V, "NT"),
    "square 2048 NN": (2048, 2048, 2048, "NN"),
}
SIDES = ("mindspore", "ours", "torch")


def product(framework: str, a: np.ndarray, b: np.ndarray, form: str = "NN") -> Callable[[], object]:
    """A zero-argument call of a @ b (form "NN"), a @ b^T ("NT") or a^T @ b ("TN") on fixed fp32 inputs, in "mindspore" (its
    MatMul in a graph), "ours" (mindgrpo.kernels.matmul in a graph: MindSpore's when switched off) or "torch"."""
    if framework in ("mindspore", "ours"):
        import mindspore as ms
        from mindspore import nn, ops

        from mindgrpo.kernels.matmul import matmul

        class MatMul(nn.Cell):
            def __init__(self, op):
                super().__init__()
                self.op = op

            def construct(self, x, y):
                return self.op(x, y)

        ta, tb = form[0] == "T", form[1] == "T"
        net = MatMul(ops.MatMul(ta, tb) if framework == "mindspore" else matmul(ta, tb))
        x, y = ms.Tensor(a), ms.Tensor(b)
        return lambda: net(x, y).asnumpy()
    import torch

    x, y = torch.from_numpy(a), torch.from_numpy(b)
    if form == "NT":
        return lambda: torch.nn.functional.linear(x, y)
    if form == "TN":
        return lambda: torch.matmul(x.t(), y)
    return lambda: torch.matmul(x, y)


def _operands(m: int, k: int, n: int, form: str, rng) -> tuple:
    a_shape = (k, m) if form[0] == "T" else (m, k)
    b_shape = (n, k) if form[1] == "T" else (k, n)
    return rng.random(a_shape, np.float32), rng.random(b_shape, np.float32)


def matmul_gflops(framework: str, shapes: Dict[str, tuple], repeats: int = 3) -> Dict[str, float]:
    """fp32 GFLOP/s of (m, k) @ (k, n) for each label -> (m, k, n) (median of `repeats` after one
    untimed call) in "mindspore" (graph mode), "ours" or "torch"; "peak" is the best of the shapes."""
    rng = np.random.default_rng(0)
    out = {}
    for label, (m, k, n) in shapes.items():
        fn = product(framework, *_operands(m, k, n, "NN", rng))
        fn()
        out[label] = 2 * m * k * n / timed(fn, repeats)[0] / 1e9
    out["peak"] = max(out.values())
    return out


def side_by_side(sides=SIDES, classes=SHAPE_CLASSES, repeats: int = 5) -> Dict[str, Dict[str, float]]:
    """label -> side -> GFLOP/s (median of `repeats` calls taken in turns, after one untimed call each)."""
    rng = np.random.default_rng(0)
    out = {}
    for label, (m, k, n, form) in classes.items():
        a, b = _operands(m, k, n, form, rng)
        fns = {s: product(s, a, b, form) for s in sides}
        for fn in fns.values():
            fn()
        times = alternate(fns, repeats)
        out[label] = {s: 2 * m * k * n / float(np.median(t)) / 1e9 for s, t in times.items()}
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    args = p.parse_args(argv)
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    rates = side_by_side(args.sides, repeats=args.repeats)
    print(f"{'shape class (M, K, N, form)':40s}" + "".join(f"{s:>11s}" for s in args.sides)
          + ("   ours/mindspore" if {"ours", "mindspore"} <= set(args.sides) else ""))
    for label, r in rates.items():
        m, k, n, form = SHAPE_CLASSES[label]
        row = f"{label + f' ({m}, {k}, {n})':40s}" + "".join(f"{r[s]:11.1f}" for s in args.sides)
        if "ours" in r and "mindspore" in r:
            row += f"   {r['ours'] / r['mindspore']:.2f}x"
        print(row)
    print("GFLOP/s, fp32, median of", args.repeats)


if __name__ == "__main__":
    main()
