"""One compiled decoder-layer graph for every layer: does the CPU runtime then hold one layer's
buffers instead of N? The decoder stack's forward and backward at the Qwen2.5-0.5B shape, as one
graph (`whole`) and as a host loop over one compiled layer graph (`layerwise`).

    python -m benchmarks.layer_graph [--layers 2 4] [--calls 2]

MindSpore 2.10's CPU runtime keeps a compiled graph's buffers after it ran (`benchmarks/graph_release.py`),
and the update graph holds about 0.7 GB per decoder layer at this shape (`benchmarks/results/memory.md`).
Each side runs in its own process, one after the other:

    whole      the N layers' forward, a loss sum(h_N * r) (r fixed, random) and its gradient with
               respect to every layer weight, in one graph (`ms.value_and_grad`), as the update graph
               differentiates the decoder layers
    layerwise  the same as a host loop: one compiled layer graph, forward, called for each layer with
               that layer's weights as inputs, keeping each layer's input (B, S, H); then one compiled
               backward graph (the layer recomputed from its input, its vjp against the incoming
               gradient: `ops.GradOperation(get_all=True, sens_param=True)`) called from the last
               layer to the first

The layer here is written with the weights as graph inputs (Qwen2's: RMSNorm, q/k/v with bias, RoPE,
grouped-query attention with the causal bias, o, RMSNorm, SwiGLU), random weights; the vocabulary head
is left out (the same on both sides). Per side and call: seconds, resident memory after the call and
the call's peak (GB = 10^9 bytes); the process's peak; the gradients' squared norms (both sides must
agree: the same math). Two layer counts give each figure as fixed + per layer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.harness import (RESULTS, code_version, peak_since_reset_gb, reset_peak_rss, rss_gb, run_stamp,
                                write_results)
from benchmarks.workers import Workers

B, S = 4, 288  # the update's micro-batch at the issue-20 workload: 4 rows of up to 285 tokens
HIDDEN, INTER, HEADS, KV_HEADS, EPS, THETA = 896, 4864, 14, 2, 1e-6, 1000000.0
SIDES = ("whole", "layerwise")


def layer_weights(rng, n: int) -> list:
    """n layers' weights, each a tuple in `layer_forward`'s order (numpy fp32)."""
    d = HIDDEN // HEADS
    out = []
    for _ in range(n):
        def w(*shape):
            return (0.02 * rng.standard_normal(shape)).astype(np.float32)
        out.append((np.ones(HIDDEN, np.float32), w(HEADS * d, HIDDEN), w(HEADS * d), w(KV_HEADS * d, HIDDEN),
                    w(KV_HEADS * d), w(KV_HEADS * d, HIDDEN), w(KV_HEADS * d), w(HIDDEN, HEADS * d),
                    np.ones(HIDDEN, np.float32), w(INTER, HIDDEN), w(INTER, HIDDEN), w(HIDDEN, INTER)))
    return out


def side(conn, layers: int, calls: int, layerwise: bool) -> None:
    """A `benchmarks.workers` side: builds, then runs `calls` forward + backward passes."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)
    d, g = HIDDEN // HEADS, HEADS // KV_HEADS
    matmul_t = ops.MatMul(transpose_b=True)
    qk, pv = ops.BatchMatMul(transpose_b=True), ops.BatchMatMul()

    def norm(x, w):
        return w * (x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + EPS))

    def linear(x, w, b=None):  # x (N, in), w (out, in)
        y = matmul_t(x, w)
        return y if b is None else y + b

    def rope(x, cos, sin):
        half = d // 2
        return x * cos + ops.concat((-x[..., half:], x[..., :half]), axis=-1) * sin

    def layer_forward(x, cos, sin, bias, w):
        """x (B, S, H), w: the layer's weights in `layer_weights`' order -> (B, S, H): one Qwen2 decoder layer."""
        n1, wq, bq, wk, bk, wv, bv, wo, n2, w1, w3, w2 = w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], \
            w[9], w[10], w[11]
        h = norm(x, n1).reshape(B * S, HIDDEN)
        q = linear(h, wq, bq).reshape(B, S, HEADS, d).transpose(0, 2, 1, 3)
        k = linear(h, wk, bk).reshape(B, S, KV_HEADS, d).transpose(0, 2, 1, 3)
        v = linear(h, wv, bv).reshape(B, S, KV_HEADS, d).transpose(0, 2, 1, 3)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        scores = qk(q.reshape(B, KV_HEADS, g * S, d), k).reshape(B, KV_HEADS, g, S, S) * (1.0 / d ** 0.5)
        probs = ops.softmax(scores + bias, -1).reshape(B, KV_HEADS, g * S, S)
        att = pv(probs, v).reshape(B, HEADS, S, d).transpose(0, 2, 1, 3).reshape(B * S, HEADS * d)
        x = x + linear(att, wo).reshape(B, S, HIDDEN)
        h = norm(x, n2).reshape(B * S, HIDDEN)
        return x + linear(ops.silu(linear(h, w1)) * linear(h, w3), w2).reshape(B, S, HIDDEN)

    class Layer(nn.Cell):
        def construct(self, x, cos, sin, bias, weights):
            return layer_forward(x, cos, sin, bias, weights)

    class LayerGrad(nn.Cell):
        """(x, cos, sin, bias, weights, dy) -> dx, the weights' gradients: the layer recomputed from x."""

        def __init__(self):
            super().__init__()
            self.layer = Layer()
            self.grad = ops.GradOperation(get_all=True, sens_param=True)

        def construct(self, x, cos, sin, bias, weights, dy):
            grads = self.grad(self.layer)(x, cos, sin, bias, weights, dy)
            return grads[0], grads[4]

    class Stack(nn.Cell):
        """The whole side: every layer's weights as Parameters, loss sum(h_N * r)."""

        def __init__(self, weights):
            super().__init__()
            self.w = ms.ParameterTuple(Parameter(Tensor(a), name=f"w{i}_{j}") for i, ws in enumerate(weights)
                                       for j, a in enumerate(ws))
            self.n, self.per = len(weights), len(weights[0])

        def construct(self, x, cos, sin, bias, r):
            for i in range(self.n):
                x = layer_forward(x, cos, sin, bias, self.w[i * self.per:(i + 1) * self.per])
            return (x * r).sum()

    class StackGrad(nn.Cell):
        def __init__(self, stack):
            super().__init__()
            self.stack = stack
            self.grad_fn = ms.value_and_grad(stack, None, stack.w)

        def construct(self, x, cos, sin, bias, r):
            return self.grad_fn(x, cos, sin, bias, r)

    rng = np.random.default_rng(0)
    weights = layer_weights(rng, layers)
    x0 = Tensor(rng.standard_normal((B, S, HIDDEN)).astype(np.float32))
    r = Tensor(rng.standard_normal((B, S, HIDDEN)).astype(np.float32))
    inv = 1.0 / THETA ** (np.arange(0, d, 2, dtype=np.float32) / d)
    emb = np.concatenate([np.outer(np.arange(S), inv)] * 2, -1).astype(np.float32)
    cos, sin = Tensor(np.cos(emb).reshape(1, 1, S, d)), Tensor(np.sin(emb).reshape(1, 1, S, d))
    bias = Tensor(np.where(np.tril(np.ones((S, S), bool)), 0.0, -1e9).astype(np.float32).reshape(1, 1, 1, S, S))
    if layerwise:
        held = [ms.mutable(tuple(Tensor(a) for a in ws)) for ws in weights]
        forward, backward = Layer(), LayerGrad()

        def run():
            inputs, x = [], x0
            for ws in held:
                inputs.append(x)
                x = forward(x, cos, sin, bias, ws)
            dy, grads = r, [None] * layers
            for i in reversed(range(layers)):
                dy, grads[i] = backward(inputs[i], cos, sin, bias, held[i], dy)
            return [gi for layer_grads in grads for gi in layer_grads]
    else:
        graph = StackGrad(Stack(weights))

        def run():
            return list(graph(x0, cos, sin, bias, r)[1])

    conn.send({"built_gb": rss_gb()})
    for _ in range(calls):
        before = rss_gb()
        reset_peak_rss()
        t0 = time.perf_counter()
        grads = run()
        sq = [float((gi.asnumpy().astype(np.float64) ** 2).sum()) for gi in grads]
        conn.send({"seconds": time.perf_counter() - t0, "before_gb": before, "peak_gb": peak_since_reset_gb(),
                   "after_gb": rss_gb(), "grad_sq": sq})
    conn.send("done")


def measure(layers: int, calls: int) -> dict:
    out = {}
    for name in SIDES:  # one after the other
        with Workers() as sides:
            worker = sides.start(side, layers, calls, name == "layerwise")
            built, runs = worker.recv(), []
            while True:
                msg = worker.recv()
                if msg == "done":
                    break
                runs.append(msg)
                print(f"  layers {layers} {name:9s}: {msg['seconds']:6.1f} s  held {msg['after_gb']:6.2f} GB  "
                      f"peak {msg['peak_gb']:6.2f} GB", flush=True)
            peak_gib = worker.recv()
        out[name] = {**built, "runs": runs, "process_peak_gb": peak_gib * 2 ** 30 / 1e9}
    return out


def per_layer(res: dict, name: str, value) -> tuple:
    counts = sorted(int(k) for k in res["layers"])
    lo, hi = value(res["layers"][str(counts[0])][name]), value(res["layers"][str(counts[-1])][name])
    slope = (hi - lo) / (counts[-1] - counts[0])
    return lo - slope * counts[0], slope


def agree(res: dict, layers: str) -> float:
    """The largest relative difference of the two sides' gradient squared norms (first call)."""
    a = np.array(res["layers"][layers]["whole"]["runs"][0]["grad_sq"])
    b = np.array(res["layers"][layers]["layerwise"]["runs"][0]["grad_sq"])
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-30)))


def markdown(res: dict) -> str:
    lines = ["# One compiled decoder-layer graph for every layer (forward and backward)", "",
             f"Date {res['date']}; machine: {res['machine']}; load average {res['load_average']} at the start, "
             f"{res['load_average_end']:.1f} at the end (other jobs shared the machine: seconds are rough).", "",
             f"Command (from the repo root): `{res['command']}`; library code: {res['code']}.", "",
             f"Workload: decoder layers of the Qwen2.5-0.5B shape (hidden {HIDDEN}, intermediate {INTER}, "
             f"{HEADS} / {KV_HEADS} heads, q/k/v bias), a micro-batch of ({B}, {S}) tokens, fp32, random weights; "
             "no vocabulary head. Forward, a loss sum(h * r) and the gradient of every layer weight. whole: one "
             "graph; layerwise: one compiled layer graph called per layer (inputs kept), then one compiled "
             "backward graph (the layer recomputed, its vjp) called from the last layer to the first. Resident "
             "memory in GB (10^9 bytes).", "",
             "| layers | side | built | first call s | first call peak | later call s | later call peak | held | "
             "process peak | grads agree (max rel. diff of squared norms) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for layers, sides in res["layers"].items():
        for name, r in sides.items():
            first, later = r["runs"][0], r["runs"][-1]
            lines.append(f"| {layers} | {name} | {r['built_gb']:.2f} | {first['seconds']:.1f} | {first['peak_gb']:.2f} | "
                         f"{later['seconds']:.1f} | {later['peak_gb']:.2f} | {later['after_gb']:.2f} | "
                         f"{r['process_peak_gb']:.2f} | {agree(res, layers):.1e} |")
    if len(res["layers"]) >= 2:
        lines += ["", "Fixed + per layer (from the smallest and largest layer counts), and at 24 layers:", ""]
        for name in SIDES:
            for label, value in (("process peak", lambda r: r["process_peak_gb"]),
                                 ("held after a call", lambda r: r["runs"][-1]["after_gb"]),
                                 ("later call s", lambda r: r["runs"][-1]["seconds"])):
                fixed, slope = per_layer(res, name, value)
                lines.append(f"- {name}, {label}: {fixed:.2f} + {slope:.3f}/layer -> {fixed + 24 * slope:.1f} at 24")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--calls", type=int, default=2, help="forward + backward passes per side (the first compiles)")
    ap.add_argument("--output", default=os.path.join(RESULTS, "layer_graph.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.layer_graph", argv), code=code_version(), layers={})
    for layers in args.layers:
        res["layers"][str(layers)] = measure(layers, args.calls)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
