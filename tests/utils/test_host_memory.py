"""mindgrpo.utils.host_memory: the host process's resident memory and its peak, in bytes."""

import os
import sys

import numpy as np
import pytest

from mindgrpo.utils import host_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_resident_bytes_are_the_kernels_resident_pages():
    resident = host_memory.step_metrics()["memory/host_resident_bytes"]
    with open("/proc/self/statm") as f:  # the same count through another interface: pages, not kB
        pages = int(f.read().split()[1])
    assert resident == pytest.approx(pages * os.sysconf("SC_PAGE_SIZE"), rel=0.01)


def test_touching_200_mb_raises_the_resident_bytes_by_that_much():
    before = host_memory.step_metrics()["memory/host_resident_bytes"]
    block = np.ones(200 * 2 ** 20, np.uint8)  # every page written
    after = host_memory.step_metrics()
    assert after["memory/host_resident_bytes"] - before >= 0.95 * block.nbytes
    assert after["memory/host_resident_bytes"] <= after["memory/host_peak_bytes"]


def test_an_unknown_field_is_named():
    with pytest.raises(KeyError, match="VmNothing"):
        host_memory.status_bytes("VmNothing")
