"""Asynchronous GRPO against the synchronous step on two ranks (docs/async.md): the long-tailed rollout of
benchmarks/rollout.py with training on every step's samples, each side one msrun job of scripts/grpo_one_stage.py
on 2 workers, each worker pinned to one core, side by side in one invocation.

    python -m benchmarks.async_rollout [--steps 16] [--warmup 6] [--batch_size 4] [--group 8] [--max_tokens 256]
        [--model tiny_qwen2] [--runs_dir DIR] [--output benchmarks/results/async_rollout.json]

- sync: generate_config.placement colocated, data parallel 2 (actor and rollout): both ranks generate their half
  of the step's prompts, then both train on their half; rl_config.off_policy_steps 0.
- async: generate_config.placement separate (rank 0 trains, rank 1 generates), rl_config.off_policy_steps 1 and
  generate_config.partial_rollout: the rollout rank generates step s + 1 with the weights of update s - 1 while
  update s trains, and stops once it has the step's groups (the unfinished samples go on in the next step; those
  carried over once, 2 updates stale, train under the default rl_config.max_staleness).
  rl_config.rollout_correction tis_token on both sides (the same loss).

The workload: a random model (`--model`, no warm start) with V / 150 stop ids and temperature 1, so a sample
stops at each token with probability about 1/150 (geometric lengths cut at --max_tokens: a long tail); the built-in
synthetic task's prompts (a random model's samples do not depend on what they say) and its accuracy reward (0 for
a random model's samples: the advantages are 0, the update's work is whole). Both sides the same config but the keys
above. Smaller than benchmarks/rollout.py's 64 prompts x 8 samples of up to 512 tokens, so that a side's steps take
minutes with one core a rank: 4 prompts x 8 of up to 256 by default (tiny_qwen2 has 512 positions).

The figures come from the runs' own logs (metrics.jsonl, written by rank 0), over the steps after --warmup (which
compile). A shape met late still compiles in a timed step (the async side more: a carried sample prefilled again
picks a new prompt-length bucket, a batch of carried samples a new training length): its seconds count, and the
rollout's count is reported. 16 steps with 6 warm-up by default: with 8 and 3 the five timed steps were mostly such
compiles (0.95x and 1.00x on two runs where 16/6 gives 1.39x; benchmarks/results/HISTORY.md). Per side: the
step's seconds (`time/step`), and the idle seconds of each group. Synchronous: the training group idles while the
rollout runs (`time/rollout`, the longest sample's wait included) and the rollout group while the
rest of the step runs (`time/step - time/rollout`). Asynchronous: the rollout rank's seconds waiting in meetings
(`async/wait_seconds`), the training rank's waiting for samples and for the weights' meeting
(`async/train_wait_seconds + sync/seconds`). The mean staleness is `staleness/mean` (updates). With the
matmul rate of MindSpore on this machine (benchmarks/matmul_peak), measured before the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks.harness import REPO, RESULTS, code_version, run_stamp, stamp_lines, write_results

SCRIPT = os.path.join(REPO, "scripts", "grpo_one_stage.py")
SIDES = {
    "sync": ["actor_config.parallel_config.data_parallel=2", "generate_config.parallel_config.data_parallel=2"],
    "async": ["generate_config.placement=separate", "rl_config.off_policy_steps=1",
              "generate_config.partial_rollout=true"],
}
WORKER = "--one_core_rank"  # this file under msrun (not a prefix of msrun's own options: its parser would take it)
GOAL = 1.25  # issue 46: the asynchronous step at least 1.25x faster


def stop_ids(vocab: int, seed: int = 0) -> list:
    """benchmarks/rollout.py's long tail: V / 150 stop ids, drawn the same way."""
    rng = np.random.default_rng(seed)
    return sorted(int(s) for s in rng.choice(np.arange(1, vocab), vocab // 150, replace=False))


def model_vocab(model: str) -> int:
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.presets import resolve_model_config

    return Qwen2Config.load(resolve_model_config(model)).vocab_size


def overrides(args) -> list:
    """The settings both sides share."""
    return ["sft_config={steps: 0}", f"actor_config.model={args.model}", "rl_config.val_interval=0",
            "rl_config.save_interval=0", "rl_config.completions_interval=0", f"rl_config.max_steps={args.steps}",
            f"rl_config.batch_size={args.batch_size}", f"rl_config.num_generations={args.group}",
            f"actor_config.micro_batch_size={args.micro_batch_size}", "rl_config.rollout_correction=tis_token",
            "reward_config.num_workers=0", "generate_config.temperature=1.0",
            f"generate_config.max_tokens={args.max_tokens}",
            f"generate_config.stop_token_ids={stop_ids(model_vocab(args.model))}",
            f"generate_config.max_num_seqs={args.batch_size * args.group}", "--swap", "False"]


def msrun() -> str:
    path = shutil.which("msrun") or os.path.join(os.path.dirname(sys.executable), "msrun")
    if not os.path.exists(path):
        raise SystemExit("async_rollout: msrun is not installed (MindSpore's launcher)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_side(side: str, args, folder: str) -> list:
    """One msrun job of 2 workers (this file with WORKER first: each pins itself to a core, then runs
    grpo_one_stage.py); the rows of its metrics.jsonl."""
    out, logs = os.path.join(folder, side), os.path.join(folder, f"{side}_log")
    cmd = [msrun(), "--worker_num=2", "--local_worker_num=2", "--master_port", str(free_port()), "--log_dir", logs,
           "--join", "True", os.path.abspath(__file__), WORKER, "--use_parallel", "True", "--output_dir", out,
           *overrides(args), *SIDES[side]]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.setdefault("MS_CPU_COMM_OP_TIMEOUT", "600")  # one rank may compile much longer than the other
    os.makedirs(logs, exist_ok=True)
    with open(os.path.join(logs, "msrun.out"), "w") as console:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=console, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tails = []
        for name in sorted(os.listdir(logs)):
            with open(os.path.join(logs, name), errors="replace") as f:
                tails.append(f"--- {name}\n" + "\n".join(f.read().splitlines()[-30:]))
        raise SystemExit(f"async_rollout: the {side} side failed ({rc}):\n" + "\n".join(tails))
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def figures(side: str, rows: list, warmup: int) -> dict:
    """The side's figures over its steps after `warmup` (module docstring), from its metrics.jsonl rows."""
    steps = [r for r in rows if "time/step" in r]
    timed = [r for r in steps if r["step"] > warmup]
    if not timed:
        raise SystemExit(f"async_rollout: the {side} side logged steps {[r['step'] for r in steps]}, none after "
                         f"the {warmup} warm-up step(s)")

    def mean(key_or_fn) -> float:
        fn = key_or_fn if callable(key_or_fn) else (lambda r: r[key_or_fn])
        return float(np.mean([fn(r) for r in timed]))

    out = {"steps": [r["step"] for r in steps], "timed_steps": [r["step"] for r in timed],
           "step_s": mean("time/step"), "step_seconds": [r["time/step"] for r in steps],
           "rollout_tokens": mean("rollout/new_tokens"), "response_length_max": mean("response_length/max"),
           "loss": [r["loss"] for r in steps],
           # the rollout's graphs compiled in the timed steps (a new prompt-length bucket, e.g. a long carried sample
           # prefilled again): their seconds count in the step
           "rollout_graphs_compiled_timed": float(timed[-1].get("rollout/compiled_graphs", 0.0)
                                                  - steps[warmup - 1].get("rollout/compiled_graphs", 0.0))
           if warmup else float(timed[-1].get("rollout/compiled_graphs", 0.0))}
    if side == "sync":
        out["rollout_idle_s"] = mean(lambda r: r["time/step"] - r["time/rollout"])
        out["train_idle_s"] = mean("time/rollout")
        out["staleness_mean"] = 0.0
    else:
        out["rollout_idle_s"] = mean("async/wait_seconds")
        out["train_idle_s"] = mean(lambda r: r["async/train_wait_seconds"] + r["sync/seconds"])
        out["rollout_generate_s"] = mean("async/generate_seconds")
        out["staleness_mean"] = mean("staleness/mean")
        out["staleness_max"] = float(max(r["staleness/max"] for r in timed))
        out["stale_dropped"] = mean("staleness/dropped")  # staler than rl_config.max_staleness: out of the loss
        out["carried_samples"] = mean("partial/carried_samples")
        out["continued_samples"] = mean("partial/continued_samples")
    return out


def markdown(res: dict) -> str:
    s, a = res["sides"]["sync"], res["sides"]["async"]
    lines = ["# Asynchronous GRPO on two ranks: separate placement, one step off-policy, partial rollouts, against "
             "the synchronous colocated step", "", *stamp_lines(res),
             f"{res['model']} (random weights), {res['batch_size']} prompts x G={res['group']} a step, at most "
             f"{res['max_tokens']} tokens a sample, temperature 1, V/150 stop ids (a long tail); 2 msrun workers, "
             f"one core each; {res['steps']} steps a side, the first {res['warmup']} not timed (compiling). MindSpore "
             f"fp32 matmul on this machine: {res['matmul_gflops']['peak']:.0f} GFLOP/s (best of squares 1024, 2048).",
             "", "| side | s per step | rollout group idle (s/step) | training group idle (s/step) | tokens trained a step "
             "| longest sample (tokens) | mean staleness (updates) |", "|---|---|---|---|---|---|---|"]
    for name, r in (("sync (colocated, dp 2)", s), ("async (separate, off_policy_steps 1, partial)", a)):
        lines.append(f"| {name} | {r['step_s']:.2f} | {r['rollout_idle_s']:.2f} | {r['train_idle_s']:.2f} | "
                     f"{r['rollout_tokens']:.0f} | {r['response_length_max']:.0f} | {r['staleness_mean']:.2f} |")
    lines += ["", f"Asynchronous step {res['ratio']:.2f}x faster than the synchronous one (goal, issue 46: "
              f">= {GOAL}x). Idle: synchronous, the training group during the rollout and the rollout group during "
              "the rest of the step; asynchronous, the rollout rank waiting in meetings and the training rank waiting "
              "for the samples and the weights' meeting (module docstring of benchmarks/async_rollout.py). "
              f"Async: {a['carried_samples']:.1f} unfinished samples in flight after a step, {a['stale_dropped']:.1f} "
              "samples a step staler than rl_config.max_staleness (default 2 here: carried over twice) left out of the "
              "loss, on average; rollout "
              f"graphs compiled during the timed steps: sync {s['rollout_graphs_compiled_timed']:.0f}, async "
              f"{a['rollout_graphs_compiled_timed']:.0f} (each a prompt-length bucket met late; its seconds count in "
              "its step).", ""]
    return "\n".join(lines)


def matmul_rate() -> dict:
    import mindspore as ms

    from benchmarks.matmul_peak import SQUARES, matmul_gflops

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    return matmul_gflops("mindspore", SQUARES)


def worker(argv) -> int:
    """Under msrun: this rank on one core (rank mod the cores), then scripts/grpo_one_stage.py with argv."""
    rank = int(os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0")))
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    from scripts import grpo_one_stage

    return grpo_one_stage.main(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [WORKER]:
        return worker(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=6, help="first steps not timed (they compile)")
    ap.add_argument("--batch_size", type=int, default=4, help="prompts a step (even: data parallel 2)")
    ap.add_argument("--group", type=int, default=8, help="samples a prompt (G)")
    ap.add_argument("--micro_batch_size", type=int, default=16, help="rows a training graph call, both sides")
    ap.add_argument("--max_tokens", type=int, default=256)
    ap.add_argument("--model", default="tiny_qwen2", help="a model preset or yaml (random weights)")
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    ap.add_argument("--output", default=os.path.join(RESULTS, "async_rollout.json"))
    ap.add_argument("--runs_dir", default=None, help="keep the runs (SIDE/metrics.jsonl, SIDE_log/) here; default: "
                    "a temporary folder, removed")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must be more than --warmup {args.warmup}")
    if (args.batch_size * args.group) % (2 * args.micro_batch_size):
        ap.error(f"--micro_batch_size {args.micro_batch_size} x 2 replicas (the sync side) must divide the "
                 f"{args.batch_size * args.group} samples of a step")
    res = dict(run_stamp("benchmarks.async_rollout", argv), code=code_version(), steps=args.steps,
               warmup=args.warmup, batch_size=args.batch_size, group=args.group, max_tokens=args.max_tokens,
               model=args.model, matmul_gflops=matmul_rate(), sides={})
    with tempfile.TemporaryDirectory(prefix="async_rollout_") as temporary:
        folder = args.runs_dir or temporary
        for side in args.sides:
            res["sides"][side] = figures(side, run_side(side, args, folder), args.warmup)
            print(json.dumps({side: {k: v for k, v in res["sides"][side].items() if not isinstance(v, list)}}),
                  flush=True)
    if set(res["sides"]) == set(SIDES):
        s, a = res["sides"]["sync"], res["sides"]["async"]
        res.update(sync_step_s=s["step_s"], async_step_s=a["step_s"], ratio=s["step_s"] / a["step_s"],
                   idle_s={"sync": {"rollout": s["rollout_idle_s"], "train": s["train_idle_s"]},
                           "async": {"rollout": a["rollout_idle_s"], "train": a["train_idle_s"]}},
                   staleness_mean=a["staleness_mean"], goal=GOAL)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(args.output, res, markdown(res) if "ratio" in res else None)
    return 0


if __name__ == "__main__":
    if os.path.dirname(os.path.dirname(os.path.abspath(__file__))) not in sys.path:  # msrun runs this file
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
