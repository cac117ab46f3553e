"""Several nodes on one host: scripts/run_grpo.sh launched twice (--node_rank 0 and 1), the second launcher in a
network namespace of its own (a veth pair), so that it sees the master address as remote and starts no scheduler
(msrun starts one on every launcher whose --master_addr is local: a second one cannot bind). The tiny default's
step 1 (at an eighth of its batch: 8 prompts x 4 samples) on 4 workers (training tp2 x dp2, inference dp4)
against one process; a node lost mid-step; a scheduler
that cannot bind, reported in one line."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from msrun_util import REPO, free_port, msrun_path, python_path, wait_until_gone

RUN_GRPO = os.path.join(REPO, "scripts", "run_grpo.sh")
# the tiny default's first GRPO step, without the warm start, at an eighth of its batch (8 x 4 samples: 2 prompts a
# rollout rank, micro-batches of 16: one a training replica, two in one process); the full 32 x 8 compiles decode
# graphs of up to 256 slots and the update's at 64 rows for what these tests check: the ranks' meeting, a lost
# node, a failing rank. The reward is dense (workers/text_length_reward.py: an untrained model's answers are all
# wrong, and 32 wrong answers give a zero loss): the rewards and the loss of the step are those of the samples' texts
STEP1 = ["rl_config.max_steps=1", "sft_config={steps: 0}", "rl_config.val_interval=0",
         "rl_config.completions_interval=0", "rl_config.batch_size=8", "rl_config.num_generations=4",
         "actor_config.micro_batch_size=16",
         "reward_config.reward_plugin=" + os.path.join(REPO, "tests", "parallel", "workers", "text_length_reward.py"),
         "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]"]
FOUR = ["actor_config.parallel_config.model_parallel=2", "actor_config.parallel_config.data_parallel=2",
        "generate_config.parallel_config.data_parallel=4"]


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@contextlib.contextmanager
def second_host():
    """A network namespace joined to this host by a veth pair: yields (namespace, this host's address on the
    pair, the namespace's). Made and removed here; skips when it cannot be made (not root, no `ip`)."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (apt-get install iproute2) to make a network namespace")
    tag = os.getpid() % 100000
    ns, host_if, ns_if = f"mgnode{tag}", f"mgh{tag}", f"mgn{tag}"
    subnet = f"10.231.{tag % 250}"
    made = ip("netns", "add", ns, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
    try:
        for cmd in (["link", "add", host_if, "type", "veth", "peer", "name", ns_if],
                    ["link", "set", ns_if, "netns", ns],
                    ["addr", "add", f"{subnet}.1/30", "dev", host_if],
                    ["link", "set", host_if, "up"],
                    ["netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/30", "dev", ns_if],
                    ["netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
                    ["netns", "exec", ns, "ip", "link", "set", "lo", "up"]):
            ip(*cmd)
        yield ns, f"{subnet}.1", f"{subnet}.2"
    finally:
        kill_namespace(ns)
        ip("link", "del", host_if, check=False)  # removes its peer too
        ip("netns", "del", ns, check=False)


def namespace_pids(ns):
    return [int(p) for p in ip("netns", "pids", ns, check=False).stdout.split()]


def kill_namespace(ns):
    """SIGKILL every process in the namespace (a node's power cut), until none is left."""
    for _ in range(20):
        pids = namespace_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def launcher(node_rank, master, port, log_dir, out, overrides, ns=None, node_timeout=30, env=()):
    cmd = ["bash", RUN_GRPO, "--worker_num", "4", "--local_worker_num", "2", "--node_rank", str(node_rank),
           "--master_addr", master, "--master_port", str(port), "--cluster_time_out", "300",
           "--node_timeout", str(node_timeout), "--log_dir", log_dir, "--", "--output_dir", out, *STEP1, *FOUR,
           *overrides]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=dict(os.environ, PATH=python_path(), PYTHONPATH=REPO, MS_CPU_COMM_OP_TIMEOUT="300",
                                     **dict(env)))


def step1(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return json.loads(f.readline())


@pytest.mark.msrun
@pytest.mark.slow
def test_two_launchers_train_step_1_as_one_process(tmp_path):
    """Node 0 (this host, the scheduler) and node 1 (the namespace), two ranks each, output and logs in one
    folder both see (the shared path): step 1 as one process's (the same samples: the reward exactly)."""
    msrun_path()
    single = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir",
                             str(tmp_path / "single"), *STEP1], cwd=REPO, capture_output=True, text=True,
                            timeout=1200, env=dict(os.environ, PYTHONPATH=REPO))
    assert single.returncode == 0, single.stderr[-3000:]
    with second_host() as (ns, master, _):
        port, log, out = free_port(), str(tmp_path / "log"), str(tmp_path / "out")
        nodes = [launcher(0, master, port, log, out, []), launcher(1, master, port, log, out, [], ns=ns)]
        try:
            results = [p.communicate(timeout=1800) for p in nodes]
        finally:
            for p in nodes:
                if p.poll() is None:
                    p.kill()
            left = wait_until_gone(out, bound_s=20.0)
    for p, (_, err) in zip(nodes, results):
        assert p.returncode == 0, err[-3000:]
    assert not left, left
    # logs per node and rank; each node's launcher ended well
    assert sorted(os.listdir(os.path.join(log, "node_0"))) == ["scheduler.log", "worker_0.log", "worker_1.log"]
    assert sorted(os.listdir(os.path.join(log, "node_1"))) == ["worker_2.log", "worker_3.log"]
    assert sorted(f for f in os.listdir(log) if f.startswith("node_") and "." in f) == ["node_0.done", "node_1.done"]
    one, two = step1(tmp_path / "single"), step1(out)
    assert two["reward_mean"] == one["reward_mean"] and one["reward_mean"] > 0
    assert two["loss"] == pytest.approx(one["loss"], rel=0.01) and one["loss"] != 0
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=0.01)
    # the run's checkpoint: every rank's pieces under the one folder
    step = os.path.join(out, "checkpoints", "step_00000001")
    assert sorted(os.listdir(os.path.join(step, "policy"))) == [f"rank_{r}" for r in range(4)]


@pytest.mark.msrun
@pytest.mark.slow
def test_a_node_lost_mid_step_ends_the_other_naming_its_ranks(tmp_path):
    """Node 1 killed whole (every process in its namespace) while the ranks train: node 0's launcher stops its
    own job within its --node_timeout, naming node 1's ranks, and leaves no worker running."""
    msrun_path()
    with second_host() as (ns, master, _):
        port, log, out = free_port(), str(tmp_path / "log"), str(tmp_path / "out")
        overrides = ["rl_config.max_steps=1000"]  # still training when node 1 goes
        nodes = [launcher(0, master, port, log, out, overrides, node_timeout=10),
                 launcher(1, master, port, log, out, overrides, ns=ns, node_timeout=10)]
        try:
            end = time.monotonic() + 900
            metrics = os.path.join(out, "metrics.jsonl")
            while not os.path.exists(metrics) and nodes[0].poll() is None and time.monotonic() < end:
                time.sleep(1)  # step 1 done: the ranks are in step 2
            assert nodes[0].poll() is None, nodes[0].communicate()[1][-3000:]
            kill_namespace(ns)
            lost_at = time.monotonic()
            _, err = nodes[0].communicate(timeout=120)
            ended_after = time.monotonic() - lost_at
        finally:
            for p in nodes:
                if p.poll() is None:
                    p.kill()
            left = wait_until_gone(out, bound_s=20.0)
            in_namespace = namespace_pids(ns)
    assert nodes[0].returncode != 0
    assert re.search(r"run_grpo.sh: node 1 \(ranks 2-3\) lost: its launcher has not reported", err), err[-3000:]
    assert ended_after < 10 + 30, ended_after  # the bound, plus stopping the job (SIGTERM, then SIGKILL)
    assert not left, left
    assert not in_namespace


@pytest.mark.msrun
@pytest.mark.slow
def test_a_scheduler_that_cannot_bind_is_reported_in_one_line(tmp_path):
    """The master port taken on the master's host (as by a second launcher there that also sees the master
    address as its own): run_grpo.sh names it in one line."""
    msrun_path()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(["bash", RUN_GRPO, "--worker_num", "1", "--master_port", str(port), "--cluster_time_out",
                               "5", "--log_dir", str(tmp_path / "log"), "--timeout", "240", "--",
                               "--output_dir", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=300, cwd=REPO,
                              env=dict(os.environ, PATH=python_path(), PYTHONPATH=REPO))
    assert proc.returncode != 0
    line = [ln for ln in proc.stderr.splitlines() if "scheduler could not listen" in ln]
    assert line == [f"run_grpo.sh: node 0: msrun's scheduler could not listen on 127.0.0.1:{port} (Address already "
                    "in use): the port is taken, or a second launcher sees --master_addr as its own host (only node "
                    "0's may)"], proc.stderr[-3000:]


@pytest.mark.msrun
@pytest.mark.slow
def test_a_rank_failing_on_one_node_stops_the_other_with_its_error(tmp_path):
    """Node 1's ranks fail at once (its command names a config file that is not there), while node 0's wait to
    build the cluster: node 0's launcher stops its job and prints node 1's failing rank and error."""
    msrun_path()
    missing = str(tmp_path / "no_such.yaml")
    with second_host() as (ns, master, _):
        port, log, out = free_port(), str(tmp_path / "log"), str(tmp_path / "out")
        nodes = [launcher(0, master, port, log, out, []), launcher(1, master, port, log, out, ["--config", missing],
                                                                   ns=ns)]
        try:
            results = [p.communicate(timeout=300) for p in nodes]
        finally:
            for p in nodes:
                if p.poll() is None:
                    p.kill()
            left = wait_until_gone(out, bound_s=20.0)
    (_, err0), (_, err1) = results
    assert nodes[0].returncode == 1 and nodes[1].returncode != 0
    for err in (err0, err1):  # the failing rank's error on both nodes
        assert re.search(r"run_grpo.sh: rank [23] failed \(log .*/node_1/worker_[23].log\)", err), err[-3000:]
        assert missing in err, err[-3000:]
    assert "run_grpo.sh: node 1 (ranks 2-3) failed:" in err0
    assert not left, left
