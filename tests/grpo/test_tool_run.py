"""scripts/grpo_one_stage.py with generate_config.tools on a micro model: start-up refusals in one line, a step
that logs the tool metrics, and the tool workers closed at the end and on SIGTERM (their folder gone)."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "grpo_one_stage.py")
TEMPLATE = "model_configs/qwen_grpo/tiny_tools/tokenizer_config.json"  # relative: found from the repository's root
MICRO = [f"actor_config.model={os.path.join(REPO, 'tests', 'grpo', 'micro_qwen2.yaml')}",
         "rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=8",
         "generate_config.max_tokens=8", "sft_config={steps: 0}", "rl_config.val_interval=0",
         "synthetic_config.template=raw", "rl_config.max_steps=1", "generate_config.tools=[calculator]",
         "generate_config.tool_num_workers=1", "generate_config.max_turns=1",
         "generate_config.tool_response_max_tokens=16"]


def command(out, *extra):
    return [sys.executable, SCRIPT, "--output_dir", str(out), *MICRO, *extra]


def environment(tmp):
    os.makedirs(tmp, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


@pytest.mark.parametrize("extra, needle", [
    (["generate_config.chat_template=null"], "config key 'generate_config.chat_template': "),
    ([f"generate_config.chat_template={TEMPLATE}", "generate_config.max_turns=40"],
     "config key 'generate_config.max_turns': a conversation needs max_prompt_length + max_tokens + max_turns x"),
    ([f"generate_config.chat_template={TEMPLATE}", "generate_config.tools=[abacus]"],
     "config key 'generate_config.tools': names unknown tool(s) ['abacus']"),
])
def test_start_up_refusals_are_one_line(tmp_path, extra, needle):
    r = subprocess.run(command(tmp_path / "out", *extra), capture_output=True, text=True, cwd=REPO, timeout=600,
                       env=environment(tmp_path / "tmp"))
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and needle in errors[0], r.stderr[-3000:]
    assert not glob.glob(str(tmp_path / "tmp" / "mindgrpo-tools-*"))


@pytest.mark.slow
def test_a_step_with_tools_logs_their_metrics_and_closes_the_workers(tmp_path):
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    r = subprocess.run(command(out, f"generate_config.chat_template={TEMPLATE}"), capture_output=True, text=True,
                       cwd=REPO, timeout=1800, env=environment(tmp))
    assert r.returncode == 0, r.stderr[-3000:]
    row = [json.loads(line) for line in open(out / "metrics.jsonl")][-1]
    for key in ("tool/calls_mean", "tool/errors", "tool/timeouts", "tool/seconds", "turns/mean",
                "turns/masked_fraction", "tool/samples_with_calls", "turns/cut"):
        assert key in row and row[key] >= 0, key
    assert "tools calculator, at most 1 tool turns" in r.stderr
    assert not glob.glob(str(tmp / "mindgrpo-tools-*"))  # the pool's folder, removed at close


@pytest.mark.slow
def test_sigterm_closes_the_tool_workers(tmp_path):
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    proc = subprocess.Popen(command(out, f"generate_config.chat_template={TEMPLATE}", "rl_config.max_steps=50"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=environment(tmp))
    try:
        deadline = time.monotonic() + 600
        while not glob.glob(str(tmp / "mindgrpo-tools-*")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.5)
        folders = glob.glob(str(tmp / "mindgrpo-tools-*"))
        assert folders, "the tool workers never started"
        workers = glob.glob(os.path.join(folders[0], "worker-*"))
        assert workers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=600) == -signal.SIGTERM  # it still ends as SIGTERM ends it
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not glob.glob(str(tmp / "mindgrpo-tools-*"))
    # close() reaps every worker it lists; one whose Popen the signal caught dies with its parent instead (its
    # parent-death signal, armed as it starts): a few seconds at most, which a loaded machine may need
    deadline = time.monotonic() + 60
    while (left := [p for p in glob.glob("/proc/[0-9]*/environ") if _has_tmpdir(p, str(tmp))]) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left


def _has_tmpdir(environ_path, tmp):
    """Whether a live process (not a zombie) has TMPDIR under `tmp` (each tool worker's is its own folder)."""
    try:
        with open(environ_path, "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return any(e.startswith(b"TMPDIR=" + tmp.encode()) for e in env)


def in_pipe_read(pid: int, timeout: float = 30.0) -> None:
    """Returns once the main thread of process `pid` sleeps in a read of a pipe (its kernel wait channel): the line a
    process prints just before its wait can arrive while its main thread still runs Python, which would then run a
    SIGTERM handler at once (seen once in four runs). Where the kernel does not tell (no /proc/PID/wchan), a pause."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/wchan") as f:
                channel = f.read()
        except OSError:
            time.sleep(1.0)
            return
        if "pipe" in channel:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not reach its wait in {timeout} s")


def terminated(proc: subprocess.Popen, timeout: float, ready) -> tuple:
    """proc's first line of output checked by `ready`, and its main thread in its wait (a pipe's read), then SIGTERM:
    (that line, its exit code, the seconds it took to end); killed if it outlives `timeout` or a check fails."""
    try:
        line = proc.stdout.readline().strip()
        assert ready(line), line
        in_pipe_read(proc.pid)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=timeout)
        return line, code, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()


# a rank of a separate placement whose main thread waits in a collective (a graph call) when SIGTERM comes: here the
# main thread blocks the signal and sleeps, so only another thread of the process can take it
WAITING_RANK = """
import os, signal, sys, threading
from mindgrpo.grpo.run import close_on_sigterm

def close():
    open(sys.argv[1], "w").write("closed")

close_on_sigterm(close, in_collectives=sys.argv[2] == "1")
read, write = os.pipe()
threading.Timer(float(sys.argv[3]), os.write, (write, b"x")).start()  # the collective's end
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("waiting", flush=True)
os.read(read, 1)
"""


@pytest.mark.parametrize("in_collectives", [True, False])
def test_sigterm_closes_the_tool_workers_of_a_rank_waiting_in_a_collective(tmp_path, in_collectives):
    """The rollout rank's tool workers (grpo/run.close_on_sigterm(in_collectives=True)): closed and the process ended
    at once, though its main thread does not run Python; without it the rank would end only when the wait does."""
    marker = tmp_path / "closed"
    wait_s = 60 if in_collectives else 3
    proc = subprocess.Popen([sys.executable, "-c", WAITING_RANK, str(marker), "1" if in_collectives else "0",
                             str(wait_s)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": REPO})
    _, code, took = terminated(proc, wait_s + 30, lambda line: line == "waiting")
    if in_collectives:
        assert code == 128 + signal.SIGTERM and marker.read_text() == "closed" and took < 30
    else:  # the main thread's handler, once the sleep is over: closed late, then ended by the signal
        assert code == -signal.SIGTERM and marker.read_text() == "closed" and took >= wait_s - 1


# a rank with tool workers (grpo/run.close_conversations_on_sigterm, as run() arms it on every rank that has them)
# whose main thread waits in a collective when SIGTERM comes; argv: use_parallel (1: under msrun), the wait's seconds
RANK_WITH_TOOLS = """
import os, signal, sys, threading
from mindgrpo.grpo.conversations import Conversations
from mindgrpo.grpo.run import close_conversations_on_sigterm
from mindgrpo.tools import ToolCall, ToolPool

pool = ToolPool({"calculator": {}}, num_workers=1, timeout_s=60.0)
conversations = Conversations("tools", None, pool.start, pool.close)
conversations.start()
assert pool.run([ToolCall("calculator", {"expression": "20+22"})])[0].text == "42"
close_conversations_on_sigterm(conversations, use_parallel=sys.argv[1] == "1")
read, write = os.pipe()
threading.Timer(float(sys.argv[2]), os.write, (write, b"x")).start()  # the collective's end
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print(pool.root, flush=True)
os.read(read, 1)
"""


@pytest.mark.parametrize("use_parallel", [True, False])
def test_sigterm_closes_the_tool_workers_of_every_rank_that_has_them(tmp_path, use_parallel):
    """A colocated msrun rank (every rank generates, each its own tool workers) closes them on SIGTERM and ends at
    once, though it waits in a collective, as the rollout rank of a separate placement does (the same function);
    one process closes them when its main thread is back in Python. Either way no folder and no worker is left."""
    tmp = tmp_path / "tmp"
    wait_s = 60 if use_parallel else 3
    proc = subprocess.Popen([sys.executable, "-c", RANK_WITH_TOOLS, "1" if use_parallel else "0", str(wait_s)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, env={**environment(tmp), "PYTHONPATH": REPO})
    root, code, took = terminated(proc, wait_s + 30,
                                  lambda line: line.startswith(str(tmp / "mindgrpo-tools-")) and os.path.isdir(line))
    if use_parallel:
        assert code == 128 + signal.SIGTERM and took < 30
    else:
        assert code == -signal.SIGTERM and took >= wait_s - 1
    assert not os.path.exists(root)  # closed before the process ended (its folder's keeper is reaped by close)
    assert not [p for p in glob.glob("/proc/[0-9]*/environ") if _has_tmpdir(p, str(tmp))]
