"""What a decode step's KV-cache write costs in MindSpore's CPU graph mode, by cache size.

    python -m benchmarks.cache_write [--rows 64] [--capacities 128 512 2048] [--rounds 5]

One graph writes `rows` new k rows (2 kv heads x d 64, fp32) into each of 8 caches (4 layers x k
and v), as a decode step does, in two forms:
  ScatterUpdate    caches of (slots * kv heads * C, d) rows, rows named by index (the rollout
                   engine, `mindgrpo/inference/graphs.py`)
  ScatterNdUpdate  caches of (slots, kv heads, C, d), (slot, head, position) triples (the static
                   engine, `benchmarks/static_engine.py`)
and, as the floor, the same graph without the writes. ms per graph call (8 writes), medians of
--rounds rounds of 20 calls, the forms taking turns. Writes benchmarks/results/cache_write.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from benchmarks.harness import RESULTS, run_stamp, timed, write_results

HEADS, D, CACHES = 2, 64, 8


def graphs(rows: int, capacity: int):
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops

    class Writes(nn.Cell):
        def __init__(self, kind):
            super().__init__()
            shape = (rows * HEADS * capacity, D) if kind == "ScatterUpdate" else (rows, HEADS, capacity, D)
            self.caches = ms.ParameterTuple(Parameter(Tensor(np.zeros(shape, np.float32)), name=f"c{i}",
                                                      requires_grad=False) for i in range(CACHES))
            self.kind = kind
            self.flat, self.nd = ops.ScatterUpdate(), ops.ScatterNdUpdate()

        def construct(self, flat_index, nd_index, update):
            done = ()
            for i in range(CACHES):
                if self.kind == "ScatterUpdate":
                    done = done + (self.flat(self.caches[i], flat_index, update),)
                elif self.kind == "ScatterNdUpdate":
                    done = done + (self.nd(self.caches[i], nd_index, update),)
            return ops.depend(update.sum(), done)

    slot, head = np.meshgrid(np.arange(rows), np.arange(HEADS), indexing="ij")
    position = capacity // 2
    flat = ((slot * HEADS + head) * capacity + position).reshape(-1).astype(np.int32)
    nd = np.stack([slot.reshape(-1), head.reshape(-1), np.full(slot.size, position)], 1).astype(np.int32)
    args = (Tensor(flat), Tensor(nd), Tensor(np.ones((rows * HEADS, D), np.float32)))
    return {kind: (Writes(kind), args) for kind in ("no write", "ScatterUpdate", "ScatterNdUpdate")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--capacities", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--output", default=os.path.join(RESULTS, "cache_write.json"))
    args = ap.parse_args(argv)
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    res = {**run_stamp("benchmarks.cache_write", argv), "rows": args.rows, "ms_per_call": {}}
    for capacity in args.capacities:
        cells = graphs(args.rows, capacity)
        for cell, a in cells.values():
            cell(*a).asnumpy()  # compiles
        times = {k: [] for k in cells}
        for _ in range(args.rounds):
            for kind, (cell, a) in cells.items():
                times[kind].append(1000 * timed(lambda: [cell(*a).asnumpy() for _ in range(20)], 1)[0] / 20)
        cache_mb = args.rows * HEADS * capacity * D * 4 / 2 ** 20
        res["ms_per_call"][capacity] = {"cache_mb": cache_mb, **{k: float(np.median(v)) for k, v in times.items()}}
        print(capacity, res["ms_per_call"][capacity], flush=True)
    lines = ["# KV-cache writes of a decode step: ScatterUpdate (rows, in place) against ScatterNdUpdate", "",
             f"    {res['command']}", "",
             f"Date {res['date']}, {res['machine']}, load average {res['load_average']}. {args.rows} rows x "
             f"{HEADS} kv heads x d {D}, fp32, written into each of {CACHES} caches per graph call; ms per call, "
             f"medians of {args.rounds} rounds of 20 calls, the forms taking turns.", "",
             "| positions per slot | MB per cache | no write | ScatterUpdate | ScatterNdUpdate |", "|---|---|---|---|---|"]
    for capacity, r in res["ms_per_call"].items():
        lines.append(f"| {capacity} | {r['cache_mb']:.0f} | {r['no write']:.2f} | {r['ScatterUpdate']:.2f} | "
                     f"{r['ScatterNdUpdate']:.2f} |")
    write_results(args.output, res, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
