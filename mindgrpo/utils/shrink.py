"""Parameters emptied between uses: each shrunk to one element (`Parameter.set_data` frees its tensor), later
made zeros of its full shape again. The same Parameter objects throughout, so the compiled graphs that take
them (as inputs or as their own weights) stay valid once the full shapes are back. Used where a phase's
memory goes when the phase ends (rl_config.release_graphs): the gradient accumulators between updates, the
rollout engine's KV cache and fused layer copies between rollouts."""

from __future__ import annotations

from typing import Iterable, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor


def shrink(params: Iterable[Parameter], dtype=ms.float32) -> None:
    """Each Parameter to one element (of its rank), in `dtype`."""
    for p in params:
        p.set_data(Tensor(np.zeros((1,) * len(p.shape), np.float32), dtype))


def zeros_again(params: Iterable[Parameter], shapes: Sequence[tuple], dtype=ms.float32) -> None:
    """Each Parameter zeros of its shape in `shapes` (the same order), in `dtype`."""
    for p, shape in zip(params, shapes):
        p.set_data(Tensor(np.zeros(shape, np.float32), dtype))
