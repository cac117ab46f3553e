"""One AdamW step on a (151936, 256) fp32 parameter (the tiny-qwen-vocab embedding, 155 MB), two ways:

    arithmetic   the update written as tensor arithmetic in one graph (mindgrpo's AdamW up to
                 commit 939fc5e): moments, bias corrections, decoupled decay, step
    fused        `mindgrpo.grpo.optim.AdamW`: MindSpore's AdamWeightDecay kernel with the bias
                 corrections folded into its step size and epsilon

    python -m benchmarks.adamw [--steps 5] [--rows 151936] [--cols 256]

Also times the clipping norm's squared sum of the gradient, over all elements at once and rows first
(`mindgrpo.models.reductions.squared_sum`). Each way runs in its own process (peak RSS is per process): the RSS growth of the first step (the
transient buffers the runtime keeps), the median time of the following steps, and the largest
difference from the same steps in float64 numpy (torch's AdamW formula: decay, then the step).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from benchmarks.harness import RESULTS, run_stamp, rss_gb, time_calls, timed, write_results
from benchmarks.workers import Workers

LR, BETA1, BETA2, EPS, WD = 1e-4, 0.9, 0.999, 1e-8, 0.01


def problem(rows: int, cols: int, steps: int):
    rng = np.random.default_rng(0)
    p = (0.02 * rng.standard_normal((rows, cols))).astype(np.float32)
    grads = [(1e-3 * rng.standard_normal((rows, cols))).astype(np.float32) for _ in range(steps)]
    return p, grads


def float64_steps(p: np.ndarray, grads) -> np.ndarray:
    p, m, v = p.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        p = p * (1 - LR * WD)
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * g * g
        p = p - LR * (m / (1 - BETA1 ** t)) / (np.sqrt(v / (1 - BETA2 ** t)) + EPS)
    return p


def side(conn, way: str, rows: int, cols: int, steps: int) -> None:
    """A `benchmarks.workers` side: one way's steps; sends its figures."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops

    from mindgrpo.grpo.optim import AdamW, GradBuffer, adam_scalars

    ms.set_context(mode=ms.GRAPH_MODE)
    p0, grads = problem(rows, cols, steps)
    param = Parameter(Tensor(p0), name="model.tok_embeddings.embedding_weight")
    buffer = GradBuffer([param])

    class Arithmetic(nn.Cell):
        def __init__(self):
            super().__init__()
            self.p, self.g = param, buffer.bufs[0]
            self.m = Parameter(Tensor(np.zeros_like(p0)), name="m", requires_grad=False)
            self.v = Parameter(Tensor(np.zeros_like(p0)), name="v", requires_grad=False)

        def construct(self, lr, bc1, bc2):
            m = ops.assign(self.m, BETA1 * self.m + (1 - BETA1) * self.g)
            v = ops.assign(self.v, BETA2 * self.v + (1 - BETA2) * self.g * self.g)
            q = self.p * (1 - lr * WD)
            q = q - lr * (m / bc1) / (ops.sqrt(v / bc2) + EPS)
            done = ops.assign(self.p, q)
            return ops.depend(ops.assign(self.g, ops.zeros_like(self.g)), done)

    if way == "fused":
        opt = AdamW([param], buffer, BETA1, BETA2, EPS, WD)
        run = lambda t: opt(Tensor(np.float32(LR)), *adam_scalars(t, BETA1, BETA2), Tensor(np.float32(0.0)), None)  # noqa: E731
    else:
        net = Arithmetic()
        run = lambda t: net(Tensor(np.float32(LR)), *adam_scalars(t, BETA1, BETA2))  # noqa: E731
    start, first, times = rss_gb(), None, []
    for t, g in enumerate(grads, 1):
        buffer.bufs[0].set_data(Tensor(g))
        times += time_calls(lambda: (run(t), param.asnumpy()), 1)
        if t == 1:
            first = rss_gb()
    err = float(np.abs(param.asnumpy().astype(np.float64) - float64_steps(p0, grads)).max())
    extra = {}
    if way == "fused":  # the clipping norm's reduction, over every element at once or rows first
        from mindgrpo.models.reductions import squared_sum

        class Flat(nn.Cell):
            def construct(self, x):
                return (x * x).sum()

        class Rows(nn.Cell):
            def construct(self, x):
                return squared_sum(x)

        g = Tensor(grads[0])
        for label, net in (("squared_sum_all_elements_ms", Flat()), ("squared_sum_rows_first_ms", Rows())):
            net(g).asnumpy()
            extra[label] = 1000 * timed(lambda: net(g).asnumpy(), steps)[0]
    conn.send({**extra, "rss_growth_first_step_gb": first - start, "step_ms": 1000 * float(np.median(times[1:])),
               "first_step_s": times[0], "max_abs_error_vs_float64": err})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=151936)
    ap.add_argument("--cols", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--output", default=os.path.join(RESULTS, "adamw.json"))
    args = ap.parse_args(argv)
    results = dict(run_stamp("benchmarks.adamw", argv), rows=args.rows, cols=args.cols, steps=args.steps,
                   load_average_start=os.getloadavg()[0], ways={})
    for way in ("arithmetic", "fused"):
        with Workers() as sides:
            results["ways"][way] = r = sides.start(side, way, args.rows, args.cols, args.steps).recv()
        print(f"{way:10s} step {r['step_ms']:7.1f} ms   RSS growth on the first step {r['rss_growth_first_step_gb']:.2f} GB"
              f"   max |p - float64| after {args.steps} steps {r['max_abs_error_vs_float64']:.1e}", flush=True)
    a, f = results["ways"]["arithmetic"], results["ways"]["fused"]
    print(f"gradient squared sum for clipping: all elements at once {f['squared_sum_all_elements_ms']:.1f} ms, "
          f"rows first (squared_sum) {f['squared_sum_rows_first_ms']:.1f} ms")
    print(f"fused / arithmetic: time {f['step_ms'] / a['step_ms']:.2f}x, transient memory "
          f"{f['rss_growth_first_step_gb'] / max(a['rss_growth_first_step_gb'], 1e-9):.2f}x")
    results["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, results)
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
