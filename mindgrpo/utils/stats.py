"""The one standard deviation of rewards and advantages: the sample std (divide by n - 1).

Every reward std, logged or used to scale advantages, is this one: TRL 1.16 (`nanstd`) and verl
(`torch.std`) divide by n - 1 too, so advantages and logged stds compare with theirs. With fewer
than two values it is 0 (not nan): one sample has no spread.
"""

from __future__ import annotations

import numpy as np


def sample_std(x, axis=None):
    """std of `x` over `axis` (all of it by default) with n - 1 in the denominator; 0 where n < 2."""
    x = np.asarray(x)
    n = x.shape[axis] if axis is not None else x.size
    if n < 2:
        dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
        return np.zeros(np.sum(x, axis=axis).shape, dtype)
    return np.std(x, axis=axis, ddof=1)
