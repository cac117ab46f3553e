"""The inference path's RoPE pieces against the training graph's."""

import numpy as np

from mindgrpo.inference.layers import rotate_half_matrix


def test_rotate_half_matrix_is_exactly_the_concat():
    x = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)
    assert np.array_equal(x @ rotate_half_matrix(16), np.concatenate([-x[:, 8:], x[:, :8]], -1))
