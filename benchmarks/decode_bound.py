"""What bounds the vocabulary head of a decode step on this machine: reading its weight, or the matmul.

    python -m benchmarks.decode_bound                          # tiny-qwen-vocab's head, batch 16 (results/)
    python -m benchmarks.decode_bound --vocab 4096 --output /tmp/decode_bound.json

A decode step's head reads the (V, H) fp32 weight once and does 2*B*V*H FLOPs. The machine's speed
drifts, so each of --rounds rounds measures these side by side, and the figures are medians:

    read, 1 core      numpy sums the (V, H) weight in one process (GB/s)
    read, 2 cores     two processes each sum half of it at the same time (aggregate GB/s)
    mindspore head    W h^T as the decode graph runs it (MatMul with transpose_b), graph mode
    torch head        F.linear(h, W), 2 threads
    mindspore peak    the best fp32 GFLOP/s of square matmuls (benchmarks.matmul_peak)

From them, two floors for the head: the read floor (bytes over the 2-core rate) and the matmul floor
(FLOPs over MindSpore's peak). A head at the higher floor is bound by it; a head well above both is
bound by its matmul kernel at this shape. Writes benchmarks/results/decode_bound.{json,md}.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys

import numpy as np

from benchmarks.harness import RESULTS, run_stamp, timed, write_results
from benchmarks.matmul_peak import SQUARES, matmul_gflops


def _reader(conn, barrier, rows: int, cols: int, calls: int) -> None:
    """Holds a (rows, cols) fp32 array. For each True it receives, it waits for the other readers
    and then sends the median seconds of `calls` full sums. It stops on False."""
    a = np.ones((rows, cols), np.float32)
    while conn.recv():
        barrier.wait()
        conn.send(timed(a.sum, calls)[0])


class Readers:
    """n processes that each hold rows // n rows of a (rows, cols) fp32 array and sum them at the same time."""

    def __init__(self, n: int, rows: int, cols: int, calls: int):
        ctx = mp.get_context("spawn")  # no fork of a process that runs MindSpore's threads
        self.barrier = ctx.Barrier(n)  # kept: the children unpickle it after this returns
        self.bytes = n * (rows // n) * cols * 4
        self.conns, self.procs = [], []
        for _ in range(n):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_reader, args=(theirs, self.barrier, rows // n, cols, calls), daemon=True)
            p.start()
            self.conns.append(mine)
            self.procs.append(p)

    def gbps(self) -> float:
        for c in self.conns:
            c.send(True)
        return self.bytes / max(c.recv() for c in self.conns) / 1e9

    def close(self) -> None:
        for c in self.conns:
            c.send(False)
        for p in self.procs:
            p.join()


def measure(vocab: int, hidden: int, batch: int, rounds: int, calls: int) -> dict:
    import mindspore as ms
    import torch
    from mindspore import nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((vocab, hidden), dtype=np.float32) * 0.02)
    h = rng.standard_normal((batch, hidden), dtype=np.float32)

    class Head(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(w), name="w")
            self.matmul = ops.MatMul(transpose_b=True)

        def construct(self, x):
            return self.matmul(self.w, x)[:1]  # (V, B) as in decode; only a row leaves the graph

    head, hx = Head(), ms.Tensor(h)
    tw, th = torch.from_numpy(w), torch.from_numpy(h)
    one, two = Readers(1, vocab, hidden, calls), Readers(2, vocab, hidden, calls)
    head(hx).asnumpy()  # compiles
    out = []
    try:
        with torch.no_grad():
            for _ in range(rounds):
                out.append({"read_1_core_gbps": one.gbps(), "read_2_cores_gbps": two.gbps(),
                            "mindspore_head_ms": 1000 * timed(lambda: head(hx).asnumpy(), calls)[0],
                            "torch_head_ms": 1000 * timed(lambda: torch.nn.functional.linear(th, tw), calls)[0],
                            "mindspore_peak_gflops": matmul_gflops("mindspore", SQUARES)["peak"]})
    finally:
        one.close()
        two.close()
    med = {k: float(np.median([r[k] for r in out])) for k in out[0]}
    nbytes, flops = vocab * hidden * 4, 2 * batch * vocab * hidden
    med.update({
        "head_mbytes": nbytes / 1e6, "head_gflop": flops / 1e9,
        "read_floor_ms": nbytes / med["read_2_cores_gbps"] / 1e6,
        "matmul_floor_ms": flops / med["mindspore_peak_gflops"] / 1e6,
        "mindspore_head_gbps": nbytes / med["mindspore_head_ms"] / 1e6,
        "mindspore_head_gflops": flops / med["mindspore_head_ms"] / 1e6,
    })
    med["mindspore_head_pct_of_peak"] = 100 * med["mindspore_head_gflops"] / med["mindspore_peak_gflops"]
    return {"medians": med, "rounds": out}


def markdown(res: dict) -> str:
    m = res["medians"]
    bound = "the matmul" if m["matmul_floor_ms"] > m["read_floor_ms"] else "the read"
    return "\n".join([
        "# What bounds the decode step's vocabulary head", "",
        f"    {res['command']}", "",
        f"Date {res['date']}; {res['machine']}; load average {res['load_average']}. Head (V={res['vocab']}, "
        f"H={res['hidden']}) fp32, batch {res['batch']}: {m['head_mbytes']:.0f} MB read, {m['head_gflop']:.2f} GFLOP "
        f"per step. Medians of {res['n_rounds']} rounds of {res['calls']} calls, each round measuring everything below.",
        "",
        "| measure | value |", "|---|---|",
        f"| read, 1 core (numpy sum) | {m['read_1_core_gbps']:.1f} GB/s |",
        f"| read, 2 cores at once | {m['read_2_cores_gbps']:.1f} GB/s |",
        f"| MindSpore fp32 matmul peak (square 1024/2048) | {m['mindspore_peak_gflops']:.0f} GFLOP/s |",
        f"| read floor (bytes / 2-core rate) | {m['read_floor_ms']:.1f} ms |",
        f"| matmul floor (FLOPs / MindSpore peak) | {m['matmul_floor_ms']:.1f} ms |",
        f"| MindSpore head, W h^T as in decode | {m['mindspore_head_ms']:.1f} ms ({m['mindspore_head_gbps']:.1f} GB/s, "
        f"{m['mindspore_head_gflops']:.0f} GFLOP/s, {m['mindspore_head_pct_of_peak']:.0f}% of the peak) |",
        f"| torch head, F.linear | {m['torch_head_ms']:.1f} ms |", "",
        f"MindSpore's head takes {m['mindspore_head_ms'] / max(m['read_floor_ms'], m['matmul_floor_ms']):.1f}x the "
        f"higher floor ({bound}'s).", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--output", default=os.path.join(RESULTS, "decode_bound.json"))
    args = ap.parse_args(argv)
    res = dict(run_stamp("benchmarks.decode_bound", argv), vocab=args.vocab, hidden=args.hidden, batch=args.batch,
               n_rounds=args.rounds, calls=args.calls)
    res.update(measure(args.vocab, args.hidden, args.batch, args.rounds, args.calls))
    text = markdown(res)
    write_results(args.output, res, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
