"""Probe (not a benchmark): a decode step's products at few rows, x (M, K) @ W (K, N) on one core.

    python -m benchmarks.probes.few_rows [--ahead 8]

Compiles `few_rows.cc` with g++ (AVX-512 needed) and runs it: one AVX-512 kernel (8 rows x 48 columns of the
result in registers, no copy of W) on W as the rollout engine keeps it, row-major (in, out), and on W cut into
panels of 48 columns stored one after another. Then MindSpore's MatMul (graph mode) and PyTorch's on the same
shapes with W row-major, each on one thread. GFLOP/s of wall time; W streams from memory in the C++ runs (copies
of ~400 MB in all) and comes from cache in the frameworks' (one W, called again and again), which flatters them.
What it showed is in docs/cpu_kernels.md, "Few rows".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = {"qkv": (16, 896, 1152), "o": (16, 896, 912), "gate_up": (16, 896, 9744), "down": (16, 4864, 912),
          "gate_up 4": (4, 896, 9744), "gate_up 64": (64, 896, 9744)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ahead", type=int, default=8, help="rows of W prefetched ahead (0: none)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        exe = os.path.join(folder, "few_rows")
        subprocess.run(["g++", "-O2", "-std=c++17", os.path.join(HERE, "few_rows.cc"), "-o", exe], check=True)
        subprocess.run([exe, str(args.ahead)], check=True)
    import mindspore as ms
    import torch

    from benchmarks.harness import timed
    from benchmarks.matmul_peak import product

    ms.set_context(mode=ms.GRAPH_MODE, runtime_num_threads=1)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    for name, (m, k, n) in SHAPES.items():
        a, b = rng.random((m, k), np.float32), rng.random((k, n), np.float32)
        rates = []
        for side in ("mindspore", "torch"):
            fn = product(side, a, b, "NN")
            fn()
            rates.append(f"{side} {2 * m * k * n / timed(fn, 7)[0] / 1e9:6.1f}")
        print(f"{name:10s} ({m:2d}, {k:4d}, {n:4d}) one thread, W in cache: " + ", ".join(rates) + " GFLOP/s")


if __name__ == "__main__":
    main()
