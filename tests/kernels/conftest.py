"""Fixtures of the kernel tests: the library built, and the kernels switched on."""

import pytest

from mindgrpo.kernels import build as kbuild
from mindgrpo.kernels import matmul as kmatmul


@pytest.fixture(scope="module")
def built():
    """The library built (a no-op when scripts/setup_env.sh has built it); skips without scipy-openblas32."""
    if kbuild.library_path() is None:
        pytest.skip("scipy-openblas32 is not installed")
    kbuild.build()
    kmatmul.library.cache_clear()
    assert kmatmul.library() is not None


@pytest.fixture
def kernels_on(monkeypatch):
    """Tests of the kernels themselves: switched on whatever MINDGRPO_CPU_KERNELS the suite runs with (the suite
    also runs with 0, which the model's tests take as MindSpore's MatMul)."""
    monkeypatch.setenv(kmatmul.ENV, "1")
