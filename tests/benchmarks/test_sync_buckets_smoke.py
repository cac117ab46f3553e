"""benchmarks/sync_buckets.py on the tiny default, one round: both sides copy the policy bit for bit, and
the results name the buckets each side compiled (the tiny model: 6 per layer, 1 under 512 MiB)."""

import json

from benchmarks import sync_buckets


def test_sync_buckets_writes_both_sides(tmp_path):
    out = tmp_path / "sync_buckets.json"
    assert sync_buckets.main(["--rounds", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert {k: (v["buckets"], v["exact"]) for k, v in res["sides"].items()} == {"0": (6, True), "512": (1, True)}
    assert res["sides"]["512"]["max_bucket_mib"] == res["sides"]["0"]["total_mib"]
    assert "| 512 | 1 |" in (tmp_path / "sync_buckets.md").read_text()
