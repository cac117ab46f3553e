"""Moving policy weights into the inference (or reference) model after an update.

`WeightSync` copies parameter by parameter, in buckets of layers, inside compiled graphs: no
host round trip and never through disk. When both sides have the same layout this is a copy
per bucket; across different layouts (`mindgrpo.parallel.layout`) each bucket is first
gathered over the source tensor-parallel group and then sliced for the destination rank.
"""

from __future__ import annotations

import re
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, nn, ops

from mindgrpo.memory.swap import nbytes


class _CopyBucket(nn.Cell):
    """dst parameters <- the given tensors. The sources come in as graph inputs: the two models'
    parameters share names, and one graph cannot hold two parameters of the same name."""

    def __init__(self, dst: Sequence[Parameter]):
        super().__init__()
        self.dst = ms.ParameterTuple(dst)
        self.n = len(dst)

    def construct(self, src):
        out = ()
        for i in range(self.n):
            out = out + (ops.assign(self.dst[i], src[i].astype(self.dst[i].dtype)),)
        return out


def layer_buckets(names: Sequence[str]) -> List[List[str]]:
    """Group parameter names by decoder layer; embeddings, final norm and head form their own."""
    buckets: Dict[str, List[str]] = {}
    for n in names:
        m = re.match(r"model\.layers\.(\d+)\.", n)
        key = f"layer{m.group(1)}" if m else n
        buckets.setdefault(key, []).append(n)
    return list(buckets.values())


class WeightSync:
    """Same-layout sync: dst parameters take the values of the src parameters of the same name."""

    def __init__(self, src: nn.Cell, dst: nn.Cell, memory=None):
        src_p = {p.name: p for p in src.get_parameters()}
        dst_p = {p.name: p for p in dst.get_parameters()}
        if sorted(src_p) != sorted(dst_p):
            missing = sorted(set(src_p) ^ set(dst_p))
            raise ValueError(f"weight sync: the two models' parameters differ: {missing[:5]}")
        self.buckets = []
        for names in layer_buckets(list(src_p)):
            src_b, dst_b = [src_p[n] for n in names], [dst_p[n] for n in names]
            self.buckets.append((_CopyBucket(dst_b), tuple(src_b), nbytes(dst_b)))
        self.memory = memory
        self.total_bytes = sum(b for _, _, b in self.buckets)
        self.max_bucket_bytes = max(b for _, _, b in self.buckets)

    def __call__(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        for graph, src, size in self.buckets:
            if self.memory is not None:
                with self.memory.transient(size):
                    graph(tuple(p.value() for p in src))
            else:
                graph(tuple(p.value() for p in src))
        return {"sync/seconds": time.perf_counter() - t0, "sync/bytes": float(self.total_bytes),
                "sync/max_bucket_bytes": float(self.max_bucket_bytes)}
