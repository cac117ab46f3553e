"""benchmarks/suite_files.py on one quick test file, the same commit on both sides: both pass, and the
results hold each side's wall and CPU seconds (CPU of the pytest process and its children, so above 0)."""

import json

from benchmarks import suite_files


def test_suite_files_times_both_sides(tmp_path):
    out = tmp_path / "suite_files.json"
    assert suite_files.main(["--commits", "HEAD", "HEAD", "--files", "tests/utils/test_progress.py", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["sides"]) == 2 and not res["failed"]
    for side in res["sides"].values():
        assert side["cpu_s"] > 0.5 and side["wall_s"] > 0 and "passed" in side["outcome"]
    assert "| vs first |" in (tmp_path / "suite_files.md").read_text().splitlines()[6]
