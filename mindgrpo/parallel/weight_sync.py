"""Moving policy weights into the inference (or reference) model of the same layout (one process):
a copy per bucket (a decoder layer, or the embedding, the final norm, the head; consecutive ones
joined up to a byte budget, rl_config.weight_sync_bucket_mb), inside compiled graphs, never through
the host or the disk; the extra device memory at any moment is one bucket. Across layouts:
`mindgrpo.parallel.reshard`."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Dict, Optional, Sequence

import mindspore as ms
from mindspore import Parameter, nn, ops

from mindgrpo.memory.swap import nbytes
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.reshard_plan import sync_buckets


def named_parameters(model: nn.Cell) -> Dict[str, Parameter]:
    """The model's parameters by their path in the model (`model.layers.0...`), whatever a
    wrapping cell may have renamed them to."""
    return dict(model.parameters_and_names())


def _check_same_names(src: Dict[str, Parameter], dst: Dict[str, Parameter]) -> None:
    if sorted(src) != sorted(dst):
        diff = sorted(set(src) ^ set(dst))
        raise ValueError(f"weight sync: the two models' parameters differ: {diff[:5]}")


class _CopyBucket(nn.Cell):
    """dst parameters <- src parameters, both the graph's own (`WeightSync` names the copy's apart): a
    Parameter given as a graph input costs ~0.1 ms a call on the CPU, as much as its copy (an adapter), so a
    bucket takes no inputs. Returns a (1,) zero that depends on every assignment: returning the assignments'
    outputs made the runtime keep a copy of a one-parameter bucket, and `Parameter.value()` inputs a copy of
    every bucket (0.54 and 1.31 GB at the Qwen2.5-0.5B shape cut to 2 layers, `git show
    997488e:benchmarks/results/build_memory.md`); now the sync holds no memory of its own."""

    def __init__(self, dst: Sequence[Parameter], src: Sequence[Parameter]):
        super().__init__(auto_prefix=False)
        self.dst, self.src = ms.ParameterTuple(dst), ms.ParameterTuple(src)
        self.n = len(dst)
        self.cast = tuple(s.dtype != d.dtype for s, d in zip(src, dst))  # bf16 compute copies on Ascend

    def construct(self):
        out = ()
        for i in range(self.n):
            value = self.src[i].astype(self.dst[i].dtype) if self.cast[i] else self.src[i]
            out = out + (ops.assign(self.dst[i], value),)
        return ops.depend(ops.zeros((1,), ms.float32), out)


def name_apart(dst: Sequence[Parameter], src: Sequence[Parameter], role: str) -> None:
    """One graph cannot own two parameters of one name, and a copy's parameters carry its model's names: a
    dst parameter named as its source is renamed `role.NAME` (the models match parameters by their path in
    the model, `named_parameters`, never by this name)."""
    for d, s in zip(dst, src):
        if d.name == s.name:
            d.name = f"{role}.{d.name}"


class WeightSync:
    """Same-layout sync: dst parameters take the values of the src parameters of the same name,
    one bucket at a time; bucket_bytes: consecutive layer buckets joined up to this many bytes of
    fp32 parameters (0: one per decoder layer), as `reshard_plan.sync_buckets` and the memory plan.
    names: only these parameters move (LoRA: the adapters; the base weights were loaded on both sides);
    role: what the copy is ("inference", "reference"), the prefix of its parameters' names (`name_apart`)."""

    METRICS = ("sync/seconds", "sync/bytes", "sync/max_bucket_bytes")  # the keys of each call's metrics

    def __init__(self, src: nn.Cell, dst: nn.Cell, memory=None, bucket_bytes: int = 0,
                 names: Optional[Sequence[str]] = None, role: str = "copy"):
        src_p, dst_p = named_parameters(src), named_parameters(dst)
        _check_same_names(src_p, dst_p)
        if names is not None:
            src_p = {n: src_p[n] for n in names}
        self.buckets = []
        for names in sync_buckets({n: p.shape for n, p in src_p.items()}, ParallelLayout(), bucket_bytes):
            src_b, dst_b = [src_p[n] for n in names], [dst_p[n] for n in names]
            name_apart(dst_b, src_b, role)
            self.buckets.append((_CopyBucket(dst_b, src_b), nbytes(dst_b)))
        self.memory = memory
        self.total_bytes = sum(b for _, b in self.buckets)
        self.max_bucket_bytes = max(b for _, b in self.buckets)

    def release(self) -> None:
        """Drop the compiled bucket graphs and the buffers the runtime keeps for them (freed only with
        the cells that compiled them: `tests/test_environment.py`); the next call compiles them again."""
        self.buckets = [(_CopyBucket(list(graph.dst), list(graph.src)), size) for graph, size in self.buckets]

    def __call__(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        for graph, size in self.buckets:
            with self.memory.transient(size) if self.memory is not None else nullcontext():
                graph()
        return dict(zip(self.METRICS, (time.perf_counter() - t0, float(self.total_bytes),
                                       float(self.max_bucket_bytes))))


class SharedWeights:
    """The weight sync of an inference model that is the policy model itself (`mindgrpo.grpo.builder`: one
    copy where the layouts match): there is nothing to move; each call reports the metrics of the sync it
    stands in for, all 0 (its keys: WeightSync.METRICS or Reshard.metric_names(), so that a run whose
    inference model is the policy keeps the columns of metrics.jsonl)."""

    def __init__(self, keys):
        self.keys = tuple(keys)

    def release(self) -> None:
        """No graphs to drop."""

    def __call__(self) -> Dict[str, float]:
        return {k: 0.0 for k in self.keys}
