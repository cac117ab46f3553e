"""What every benchmark shares: the timing loops, the run stamp, the result files, memory readings.

    secs = time_calls(fn, 5, before=reset)     # seconds of each of 5 calls; reset() runs untimed before each
    med, out = timed(fn, 5)                    # their median, and the last call's result
    runs = alternate({"a": fa, "b": fb}, 5)    # a, b, a, b, ...: machine load falls on both sides
    stamp = run_stamp("benchmarks.NAME")       # command, date, machine, load average
    write_results(json_path, res, markdown)    # json + md beside it, each through a temporary file

This machine is shared and its speed drifts, so a figure is only meaningful against a baseline timed
side by side in the same run (`alternate`), as a ratio.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mindgrpo.utils.host_memory import status_bytes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
SHARED = os.path.join(os.path.dirname(REPO), "shared")  # GSM8K and the Qwen2.5 tokenizer, when present


# ----------------------------------------------------------------------------------- timing
def time_calls(fn: Callable[[], object], repeats: int, before: Optional[Callable[[], object]] = None) -> List[float]:
    """Seconds of each of `repeats` calls of fn (after the caller's warm-up); before(), when given,
    runs untimed before each call (a reset, a barrier, a cache flush)."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def timed(fn: Callable[[], object], repeats: int = 3):
    """Median seconds of `repeats` calls (after the caller's warm-up) and the last call's result."""
    out = []
    times = time_calls(lambda: out.append(fn()), repeats)
    return float(np.median(times)), out[-1]


def alternate(fns: Dict[str, Callable[[], object]], repeats: int) -> Dict[str, List[float]]:
    """name -> zero-argument callable; calls them in turn, `repeats` rounds -> name -> seconds per call.
    A change of the machine's load then hits every side alike."""
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            times[k] += time_calls(fn, 1)
    return times


def median(values: Sequence[float]) -> float:
    return float(np.median(values))


# ----------------------------------------------------------------------------------- the run stamp
def values_differ(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> dict:
    """Two sides' per-sample values (log-probs, lists of lists): how many there are, how many differ and the
    largest difference (None for both when the samples' lengths differ)."""
    x = np.concatenate([np.asarray(v, np.float64) for v in a]) if len(a) else np.zeros(0)
    y = np.concatenate([np.asarray(v, np.float64) for v in b]) if len(b) else np.zeros(0)
    same = x.shape == y.shape
    return {"values": int(x.size), "differ": int((x != y).sum()) if same else None,
            "max_abs": float(np.abs(x - y).max()) if same and x.size else None}


def stamp_lines(res: dict, note: str = "") -> List[str]:
    """The lines a result's markdown opens with after its title: date, machine, the load average at the start and
    at the end (`res["load_average_end"]`; `note` after it, e.g. " (other jobs shared the machine)"), the command
    and the library code, each followed by a blank line."""
    return [f"Date {res['date']}; machine: {res['machine']}; load average {res['load_average']} at the start, "
            f"{res['load_average_end']:.1f} at the end{note}.", "",
            f"Command (from the repo root): `{res['command']}`; library code: {res['code']}.", ""]


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's name with its family, model and widest vector extension (a VM may name only the maker's line:
    "AMD EPYC" is a Zen 2 with AVX2 at family 23 and a Zen 4 with AVX-512 at family 25, and kernels run apart)."""
    fields = {}
    try:
        with open(cpuinfo) as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    flags = set(fields.get("flags", "").split())
    simd = next((label for flag, label in (("amx_tile", "AVX-512 + AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
                 if flag in flags), None)
    detail = []
    if {"cpu family", "model"} <= set(fields):
        detail.append(f"family {fields['cpu family']}, model {fields['model']}")
    detail += [simd] if simd else []
    return f"{name} ({'; '.join(detail)})" if detail else name


def machine() -> str:
    return f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def command(module: str, argv: Optional[Sequence[str]] = None) -> str:
    """The command that reproduces a run, from the repo root: `module` is the benchmark's dotted name
    (benchmarks.NAME), argv its arguments (sys.argv[1:] when None; an empty list records none)."""
    args = sys.argv[1:] if argv is None else argv
    return f"python -m {module}" + "".join(f" {a}" for a in args)


def code_version() -> str:
    """The commit the library code is at, and whether mindgrpo/ or scripts/ differ from it."""
    def git(*cmd):
        return subprocess.run(["git", "-C", REPO, *cmd], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", "mindgrpo", "scripts")
    return f"commit {commit}" + (" with uncommitted changes under mindgrpo/ or scripts/" if dirty else "")


def run_stamp(module: str, argv: Optional[Sequence[str]] = None) -> dict:
    """What a results file records about its run: the command that reproduces it, the date, the
    machine and the load average."""
    return {"command": command(module, argv), "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "load_average": load_average()}


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------------- result files
def write_text(path: str, text: str) -> None:
    """text to path through a temporary file and a rename: an interrupted run leaves the old file whole."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_results(json_path: str, res: dict, markdown: Optional[str] = None) -> None:
    """res to json_path and, when given, markdown beside it (same name, .md)."""
    write_text(json_path, json.dumps(res, indent=1))
    if markdown is not None:
        write_text(os.path.splitext(json_path)[0] + ".md", markdown)


# ----------------------------------------------------------------------------------- memory
def rss_gb() -> float:
    """This process's resident memory now, in GB (10^9 bytes; adamw's results are in these). Until 2026-11-27
    13:30 UTC these three read /proc's kB (1024 bytes) as 1000: 2.4% low (benchmarks/results/HISTORY.md)."""
    return status_bytes("VmRSS") / 1e9


def peak_rss_gb() -> float:
    """This process's peak resident memory, in GB (10^9 bytes, as `rss_gb`; VmHWM: ru_maxrss would carry
    the parent's over exec). Results written before 2026-11-26 07:00 UTC held GiB here (2^30 bytes)."""
    return status_bytes("VmHWM") / 1e9


def reset_peak_rss() -> None:
    """Start this process's peak resident memory (VmHWM) again from its resident memory now, so that
    the next `peak_since_reset_gb` is one phase's peak (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_since_reset_gb() -> float:
    """This process's peak resident memory since it started or since the last `reset_peak_rss`, in
    GB (10^9 bytes, as `rss_gb`)."""
    return status_bytes("VmHWM") / 1e9
