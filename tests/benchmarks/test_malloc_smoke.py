"""benchmarks/malloc.py on one quick test file: both sides pass, each with its CPU seconds, and the allocator
side ran with the library preloaded (the glibc side without)."""

import json

import pytest

from benchmarks import malloc
from mindgrpo.utils.malloc import allocator


def test_malloc_times_both_sides(tmp_path):
    lib = allocator()
    if lib is None:
        pytest.skip("no jemalloc here (scripts/setup_env.sh unpacks one into the venv where apt-get can fetch it)")
    envs = malloc.environments()
    assert "MINDGRPO_MALLOC" in envs["glibc"] and lib not in envs["glibc"].get("LD_PRELOAD", "")
    assert lib in envs["libjemalloc.so.2"]["LD_PRELOAD"].split()
    out = tmp_path / "malloc.json"
    assert malloc.main(["--files", "tests/utils/test_malloc.py", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert list(res["sides"]) == ["glibc", "libjemalloc.so.2"] and not res["failed"]
    for side in res["sides"].values():
        assert side["cpu_s"] > 0.1 and "passed" in side["outcome"]
    # tests/utils/test_malloc.py's last test skips where the allocator is not preloaded (the glibc side)
    glibc, jemalloc = (res["runs"][n][0]["outcome"] for n in res["sides"])
    assert "skipped" in glibc and "skipped" not in jemalloc, (glibc, jemalloc)
