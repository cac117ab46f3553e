"""benchmarks/suite_cpu.py on one quick file whose tests start scripts: every process accounts for itself, the
scripts under the file that started them, and their sum is within what pytest and its children spent."""

import json

from benchmarks import suite_cpu


def test_suite_cpu_accounts_for_the_scripts_a_test_file_starts(tmp_path):
    out = tmp_path / "suite_cpu.json"
    assert suite_cpu.main(["--tests", "tests/scripts/test_transform_checkpoint.py", "--pytest_args", "-n 0",
                           "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert "passed" in res["run"]["outcome"] and (tmp_path / "suite_cpu.md").exists()
    kinds = {r["name"]: r for r in res["summary"]["by_kind"]}
    assert kinds["pytest"]["processes"] == 1
    scripts = kinds["scripts/transform_checkpoint.py"]
    assert scripts["processes"] >= 2 and scripts["cpu_s"] > 0.5  # each imports MindSpore: about a second of CPU
    files = {r["name"]: r for r in res["summary"]["by_file"]}
    assert files["tests/scripts/test_transform_checkpoint.py"]["processes"] == scripts["processes"]
    # the accounts add up to no more than what pytest and the processes it waited for spent (rusage, from outside)
    assert 0.5 * res["run"]["cpu_s"] < res["summary"]["cpu_s"] <= res["run"]["cpu_s"] + 0.5


def test_kinds_of_process():
    assert suite_cpu.kind(["-c"]) == "pytest"
    assert suite_cpu.kind(["-m", "mindgrpo.rewards.worker", "5"]) == "mindgrpo.rewards.worker"
    assert suite_cpu.kind([suite_cpu.REPO + "/scripts/grpo_one_stage.py", "--output_dir"]) == "scripts/grpo_one_stage.py"
