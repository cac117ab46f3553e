from pathlib import Path

import pytest

GSM8K_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session")
def gsm8k_test_answers():
    """(final answer string, full solution) of every GSM8K test row."""
    import json

    path = GSM8K_DIR / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"GSM8K not found at {path} (read-only ../shared is absent)")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [(r["answer"].split("####")[-1].strip(), r["answer"]) for r in rows]
