"""fp32 matmul GFLOP/s of MindSpore (graph mode), of our CPU kernel (`mindgrpo.kernels`, OpenBLAS's sgemm as a
MindSpore `ops.Custom`) or of PyTorch on given shapes: the peak a benchmark's measured rate is set against, taken
in the same process, right after the measurement, under the same machine load.

    python -m benchmarks.matmul_peak [--repeats 5] [--sides mindspore ours torch] [--threads N] [--rows]

prints the three sides per shape class of the Qwen2.5-0.5B model (the projections at 16 and 512 rows, the MLP,
the vocabulary head at 16 rows, a 2048 square), timed in turns so that a change of the machine's load hits every
side alike: GFLOP/s of wall time, then per second of the process's CPU time (on a busy machine the first measures
the scheduler as much as the kernel; the second counts a spinning thread's wait as work). --threads sets
MindSpore's runtime_num_threads (ours follows it) and PyTorch's threads; default: each side's own. A shape class is (M, K, N, form): c (M, N) = op(a) @ op(b) with a (M, K)
and b (N, K) for form "NT" (a Linear layer, x W^T), b (K, N) for "NN" (its input's gradient, dy W), a (K, M) and
b (K, N) for "TN" (its weight's gradient, dy^T x).

--rows: the row sweep (`ROW_SWEEP`) instead, MindSpore against ours: each layer shape of the 0.5B and the tiny
models and the fused head's chunk (a 1/8 vocabulary slice) at 16 to 512 rows, in the three forms a Linear
meets (forward NT, input gradient NN, weight gradient TN): the table behind `mindgrpo.kernels.matmul.MIN_ROWS`."""

from __future__ import annotations

import argparse
import time
from typing import Callable, Dict

import numpy as np

from benchmarks.harness import timed

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
TINY_H, TINY_I, TINY_V = 128, 512, 512  # model_configs/tiny_qwen2.yaml (the shipped tiny recipe)
SWEEP_ROWS = (16, 32, 64, 128, 256, 512)
SWEEP_LAYERS = {  # name -> (in, out) of y (rows, out) = x (rows, in) W^T
    "proj": (H, H), "mlp": (H, I), "mlp down": (I, H), "head/8": (H, V // 8),
    "tiny proj": (TINY_H, TINY_H), "tiny mlp": (TINY_H, TINY_I), "tiny mlp down": (TINY_I, TINY_H),
    "tiny head": (TINY_H, TINY_V),
}


def _sweep() -> Dict[str, tuple]:
    """label -> (M, K, N, form) of a Linear (in -> out) at r rows: forward NT (r, in, out), input gradient NN
    (r, out, in), weight gradient TN (out, r, in)."""
    out = {}
    for name, (k, n) in SWEEP_LAYERS.items():
        for r in SWEEP_ROWS:
            out[f"{name} {r} NT"] = (r, k, n, "NT")
            out[f"{name} {r} NN"] = (r, n, k, "NN")
            out[f"{name} {r} TN"] = (n, r, k, "TN")
    return out


ROW_SWEEP = _sweep()


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


def square_rates(sides=("mindspore", "ours")) -> Dict[str, Dict[str, float]]:
    """side -> `matmul_gflops` on SQUARES ("peak": the better): the rates a benchmark records beside its times,
    taken in its own process after its measurement."""
    return {side: matmul_gflops(side, SQUARES) for side in sides}


def side_by_side(sides=SIDES, classes=SHAPE_CLASSES, repeats: int = 5) -> Dict[str, Dict[str, Dict[str, float]]]:
    """label -> "wall" / "cpu" -> side -> GFLOP/s per second of wall / of process CPU time (medians of `repeats`
    calls taken in turns, after one untimed call each)."""
    rng = np.random.default_rng(0)
    out = {}
    for label, (m, k, n, form) in classes.items():
        a, b = _operands(m, k, n, form, rng)
        fns = {s: product(s, a, b, form) for s in sides}
        for fn in fns.values():
            fn()
        wall, cpu = {s: [] for s in sides}, {s: [] for s in sides}
        for _ in range(repeats):
            for s, fn in fns.items():
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                wall[s].append(time.perf_counter() - t0)
                cpu[s].append(time.process_time() - c0)
        gflop = 2 * m * k * n / 1e9
        out[label] = {kind: {s: gflop / float(np.median(t[s])) for s in sides} for kind, t in (("wall", wall),
                                                                                                ("cpu", cpu))}
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sides", nargs="+", choices=SIDES, default=None,
                   help="default: all three; with --rows MindSpore and ours")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rows", action="store_true", help="the row sweep (MindSpore and ours unless --sides says)")
    args = p.parse_args(argv)
    classes = ROW_SWEEP if args.rows else SHAPE_CLASSES
    args.sides = args.sides or (["mindspore", "ours"] if args.rows else list(SIDES))
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    if args.threads:
        ms.set_context(runtime_num_threads=args.threads)
        if "torch" in args.sides:
            import torch

            torch.set_num_threads(args.threads)
    rates = side_by_side(args.sides, classes, repeats=args.repeats)
    both = {"ours", "mindspore"} <= set(args.sides)
    for kind, unit in (("wall", "GFLOP/s of wall time"), ("cpu", "GFLOP per CPU second")):
        print(f"{unit}, fp32, median of {args.repeats}, threads {args.threads or 'default'}")
        print(f"{'shape class (M, K, N, form)':44s}" + "".join(f"{s:>11s}" for s in args.sides)
              + ("   ours/mindspore" if both else ""))
        for label, by_kind in rates.items():
            r = by_kind[kind]
            m, k, n, form = classes[label]
            row = f"{label + f' ({m}, {k}, {n})':44s}" + "".join(f"{r[s]:11.1f}" for s in args.sides)
            print(row + (f"   {r['ours'] / r['mindspore']:.2f}x" if both else ""))


if __name__ == "__main__":
    main()
