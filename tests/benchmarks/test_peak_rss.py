"""benchmarks.harness: a phase's own peak resident memory (the peak started again before it), in GB of 10^9 bytes."""

import os

import numpy as np
import pytest

from benchmarks.harness import peak_since_reset_gb, reset_peak_rss, rss_gb


def test_the_peak_starts_again_at_a_reset():
    big = np.ones(400_000_000 // 8)  # 0.4 GB, touched
    with_big = rss_gb()
    del big
    assert peak_since_reset_gb() > rss_gb() + 0.3  # the peak still holds the freed array (read lazily: no ==)
    reset_peak_rss()
    assert peak_since_reset_gb() < with_big - 0.3  # ... until the reset


def test_gb_are_10_to_the_9_bytes():
    # /proc/self/statm counts pages: an independent reading of the same resident set (it moves a little between reads)
    pages = int(open("/proc/self/statm").read().split()[1])
    assert rss_gb() == pytest.approx(pages * os.sysconf("SC_PAGE_SIZE") / 1e9, rel=0.005)
