"""Per-token log-probs from (N, V) logits, forward + backward, three ways in one run:

    chain        max, shift, exp, sum, log, shift again (with explicit broadcasts), gather:
                 the dense LogProbs of mindgrpo up to commit 939fc5e
    log_softmax  one fused ops.log_softmax, gather: LogProbs up to commit fc2e531 (MindSpore 2.10's
                 CPU LogSoftmax kernel can stop computing: DEVELOPERS.md)
    softmax      one fused ops.softmax, lse = max - log(max p) + log(sum p), a hand-written
                 backward onehot - p / sum p: LogProbs now (`mindgrpo/models/qwen2.py`)

    python -m benchmarks.logprobs [--rows 256] [--vocab 151936] [--repeats 5]

The loss is sum(w * log p(label)) + 0.01 * sum(entropy) or without the entropy term, the entropy under
stop_gradient as in the training graph, differentiated with value_and_grad in graph mode; each is
checked against float64 numpy (loss and d loss / d logits). They alternate run by run; medians. Then the other ops of one micro-batch's vocabulary head, each
alone at the same shape (hidden 256): the projection, its two gradients, the log-softmax forward and
the entropy metric's forward. 256 rows is one update micro-batch of the grpo_step benchmark
(4 rows x 64 scored tokens) on the Qwen2.5 vocabulary.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys

import numpy as np

from benchmarks.harness import RESULTS, alternate, run_stamp, timed, write_results


def numpy_reference(x: np.ndarray, labels: np.ndarray, w: np.ndarray, ent_coef: float):
    """float64 loss sum(w * logp[label]) + ent_coef * sum(entropy), and its gradient with the
    entropy held constant."""
    x = x.astype(np.float64)
    z = x - x.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    p = np.exp(logp)
    rows = np.arange(len(labels))
    ent = -(p * logp).sum(1)
    loss = (w * logp[rows, labels]).sum() + ent_coef * ent.sum()
    grad = -p * w[:, None]
    grad[rows, labels] += w
    return loss, grad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=256, help="hidden size for the single-op matmul timings")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--output", default=os.path.join(RESULTS, "logprobs.json"))
    args = ap.parse_args(argv)

    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from mindgrpo.models.qwen2 import LogProbs

    ms.set_context(mode=ms.GRAPH_MODE)

    class Chain(nn.Cell):
        def construct(self, logits, labels, with_entropy: bool):
            m = logits.max(axis=-1, keepdims=True)
            shifted = logits - ops.broadcast_to(m, logits.shape)
            lse = ops.log(ops.exp(shifted).sum(-1, keepdims=True))
            logp_all = shifted - ops.broadcast_to(lse, shifted.shape)
            logp = ops.gather_elements(logp_all, 1, labels.reshape(-1, 1)).reshape(-1)
            ent = -(ops.exp(logp_all) * logp_all).sum(-1) if with_entropy else ops.zeros_like(logp)
            return logp, ent

    class LogSoftmaxKernel(nn.Cell):
        def construct(self, logits, labels, with_entropy: bool):
            logp_all = ops.log_softmax(logits, -1)
            logp = ops.gather_elements(logp_all, 1, labels.reshape(-1, 1)).reshape(-1)
            ent = -(ops.softmax(logits, -1) * logp_all).sum(-1) if with_entropy else ops.zeros_like(logp)
            return logp, ent

    class Loss(nn.Cell):
        def __init__(self, head, with_entropy):
            super().__init__()
            self.head, self.with_entropy = head, with_entropy

        def construct(self, x, labels, w):
            logp, ent = self.head(x, labels, self.with_entropy)
            return (logp * w).sum() + 0.01 * ops.stop_gradient(ent).sum()

    class Grad(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def construct(self, x, labels, w):
            return ms.value_and_grad(self.net, 0)(x, labels, w)

    rng = np.random.default_rng(0)
    x = (3 * rng.standard_normal((args.rows, args.vocab))).astype(np.float32)
    labels = rng.integers(0, args.vocab, args.rows).astype(np.int32)
    w = rng.standard_normal(args.rows).astype(np.float32)
    inputs = (Tensor(x), Tensor(labels), Tensor(w))
    results = dict(run_stamp("benchmarks.logprobs", argv), rows=args.rows, vocab=args.vocab, repeats=args.repeats,
                   load_average_start=os.getloadavg()[0], cases={})
    print(f"(N, V) = ({args.rows}, {args.vocab}); forward + backward, median of {args.repeats}")
    for with_entropy in (False, True):
        want_loss, want_grad = numpy_reference(x, labels, w, 0.01 if with_entropy else 0.0)
        nets = {"chain": Grad(Loss(Chain(), with_entropy)), "log_softmax": Grad(Loss(LogSoftmaxKernel(), with_entropy)),
                "softmax": Grad(Loss(LogProbs(), with_entropy))}
        errors = {}
        for name, net in nets.items():
            loss, grad = net(*inputs)  # compiles
            errors[name] = (abs(float(loss.asnumpy()) - want_loss), float(np.abs(grad.asnumpy() - want_grad).max()))
        times = alternate({name: (lambda net=net: net(*inputs)[1].asnumpy()) for name, net in nets.items()},
                          args.repeats)
        for name in nets:
            ms_med = 1000 * float(np.median(times[name]))
            key = f"{name}{' + entropy' if with_entropy else ''}"
            results["cases"][key] = {"ms": ms_med, "loss_abs_error": errors[name][0],
                                     "grad_max_abs_error": errors[name][1]}
            print(f"{key:24s} {ms_med:7.1f} ms   |loss - float64| {errors[name][0]:.2e}   "
                  f"max |grad - float64| {errors[name][1]:.2e}", flush=True)
        for name in ("chain", "log_softmax"):
            print(f"  {name} / softmax = {np.median(times[name]) / np.median(times['softmax']):.2f}x")
    # the rest of a micro-batch's vocabulary head, each op alone at the same shape (hidden --hidden)
    h = Tensor(rng.standard_normal((args.rows, args.hidden)).astype(np.float32))
    weight = Tensor((0.02 * rng.standard_normal((args.vocab, args.hidden))).astype(np.float32))
    dlogits = Tensor(rng.standard_normal((args.rows, args.vocab)).astype(np.float32))

    class Op(nn.Cell):
        def __init__(self, ta, tb):
            super().__init__()
            self.mm = ops.MatMul(transpose_a=ta, transpose_b=tb)

        def construct(self, a, b):
            return self.mm(a, b)

    class Entropy(nn.Cell):  # what the training graph computes: LogProbs with the entropy (forward only)
        def __init__(self):
            super().__init__()
            self.head = LogProbs()

        def construct(self, logits, labels):
            return self.head(logits, labels, True)[1]

    class LogSoftmaxOnly(nn.Cell):
        def construct(self, logits):
            return ops.log_softmax(logits, -1)

    flops = 2 * args.rows * args.hidden * args.vocab
    single = {"logits = h W^T": (Op(False, True), (h, weight), flops),
              "d h = dlogits W": (Op(False, False), (dlogits, weight), flops),
              "d W = dlogits^T h": (Op(True, False), (dlogits, h), flops),
              "log_softmax forward": (LogSoftmaxOnly(), (inputs[0],), 0),
              "LogProbs with entropy, forward": (Entropy(), inputs[:2], 0)}
    results["single_ops"] = {}
    for name, (net, net_inputs, fl) in single.items():
        net(*net_inputs).asnumpy()
        sec = timed(lambda: net(*net_inputs).asnumpy(), args.repeats)[0]
        results["single_ops"][name] = {"ms": 1000 * sec, "gflops": fl / sec / 1e9 if fl else None}
        rate = f"  {fl / sec / 1e9:6.1f} GFLOP/s" if fl else ""
        print(f"{name:30s} {1000 * sec:7.1f} ms{rate}", flush=True)

    results["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    results["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, results)
    print(f"load average {results['load_average_start']:.1f} -> {results['load_average_end']:.1f}; "
          f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
