"""Progress: phase timing, throughput and ETA, on a fake clock."""

import pytest

from mindgrpo.utils.progress import Progress, format_duration


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def _step(progress, clock, step, rollout=3.0, update=2.0, gap=0.5, tokens=None):
    with progress.phase("rollout"):
        clock.advance(rollout)
        if tokens is not None:
            progress.add_tokens("rollout", tokens)
    clock.advance(gap)  # work outside any phase still counts in time/step
    with progress.phase("update"):
        clock.advance(update)
    return progress.step_done(step)


def test_step_metrics():
    clock = FakeClock()
    progress = Progress(total_steps=10, clock=clock)
    clock.advance(60.0)  # setup before the first phase is not part of step 1
    metrics = _step(progress, clock, 1, tokens=2400)
    assert metrics == {"time/rollout": 3.0, "time/update": 2.0, "time/step": 5.5, "throughput/rollout": 800.0}

    clock.advance(1.0)  # e.g. a checkpoint after step 1: part of step 2
    with progress.phase("reward"):
        clock.advance(0.25)
    with progress.phase("reward"):  # the same phase twice adds up
        clock.advance(0.5)
    assert progress.step_done(2) == {"time/reward": 0.75, "time/step": 1.75}
    assert progress.step_times == [5.5, 1.75]


def test_phase_records_time_on_error():
    clock = FakeClock()
    progress = Progress(total_steps=2, clock=clock)
    with pytest.raises(RuntimeError):
        with progress.phase("rollout"):
            clock.advance(2.0)
            raise RuntimeError("generation failed")
    assert progress.step_done(1) == {"time/rollout": 2.0, "time/step": 2.0}


def test_step_without_phases():
    progress = Progress(total_steps=3, clock=FakeClock())
    assert progress.step_done(1) == {"time/step": 0.0}


def test_line_and_eta():
    clock = FakeClock()
    progress = Progress(total_steps=40, clock=clock)
    assert progress.line(1) == "step 1/40"
    assert progress.eta_seconds() is None

    _step(progress, clock, 1, rollout=1.0, update=1.0, gap=0.0, tokens=812)
    _step(progress, clock, 2, rollout=1.0, update=1.2, gap=0.0, tokens=812 * 1.0)
    assert progress.mean_step_seconds == pytest.approx(2.1)
    assert progress.eta_seconds() == pytest.approx(38 * 2.1)

    with progress.phase("rollout"):
        clock.advance(0.6)
    with progress.phase("update"):  # step 3, 0.6 s in: 37 steps after it plus 1.5 s of it left
        assert progress.eta_seconds(3) == pytest.approx(37 * 2.1 + 1.5)
        assert progress.line(3) == "step 3/40 | phase update | rollout 812 tok/s | 2.1 s/step | ETA 1m19s"
        assert progress.line(3, {"reward": 0.53125, "lr": "1e-6"}) == (
            "step 3/40 | phase update | rollout 812 tok/s | reward 0.531 | lr 1e-6 | 2.1 s/step | ETA 1m19s")


def test_nested_phases_show_the_innermost():
    clock = FakeClock()
    progress = Progress(total_steps=4, clock=clock)
    with progress.phase("rollout"):
        with progress.phase("reward"):
            clock.advance(1.0)
            assert progress.line(1) == "step 1/4 | phase reward"
        assert progress.line(1) == "step 1/4 | phase rollout"
        clock.advance(2.0)
    assert progress.step_done(1) == {"time/reward": 1.0, "time/rollout": 3.0, "time/step": 3.0}


def test_resumed_eta_counts_from_start_step():
    clock = FakeClock()
    progress = Progress(total_steps=40, start_step=10, clock=clock)
    assert progress.last_step == 10
    _step(progress, clock, 11, rollout=1.0, update=1.0, gap=0.0)
    _step(progress, clock, 12, rollout=2.0, update=2.0, gap=0.0)
    assert progress.mean_step_seconds == 3.0
    assert progress.eta_seconds() == 28 * 3.0
    assert progress.line(12).endswith("| 3 s/step | ETA 1m24s")
    _step(progress, clock, 40)
    assert progress.eta_seconds() == 0.0


@pytest.mark.parametrize(
    "seconds, text",
    [(0, "0s"), (44.6, "45s"), (75, "1m15s"), (3600, "1h00m"), (2 * 3600 + 3 * 60 + 29, "2h03m"),
     (3 * 86400 + 4 * 3600, "3d04h"), (-5, "0s")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
