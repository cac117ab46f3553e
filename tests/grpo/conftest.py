"""Fixtures shared by the tests of the GRPO math in MindSpore graphs."""

import mindspore as ms
import pytest


@pytest.fixture(scope="module")
def graph_mode():
    """GRAPH_MODE for a module's graph tests, the previous mode restored after them."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=previous)
