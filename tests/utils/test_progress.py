"""Progress: phase timing, throughput and ETA, on a fake clock."""

import time

import pytest

from mindgrpo.utils.compiles import Totals
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


class FakeCompiles:
    """What utils/compiles.totals would say: the test compiles `graphs` graphs in `seconds` when it says so."""

    def __init__(self, clock):
        self.clock, self.now = clock, Totals()

    def __call__(self):
        return self.now

    def compile(self, graphs, seconds):
        self.clock.advance(seconds)
        self.now = Totals(self.now.graphs + graphs, self.now.seconds + seconds, self.now.cpu_seconds + seconds)


def test_a_step_reports_what_it_compiled_and_the_eta_leaves_out_the_first_steps_compiles():
    clock = FakeClock()
    compiles = FakeCompiles(clock)
    progress = Progress(total_steps=12, clock=clock, compiles=compiles)
    compiles.compile(4, 30.0)  # start-up (the model's build, a warm start): no step's
    with progress.phase("rollout"):
        compiles.compile(6, 9.0)
        clock.advance(1.0)
    with progress.phase("update"):
        compiles.compile(4, 3.0)
        clock.advance(1.0)
    assert progress.step_done(1) == {"time/rollout": 10.0, "time/update": 4.0, "time/step": 14.0,
                                     "time/compile": 12.0, "compile/graphs": 10.0}
    assert progress.mean_step_seconds == 2.0  # 14 s, 12 of them the first step's compiles
    assert progress.line(1) == "step 1/12 | phase update | compiled 10 graphs in 12.0s | 2 s/step | ETA 22s"
    _step(progress, clock, 2, rollout=1.0, update=1.0, gap=0.0)
    assert progress.last_metrics["compile/graphs"] == 0.0 and progress.last_metrics["time/compile"] == 0.0
    assert progress.line(2) == "step 2/12 | phase update | 2 s/step | ETA 20s"
    with progress.phase("rollout"):  # a later step that compiles (new shapes, release_graphs): expected again
        compiles.compile(1, 2.0)
        clock.advance(2.0)
    progress.step_done(3)
    assert progress.mean_step_seconds == pytest.approx((14 + 2 + 4 - 14) / 3 + (0 + 2) / 2)
    assert "| compiled 1 graph in 2.0s |" in progress.line(3)



def test_a_long_first_step_in_flight_says_what_it_has_compiled_so_far():
    clock = FakeClock()
    compiles = FakeCompiles(clock)
    progress = Progress(total_steps=10, clock=clock, compiles=compiles)
    with progress.phase("rollout"):
        clock.advance(20.0)
        assert progress.running_line() == "step 1/10 | phase rollout for 20s"  # nothing compiled yet
        compiles.compile(6, 160.0)
        assert progress.running_line() == "step 1/10 | phase rollout for 3m00s | compiled 6 graphs in 2m40s so far"

def test_without_a_compile_count_a_step_reports_none_and_the_mean_is_the_plain_mean():
    clock = FakeClock()
    progress = Progress(total_steps=3, clock=clock)
    assert "time/compile" not in _step(progress, clock, 1)
    assert progress.mean_step_seconds == 5.5


@pytest.mark.parametrize(
    "seconds, text",
    [(0, "0s"), (44.6, "45s"), (75, "1m15s"), (3600, "1h00m"), (2 * 3600 + 3 * 60 + 29, "2h03m"),
     (3 * 86400 + 4 * 3600, "3d04h"), (-5, "0s")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_the_step_in_flight_shows_its_phase_tokens_and_eta():
    from mindgrpo.utils import heartbeat

    clock = FakeClock()
    progress = Progress(total_steps=4, clock=clock)
    assert progress.running_line() is None  # before any phase
    _step(progress, clock, 1)  # one step of 5.5 s: the mean for the ETA
    with progress.phase("rollout"):
        heartbeat.beat(16)  # the decode loop: a token for each of 16 rows, twice
        heartbeat.beat(16)
        clock.advance(4.0)
        # step 2 of 4, 32 tokens in 4 s; ETA: the rest of this step (5.5 - 4 s taken) + 2 more of 5.5 s
        assert progress.running_line() == "step 2/4 | phase rollout for 4s | 32 new tokens at 8 tok/s | " \
                                          "5.5 s/step | ETA 12s"
        with progress.phase("reward"):  # the innermost phase, counted from its own start: no tokens yet
            clock.advance(75.0)
            assert progress.running_line() == "step 2/4 | phase reward for 1m15s | 5.5 s/step | ETA 11s"
    assert progress.running_line() is None


def test_the_ticker_logs_a_long_step_once_a_minute_and_a_short_one_never():
    from mindgrpo.utils.progress import Ticker

    clock = FakeClock()
    progress = Progress(total_steps=3, clock=clock)
    lines = []
    ticker = Ticker(progress, lines.append, interval_s=60)
    assert ticker.tick() is None  # nothing has started
    _step(progress, clock, 1, rollout=20.0, update=30.0)  # 50.5 s: no line during it (ticks at every second)
    with progress.phase("rollout"):
        for _ in range(59):
            clock.advance(1.0)
            assert ticker.tick() is None
        clock.advance(1.0)  # 60 s into step 2
        assert ticker.tick() == lines[-1] and lines[-1].startswith("step 2/3 | phase rollout for 1m00s")
        clock.advance(30.0)
        assert ticker.tick() is None  # 30 s since that line
        clock.advance(30.0)
        assert ticker.tick() is not None and lines[-1].startswith("step 2/3 | phase rollout for 2m00s")
    progress.step_done(2)
    with progress.phase("update"):
        clock.advance(59.0)  # a new step: counted from its start, not from the last line
        assert ticker.tick() is None and len(lines) == 2
    assert ticker.tick() is None  # between phases: nothing to name


def test_the_ticker_thread_stops():
    from mindgrpo.utils.progress import Ticker

    progress = Progress(total_steps=1)
    lines = []
    ticker = Ticker(progress, lines.append, interval_s=0.0, poll_s=0.01).start()
    with progress.phase("rollout"):
        for _ in range(3000):  # a line comes within the first polls (waits 30 s at most)
            if lines:
                break
            time.sleep(0.01)
    ticker.stop()
    assert lines and lines[0].startswith("step 1/1 | phase rollout for")
    assert not ticker._thread.is_alive()
