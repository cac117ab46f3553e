"""Step timing, throughput and ETA for the training loop.

    progress = Progress(total_steps=40, start_step=resume_step)
    for step in range(resume_step + 1, 41):
        with progress.phase("rollout"):
            ...
            progress.add_tokens("rollout", num_generated_tokens)
        with progress.phase("update"):
            logger.info(progress.line(step))    # step 3/40 | phase update | rollout 812 tok/s | 2.1 s/step | ETA 1m15s
        metrics.update(progress.step_done(step))   # time/rollout, time/update, time/step, throughput/rollout

Steps are counted from 1: `step_done(step)` means `step` of `total_steps` steps are done.
A step's time runs from the end of the previous step (or, for the first step, from the
start of its first phase) to `step_done`, so it includes work between phases. Phases
of the same name within one step add up.

With `compiles` (`utils/compiles.totals`: the process's graphs compiled and their seconds) a step also reports
what it compiled (`time/compile`, `compile/graphs`), its line says so, and the expected step time behind `s/step`
and the ETA leaves out the first step's compiles (once per process) but keeps those of later steps (new shapes,
`rl_config.release_graphs`): the tiny default's first step compiles for ~14 s, its later steps take ~1.3 s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from mindgrpo.utils import heartbeat
from mindgrpo.utils.compiles import Totals


def format_duration(seconds: float) -> str:
    """45s, 1m15s, 2h03m, 3d04h."""
    seconds = max(int(round(seconds)), 0)
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def compiled_text(spent: Totals) -> str:
    """`compiled 8 graphs in 10.3s` / `compiled 1 graph in 2m40s`: what a step compiled, as the console lines say it
    (the trainer's, the separate placement's rollout rank's)."""
    secs = spent.seconds
    return (f"compiled {spent.graphs} graph{'s' if spent.graphs != 1 else ''} in "
            f"{f'{secs:.1f}s' if secs < 60 else format_duration(secs)}")


def _format_number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


class Progress:
    """Times the phases of each step and estimates the time left from the mean step time."""

    def __init__(self, total_steps: int, start_step: int = 0, clock: Callable[[], float] = time.perf_counter,
                 compiles: Optional[Callable[[], Totals]] = None):
        self.total_steps = int(total_steps)
        self.last_step = int(start_step)  # the last step done
        self.clock = clock
        self.compiles = compiles
        self.step_times: List[float] = []  # seconds of each step done by this Progress
        self.compile_times: List[float] = []  # of each step, the seconds it spent compiling graphs
        self._compiles_at_start: Optional[Totals] = None  # compiles' totals when the step in flight began
        self.last_metrics: Dict[str, float] = {}  # step_done's result for the last step
        self._step_start: Optional[float] = None
        self._phase_seconds: Dict[str, float] = {}
        self._phase_tokens: Dict[str, float] = {}
        # the phases running now, innermost last: (name, start, heartbeat.tokens() at the start)
        self._active: List[Tuple[str, float, int]] = []
        self._last_phase: Optional[str] = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase `name` of the current step (`time/<name>` in step_done); it is also the
        process's heartbeat phase (mindgrpo/utils/heartbeat.py), which a collective watchdog names."""
        start = self.clock()
        if self._step_start is None:
            self._step_start = start
            self._compiles_at_start = self._compiled()
        self._active.append((name, start, heartbeat.tokens()))
        self._last_phase = name
        try:
            with heartbeat.phase(name):
                yield
        finally:
            self._active.pop()
            self._phase_seconds[name] = self._phase_seconds.get(name, 0.0) + self.clock() - start

    def start_at(self, step: int) -> None:
        """A resumed run: `step` steps are done, the next one in flight is step + 1."""
        self.last_step = int(step)

    def add_tokens(self, phase: str, tokens: float) -> None:
        """Count `tokens` processed in `phase` this step, for `throughput/<phase>` (tokens/s)."""
        self._phase_tokens[phase] = self._phase_tokens.get(phase, 0.0) + float(tokens)

    def step_done(self, step: int) -> Dict[str, float]:
        """End step `step`; returns its `time/<phase>`, `time/step` and `throughput/<phase>` metrics."""
        now = self.clock()
        step_seconds = now - self._step_start if self._step_start is not None else 0.0
        metrics = {f"time/{name}": secs for name, secs in self._phase_seconds.items()}
        metrics["time/step"] = step_seconds
        for name, tokens in self._phase_tokens.items():
            secs = self._phase_seconds.get(name, 0.0)
            if secs > 0:
                metrics[f"throughput/{name}"] = tokens / secs
        compiled = self._compiled()
        spent = compiled - (self._compiles_at_start or compiled) if compiled is not None else Totals()
        if compiled is not None:
            metrics["time/compile"] = spent.seconds
            metrics["compile/graphs"] = float(spent.graphs)

        self.step_times.append(step_seconds)
        self.compile_times.append(min(spent.seconds, step_seconds))
        self.last_step = int(step)
        self.last_metrics = metrics
        self._step_start = now
        self._compiles_at_start = compiled
        self._phase_seconds, self._phase_tokens = {}, {}
        return dict(metrics)

    def _compiled(self) -> Optional[Totals]:
        return self.compiles() if self.compiles is not None else None

    @property
    def mean_step_seconds(self) -> Optional[float]:
        """The expected time of a step from the steps done so far in this run, None before the first: their mean
        without the first step's compiles (a process compiles most of its graphs once), plus the mean of the later
        steps' compiles. Without `compiles`, the mean step time."""
        if not self.step_times:
            return None
        n = len(self.step_times)
        without = (sum(self.step_times) - sum(self.compile_times)) / n
        return without + (sum(self.compile_times[1:]) / (n - 1) if n > 1 else 0.0)

    def eta_seconds(self, step: Optional[int] = None) -> Optional[float]:
        """Seconds left until `total_steps`, seen at `step` (default: the last step done).

        If `step` is still running, its remaining time is the mean step time minus what it has
        already taken.
        """
        mean = self.mean_step_seconds
        if mean is None:
            return None
        step = self.last_step if step is None else int(step)
        remaining = max(self.total_steps - step, 0) * mean
        if step > self.last_step and self._step_start is not None:
            remaining += max(mean - (self.clock() - self._step_start), 0.0)
        return remaining

    def line(self, step: int, extra: Optional[Mapping[str, object]] = None) -> str:
        """`step 3/40 | phase update | rollout 812 tok/s | 2.1 s/step | ETA 1m15s`.

        The phase is the innermost one running (or the last one run); throughputs are those of
        the last step done; `extra` ({label: value}) adds `label value` fields before the timing, and the
        graphs the last step done compiled (with `compiles`, when it compiled any) follow them.
        """
        parts = [f"step {step}/{self.total_steps}"]
        phase = self._active[-1][0] if self._active else self._last_phase
        if phase is not None:
            parts.append(f"phase {phase}")
        for key, value in self.last_metrics.items():
            if key.startswith("throughput/"):
                parts.append(f"{key[len('throughput/'):]} {_format_number(value)} tok/s")
        for key, value in (extra or {}).items():
            shown = _format_number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            parts.append(f"{key} {shown}")
        graphs = int(self.last_metrics.get("compile/graphs", 0))
        if graphs:
            parts.append(compiled_text(Totals(graphs, self.last_metrics["time/compile"])))
        return " | ".join(parts + self._timing(step))

    def _timing(self, step: int) -> List[str]:
        """The line's last fields, once a step is done: the mean step time and the ETA seen at `step`."""
        mean = self.mean_step_seconds
        if mean is None:
            return []
        return [f"{_format_number(mean)} s/step", f"ETA {format_duration(self.eta_seconds(step))}"]

    def running_line(self) -> Optional[str]:
        """The step in flight, for a step that runs for minutes: `step 2/40 | phase rollout for 4m10s |
        2048 new tokens at 8.2 tok/s | 212 s/step | ETA 2h18m` (tokens: those the decode loop reported to
        the heartbeat since the phase began, shown when there are any; with `compiles`, `compiled 6 graphs in
        2m40s so far` when the step has compiled any: a first step of minutes is mostly that); None outside every
        phase."""
        active = self._active[-1:]  # one read: the Ticker's thread calls this while phases come and go
        if not active:
            return None
        name, start, tokens0 = active[0]
        secs = self.clock() - start
        step = self.last_step + 1
        parts = [f"step {step}/{self.total_steps}", f"phase {name} for {format_duration(secs)}"]
        tokens = heartbeat.tokens() - tokens0
        if tokens > 0:
            parts.append(f"{tokens} new tokens at {_format_number(tokens / max(secs, 1e-9))} tok/s")
        began, now = self._compiles_at_start, self._compiled()
        if began is not None and now is not None and now.graphs > began.graphs:
            parts.append(compiled_text(now - began) + " so far")
        return " | ".join(parts + self._timing(step))

    @property
    def step_started(self) -> Optional[float]:
        """When the step in flight began (the previous step's end), None before the first phase."""
        return self._step_start


class Ticker:
    """Logs `progress.running_line()` every `interval_s` seconds of a step in flight, so that a step of
    minutes (a real model's rollout, its first compile) shows where it is; quiet during steps shorter
    than that (the trainer's own line at each step's end is their view).

        ticker = Ticker(progress, logger.info, interval_s=60).start()
        ...                                   # the run
        ticker.stop()

    `tick()` is the whole decision (the thread only calls it every `poll_s`): a line when a phase is
    running and `interval_s` have passed since the step began or the last line, whichever is later."""

    def __init__(self, progress: Progress, emit: Callable[[str], object], interval_s: float = 60.0,
                 poll_s: float = 1.0):
        self.progress, self.emit, self.interval_s, self.poll_s = progress, emit, float(interval_s), float(poll_s)
        self._last: Optional[float] = None  # the progress clock at the last line
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def tick(self) -> Optional[str]:
        """Emits and returns the line if one is due, else None."""
        began = self.progress.step_started
        if began is None:
            return None
        since = began if self._last is None else max(began, self._last)
        now = self.progress.clock()
        if now - since < self.interval_s:
            return None
        line = self.progress.running_line()
        if line is None:
            return None
        self._last = now
        self.emit(line)
        return line

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001  a progress line must never end the run
                logging.getLogger(__name__).debug("progress ticker: %s", e)

    def start(self) -> "Ticker":
        self._thread = threading.Thread(target=self._run, name="progress-ticker", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
