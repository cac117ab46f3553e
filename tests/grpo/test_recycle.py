"""mindgrpo/grpo/recycle.py: when the trainer asks for a fresh process, and the command line it continues with."""

import json
import os
import subprocess
import sys

import pytest

from mindgrpo.grpo.recycle import BASELINE_STEP, MemoryWatch, restart_argv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_watch_holds_each_process_to_its_own_second_step():
    readings = iter([900, 1000, 1020, 1029, 1031, 5000])  # bytes at the end of each step
    watch = MemoryWatch(0.03, read=lambda: next(readings))
    due = [watch.due() for _ in range(5)]
    assert BASELINE_STEP == 2 and watch.baseline == 1000
    assert due == [False, False, False, False, True]  # 1031 > 1.03 x 1000; 1029 not
    assert "3.1% above this process's" in watch.reason
    assert watch.due() and "400.0% above" in watch.reason


def test_a_process_that_starts_high_still_runs_past_its_baseline():
    """A fresh process above the last one's level takes its own second step as the level: no restart loop."""
    watch = MemoryWatch(0.03, read=lambda: 10 ** 9)
    assert not any(watch.due() for _ in range(10))


def test_the_fresh_process_resumes_from_the_newest_checkpoint():
    assert restart_argv("/py", ["scripts/grpo_one_stage.py", "--config", "c.yaml", "rl_config.max_steps=9"]) == \
        ["/py", "scripts/grpo_one_stage.py", "--config", "c.yaml", "rl_config.max_steps=9", "--resume"]
    # an explicit checkpoint was the first process's start, not the fresh one's: the newest is the one just saved
    assert restart_argv("/py", ["s.py", "--resume_from", "out/checkpoints/step_4", "--resume", "x=1"]) == \
        ["/py", "s.py", "x=1", "--resume"]
    assert restart_argv("/py", ["s.py", "--resume_from=out/step_4"]) == ["/py", "s.py", "--resume"]


@pytest.mark.slow
def test_a_run_that_outgrows_its_memory_continues_in_a_fresh_process(tmp_path):
    """The micro model under release_graphs, a growth bound the first recompiles pass: the script restarts itself
    (the same pid), and the run's metrics.jsonl holds every step once, its last checkpoint the last step."""
    micro = os.path.join(REPO, "tests", "grpo", "micro_qwen2.yaml")
    steps = 5
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir", str(tmp_path),
         f"actor_config.model={micro}", "rl_config.batch_size=2", "rl_config.num_generations=4",
         "actor_config.micro_batch_size=4", "generate_config.max_tokens=8", "synthetic_config.template=raw",
         "sft_config={steps: 0}", "rl_config.val_interval=0", "rl_config.completions_interval=0",
         f"rl_config.max_steps={steps}", "rl_config.release_graphs=true", "rl_config.restart_on_memory_growth=1e-9"],
        cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "continuing in a fresh process" in proc.stderr
    # the fresh process appends to the run's log file: the first process's lines are still there
    log = open(tmp_path / "logs" / "rank_0.log").read()
    assert "step 1/5" in log and "continuing in a fresh process" in log and "--resume: the newest" in log
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert sorted(r["step"] for r in rows if "loss" in r) == list(range(1, steps + 1))
    saved = sorted(int(d[5:]) for d in os.listdir(tmp_path / "checkpoints") if d.startswith("step_"))
    assert saved[-1] == steps
