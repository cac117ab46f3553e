"""Fixtures shared by the engine's conversation tests."""

import pytest

from mindgrpo.data.synthetic import ensure_tiny_tokenizer
from mindgrpo.data.tokenizer import QwenTokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The tiny default's tokenizer (built on the synthetic task's corpus, no download)."""
    path = tmp_path_factory.mktemp("tiny") / "tokenizer"
    ensure_tiny_tokenizer(str(path))
    return QwenTokenizer.from_dir(str(path))
