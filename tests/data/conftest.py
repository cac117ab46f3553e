"""Fixtures for tests/data: the real Qwen2.5 tokenizer and GSM8K from <repo>/../shared (skipped when absent),
transformers' tokenizer as the reference, and the tiny synthetic tokenizer."""

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
QWEN_DIR = SHARED / "tokenizers" / "qwen2_5"
GSM8K_DIR = SHARED / "data" / "gsm8k"


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    if not (QWEN_DIR / "vocab.json").is_file():
        pytest.skip(f"real Qwen2.5 tokenizer files not found at {QWEN_DIR} (read-only ../shared is absent)")
    return QWEN_DIR


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"GSM8K not found at {GSM8K_DIR} (read-only ../shared is absent)")
    return GSM8K_DIR


@pytest.fixture(scope="session")
def qwen(qwen_dir):
    from mindgrpo.data.tokenizer import QwenTokenizer

    return QwenTokenizer.from_dir(str(qwen_dir))


@pytest.fixture(scope="session")
def hf_qwen(qwen_dir):
    transformers = pytest.importorskip("transformers", reason="transformers (dev dependency) is the reference")
    return transformers.AutoTokenizer.from_pretrained(str(qwen_dir))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    from mindgrpo.data.synthetic import ensure_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny") / "tokenizer"
    ensure_tiny_tokenizer(str(path))
    return path


@pytest.fixture(scope="session")
def tiny(tiny_tokenizer_dir):
    from mindgrpo.data.tokenizer import QwenTokenizer

    return QwenTokenizer.from_dir(str(tiny_tokenizer_dir))
