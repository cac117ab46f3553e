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
    assert suite_cpu.kind(["-c"]) == "pytest"  # an xdist worker: started before any test
    assert suite_cpu.kind(["-c"], "tests/a.py::t (call)") == "python -c"
    assert suite_cpu.kind(["-m", "mindgrpo.rewards.worker", "5"]) == "mindgrpo.rewards.worker"
    assert suite_cpu.kind([suite_cpu.REPO + "/scripts/grpo_one_stage.py", "--output_dir"]) == "scripts/grpo_one_stage.py"


def test_processes_count_for_the_test_that_started_them():
    lines = [{"argv": ["-c"], "cpu_s": 10.0, "test": ""},  # an xdist worker
             {"argv": ["/x/pytest/__main__.py", "-q"], "cpu_s": 2.0, "test": "tests/a.py::t (call)"},  # started by a test
             {"argv": ["-m", "mindgrpo.rewards.worker"], "cpu_s": 1.0, "test": "tests/a.py::u (setup)"},
             {"argv": ["tool.py"], "cpu_s": 0.5, "test": ""}]
    s = suite_cpu.summarise(lines)
    assert s["processes"] == 4 and s["cpu_s"] == 13.5
    assert [(r["name"], r["processes"], r["cpu_s"]) for r in s["by_file"]] == [
        ("(pytest and its workers: the tests that run in them)", 1, 10.0), ("tests/a.py", 2, 3.0), ("(no test)", 1, 0.5)]
    assert [(r["name"], r["processes"]) for r in s["by_kind"]] == [("pytest", 2), ("mindgrpo.rewards.worker", 1),
                                                                   ("tool.py", 1)]
