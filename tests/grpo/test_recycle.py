"""mindgrpo/grpo/recycle.py: when the trainer asks for a fresh process, and the command line it continues with."""

from mindgrpo.grpo.recycle import BASELINE_STEP, MemoryWatch, restart_argv


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
