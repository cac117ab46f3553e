import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")


def pytest_configure(config):
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")


@pytest.fixture(scope="session")
def shared_dir():
    if not os.path.isdir(SHARED):
        pytest.skip(f"{SHARED} is absent (the real GSM8K and Qwen2.5 tokenizer live there)")
    return SHARED
