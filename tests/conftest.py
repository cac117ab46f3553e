import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")
sys.path.insert(0, os.path.join(REPO, "tests"))


# The slowest modules (1.5 to 4.5 minutes each in a serial run on 2 cores), collected first: under the
# README's `-n 2` the workers take whole files in collection order (pyproject.toml), so both start on
# these and the short modules fill in behind.
# Order within a module is kept.
SLOW_FIRST = ("grpo/test_learning.py", "parallel/test_pipeline.py", "parallel/test_msrun.py",
              "grpo/test_trainer_run.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return next((i for i, slow in enumerate(SLOW_FIRST) if path.endswith(slow)), len(SLOW_FIRST))

    items.sort(key=rank)


def pytest_configure(config):
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")


@pytest.fixture(scope="session")
def shared_dir():
    if not os.path.isdir(SHARED):
        pytest.skip(f"{SHARED} is absent (the real GSM8K and Qwen2.5 tokenizer live there)")
    return SHARED
