"""Launching msrun jobs from tests (a free port per job, a timeout, the workers' logs on failure) and
the files they exchange with the tests (per-rank results, MindSpore's sharded checkpoint layout, and
MindSpore's own slicing of a full checkpoint to compare with)."""

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = os.path.join(REPO, "tests", "parallel", "workers")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def msrun_path() -> str:
    path = shutil.which("msrun") or os.path.join(os.path.dirname(sys.executable), "msrun")
    if not os.path.exists(path):
        pytest.skip("msrun is not installed")
    return path


def python_path() -> str:
    """PATH with this interpreter's folder first: msrun starts its workers with the `python` on PATH,
    which must be the test's (the venv need not be activated)."""
    return os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def tail(path: str, lines: int = 40) -> str:
    with open(path, errors="replace") as f:
        kept = [ln for ln in f.read().splitlines() if not ln.startswith(("[WARNING]", "[INFO]"))]
    return "\n".join(kept[-lines:])


def run_msrun(script: str, workers: int, log_dir: str, args=(), timeout: float = 300.0, fails: bool = False,
              env=None) -> None:
    """Run `script` (a path, or a file in tests/parallel/workers) on `workers` msrun workers and
    wait; on a non-zero exit (fails: on a zero exit: a job meant to be killed) or a timeout, fail with
    the tail of every worker's log. env: more environment variables."""
    script = script if os.path.isabs(script) else os.path.join(WORKERS, script)
    cmd = [msrun_path(), f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_port",
           str(free_port()), "--log_dir", log_dir, "--join", "True", script, *map(str, args)]
    # the repo (mindgrpo, scripts) and tests/parallel (the workers' shared cases)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests", "parallel"),
                                                       os.environ.get("PYTHONPATH", "")]), PATH=python_path(),
               **(env or {}))
    # MindSpore's CPU collectives give up on a rank 30 s late by default: on a loaded machine one rank
    # can compile that much longer than another (DEVELOPERS.md); `timeout` still bounds the job
    env.setdefault("MS_CPU_COMM_OP_TIMEOUT", "300")
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "msrun.out"), "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: killed whole on timeout
        try:
            failed, reason = (proc.wait(timeout) != 0) != fails, f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired:  # msrun's SIGINT handler kills its workers (own sessions)
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            failed, reason = True, f"timed out after {timeout:.0f}s"
    if failed:
        logs = "\n".join(f"--- {os.path.basename(p)}\n{tail(p)}"
                         for p in sorted(glob.glob(os.path.join(log_dir, "worker_*.log"))))
        pytest.fail(f"msrun {os.path.basename(script)} ({workers} workers): {reason}\n{logs}", pytrace=False)


def job_processes(marker: str):
    """Live processes whose command line holds `marker` (msrun, the ranks), and the reward workers of those."""
    found, workers = {}, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if any(marker in a for a in args):
            found[int(entry)] = " ".join(args)
        elif "mindgrpo.rewards.worker" in args:
            workers.append((int(entry), int(args[-1]), " ".join(args)))  # its last argument: its parent
    found.update({pid: cmd for pid, parent, cmd in workers if parent in found})
    return found


def wait_until_gone(marker: str, bound_s: float = 60.0):
    """The job's processes left after up to bound_s seconds (killed, so that no test leaves any behind)."""
    end = time.monotonic() + bound_s
    while job_processes(marker) and time.monotonic() < end:
        time.sleep(0.5)
    left = job_processes(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def load_results(folder, ranks):
    """The workers' OUT_DIR/rank_<k>.npz (arrays) and rank_<k>.json (metrics), in rank order."""
    import numpy as np

    return ([dict(np.load(os.path.join(folder, f"rank_{r}.npz"))) for r in range(ranks)],
            [json.load(open(os.path.join(folder, f"rank_{r}.json"))) for r in range(ranks)])


def save_sharded(pieces, folder):
    """pieces[rank] = {name: array} -> MindSpore's sharded layout folder/rank_k/ck_k.ckpt."""
    import mindspore as ms

    for rank, state in enumerate(pieces):
        os.makedirs(os.path.join(folder, f"rank_{rank}"))
        ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in state.items()],
                           os.path.join(folder, f"rank_{rank}", f"ck_{rank}.ckpt"))
    return folder


def mindspore_slices(full, layout, cfg, work):
    """MindSpore's transform_checkpoints of the full weights {name: array} for every rank of layout."""
    import mindspore as ms
    from mindspore.parallel import transform_checkpoints

    from mindgrpo.models.convert import expected_shapes
    from mindgrpo.parallel.strategy import write_strategy_file

    strategy = write_strategy_file(os.path.join(work, "dst_strategy.ckpt"), layout, expected_shapes(cfg))
    transform_checkpoints(save_sharded([full], os.path.join(work, "full")), os.path.join(work, "out"), "ck_",
                          None, strategy)
    return [{k: v.asnumpy() for k, v in ms.load_checkpoint(os.path.join(work, "out", f"rank_{r}",
                                                                        f"ck_{r}.ckpt")).items()}
            for r in range(layout.world_size)]
