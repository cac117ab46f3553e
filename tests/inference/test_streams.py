"""Per-sample random streams: a function of (seed, prompt, sample, token) only, uniform, and
uncorrelated between neighbouring counters."""

import numpy as np

from mindgrpo.inference.streams import uniforms


def grid(n_prompts=64, n_samples=8, n_tokens=256):
    p, s, t = np.meshgrid(np.arange(n_prompts), np.arange(n_samples), np.arange(n_tokens), indexing="ij")
    return p, s, t


def test_values_depend_on_the_four_keys_only():
    p, s, t = grid(8, 4, 16)
    u = uniforms(3, p, s, t)
    assert u.dtype == np.float32 and u.shape == p.shape
    # the same keys in any order and any batch give the same numbers
    order = np.random.default_rng(0).permutation(p.size)
    np.testing.assert_array_equal(uniforms(3, p.ravel()[order], s.ravel()[order], t.ravel()[order]), u.ravel()[order])
    assert uniforms(3, 5, 2, 7) == u[5, 2, 7]
    # every key matters
    for other in (uniforms(4, p, s, t), uniforms(3, p + 1, s, t), uniforms(3, p, s + 1, t), uniforms(3, p, s, t + 1)):
        assert (other != u).mean() > 0.99


def test_values_are_24_bit_floats_in_the_unit_interval():
    u = uniforms(0, *grid(16, 8, 64))
    assert u.min() >= 0.0 and u.max() < 1.0
    k = u.astype(np.float64) * 2 ** 24
    np.testing.assert_array_equal(k, np.round(k))  # k / 2**24 exactly


def test_uniform_by_chi_square():
    u = uniforms(11, *grid()).ravel()  # 131072 values
    bins = 256
    counts = np.bincount((u * bins).astype(np.int64), minlength=bins)
    expected = u.size / bins
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 255 degrees of freedom: mean 255, sd 22.6; 5 sd either side
    assert 255 - 5 * 22.6 < chi2 < 255 + 5 * 22.6, chi2
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / u.size)


def test_neighbouring_counters_are_uncorrelated():
    u = uniforms(7, *grid()).astype(np.float64) - 0.5
    n = u.size
    for axis in range(3):  # the next prompt, sample, token
        a = np.moveaxis(u, axis, 0)
        r = (a[1:] * a[:-1]).mean() / u.var()
        assert abs(r) < 5 / np.sqrt(n), (axis, r)
    # pairs: the joint histogram of (u[t], u[t+1]) on a 16 x 16 grid is flat
    x, y = (u[..., :-1].ravel() + 0.5), (u[..., 1:].ravel() + 0.5)
    counts = np.bincount((x * 16).astype(int) * 16 + (y * 16).astype(int), minlength=256)
    expected = x.size / 256
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 255 + 5 * 22.6, chi2
