"""Per-sample random streams: the uniform that draws token t of sample j of prompt i.

    u = uniform(seed, i, j, t)

is a counter-based hash of the four integers and nothing else, so a sample's tokens do not depend
on which slot it decodes in, on the other rows of its batch, on the order in which requests are
admitted, nor on how the prompts are split over data-parallel replicas (i is the prompt's index
in the whole batch). The mixer is SplitMix64's finaliser (Steele, Lea and Flood 2014), applied
after each key is added with the golden-ratio increment; the top 24 bits of the result become a
float32 in [0, 1) exactly (k / 2**24). Vectorised over rows: a decode step costs a few numpy ops
on (B,) uint64 arrays, whatever B.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def uniforms(seed: int, prompt, sample, token) -> np.ndarray:
    """seed: int; prompt, sample, token: int arrays of one shape (or scalars) -> float32 of that
    shape in [0, 1)."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as the mixer intends
        h = _mix(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) + _GOLDEN)
        for key in (prompt, sample, token):
            h = _mix(h + (np.asarray(key).astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return (h >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
