"""generate_config.placement separate (mindgrpo/parallel/separate.py, mindgrpo/grpo/rollout_worker.py): one msrun
job of two ranks (rank 0 trains, rank 1 generates) runs scripts/grpo_one_stage.py three times, with off_policy_steps
0, 1, and 1 with partial rollouts; one process runs the colocated peers of the three (tests/parallel/workers/
one_stage_runs.py: sep0, sep1, sep1p, col0, col1, col1p); sep1 and col1 also score with a reward model (on the
training rank). Step for step the separate runs give their peers' samples
(completions.jsonl: every sample's text and reward), losses within 1e-6 and staleness (the sampling versions); the
partial runs carry the same groups and samples; the separate runs log both ranks' figures. sep0 and col0 warm-start
first (the rollout rank receives the warm-started weights); sep0 and sep1 validate on the rollout rank at steps 0 and
3 (greedy; sep1 sampling) with their peers' figures (workers/separate_rewards.py: a score that differs by answer).
sep2 runs two steps off-policy for five steps (the rollout rank up to two steps ahead) against col2 in one process,
and sep2r, col2r each resume from their step-2 checkpoint. The same job then runs the last step of sep0 and sep1
again, resumed from their step-2 checkpoints (sep0r, sep1r):
it trains the straight run's prompts (off_policy_steps 0: its samples and loss too). Before it a job of its own runs
sep1p's config until its training rank kills itself with SIGKILL right after the step-1 checkpoint (sepk), and the
main job resumes it in its folder (sepkr, --resume): the groups in flight at the checkpoint are generated again, no
prompt lost, none twice. sep0t and its peer col0t
call tools (the micro model of tests/grpo/tool_caller.py, which ends turns with a tool call): the rollout rank runs the
conversations, the training rank trains the model's own tokens (the model masks) and rewards the tools' answers. sep0l (LoRA rank 4,
beta > 0, a warm start, stopped after step 2 and resumed) and sep1l (LoRA, off_policy_steps 1) against their peers
col0l, col1l: each update's meeting moves the adapters (sep1l and col1l are in workers/one_stage_runs.py, not in
the job: the same meetings). A job of three ranks (one training rank, a rollout group of two, each generating half of
every step's groups and of the validation's prompts) runs sep0d (sep0, stopped after step 2 and resumed: the start
meeting reaches both rollout ranks) and sep1d (sep1): their peers are col0 and col1, step for step. The same job runs
sep0g (sep0d's schedule with a training group of two data-parallel ranks and one rollout rank: both training ranks warm
start, train their halves, resume from the checkpoint rank 0 wrote) against col0, sep0gl (sep0l on that training
group: LoRA's adapters summed, synced and resumed) against col0l, sep1g (sep1 on it: training rank 0 scores with the
reward model for both) against col1, sep1pg (sep1p on it, stopped after step 1 and resumed: both training ranks keep
the prompts in flight, rank 0 writes them) against col1p and sepk, sep0gt (sep0t on it: both training ranks receive
the conversations' values) against col0t, and sep0dt (sep0t on the rollout group of two, each rank running its half of
the prompts' conversations on its own tool workers) against col0t, sep1pd (sep1p on the rollout group of two, each
replica keeping its own groups in flight, stopped after step 1 and resumed) against the data's order (col0s), and
sep0tp, sep1tp, sep1ptp (sep0, sep1, sep1p with one training
rank beside a rollout replica of two tensor-parallel pieces: each rollout rank keeps its piece of the whole weights the
meeting brings, the first of the pair hands the samples over; with partial rollouts both keep the same groups in
flight) against col0, col1, col1p; sep0tpg (sep0g's schedule on a training
replica of two tensor-parallel pieces beside one rollout rank, resumed from its sharded checkpoint) against col0, and
sep0ppg (the same on two pipeline stages, the untied micro model) against col0u.
sep0e and its peer col0e play an environment (guess_number) with dynamic sampling: the rollout rank writes the prompts
(its resets), plays the games and decides each step's further rollouts, rank 0 rewards them and follows; sep1ed (in the
job of three ranks: the same one step off-policy on a rollout group of two, deciding each step's rollouts a step ahead)
against col1e; sep1pt (partial rollouts with tool calls: the rollout rank carries the conversations) against col1pt, and
sep1pen (partial rollouts with sep0e's environment: the rollout rank carries the games) against col1pen, and sep1penr
(sep1pen stopped after step 1 and resumed: the games in flight reset again). The main job also runs dp0t, col0t's config
colocated (no separate placement) on two data-parallel replicas that train and generate, each running the conversations
of its half of the prompts on its own tool workers: col0t's samples, losses and tool metrics."""

import json
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import safetensors.numpy
import yaml

from grpo.fakes import one_layer_micro, save_judge, save_reward_model  # tests/ is on the path (pyproject.toml)
from grpo.tool_caller import tool_calling_micro
from msrun_util import REPO, WORKERS, run_msrun

STEPS = 3
# the micro model with one decoder layer (tests/grpo/fakes.one_layer_micro), batch 2 x 4 samples, a dense reward
CONFIG = ["rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=8",
          "generate_config.max_tokens=8", "generate_config.max_prompt_length=32", "generate_config.max_num_seqs=8",
          "synthetic_config.template=raw", "actor_config.lr=1e-2", "rl_config.val_interval=0",
          "rl_config.completions_interval=1", f"rl_config.max_steps={STEPS}", "reward_config.num_workers=0",
          f"reward_config.reward_plugin={os.path.join(WORKERS, 'separate_rewards.py')}",
          "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]",
          "rl_config.rollout_correction=tis_token", "rl_config.memory=speed", "sft_config={steps: 0}", "--swap", "False"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("separate")
    model = one_layer_micro(out)
    save_reward_model(str(out / "rm"), model)  # sep1 and col1 score with it and ask the judge (workers/one_stage_runs.py)
    save_judge(str(out / "judge"), model)
    shared = [*CONFIG, f"actor_config.model={model}"]
    # sep0t and col0t load it (workers/one_stage_runs.py: TOOLS, whose tools and chat template make the tokenizer)
    tool_calling_micro(str(out / "tool_caller"), shared + [
        "generate_config.tools=[calculator]",
        "generate_config.chat_template=model_configs/qwen_grpo/tiny_tools/tokenizer_config.json"])
    # sepk: sep1p whose rank 0 is killed (SIGKILL) right after its step-1 checkpoint: msrun ends rank 1, the job
    # fails (MS_NODE_TIMEOUT: msrun's scheduler gives up on the killed ranks after 10 s, not 30)
    run_msrun("one_stage_runs.py", 2, str(out / "kill"), args=[str(out), "sepk", *shared], timeout=600,
              fails=True, env={"MS_NODE_TIMEOUT": "10"})
    with open(out / "sepk_killed.json", "w") as f:  # what the kill left, before sepkr resumes it in its folder
        json.dump({"steps": [m["step"] for m in metrics(out / "sepk")],
                   "checkpoints": sorted(os.listdir(out / "sepk" / "checkpoints")),
                   "msrun": open(out / "kill" / "msrun.out").read()[-20000:]}, f)
    run_msrun("one_stage_runs.py", 2, str(out / "log"),
              args=[str(out), "sep0,sep1,sep1p,sep0r,sep1r,sep0t,dp0t,sepkr,sep0l,sep2,sep2r,sep0e,sep1pt,sep1pe,"
                    "sep1pen,sep1penr", *shared],
              timeout=2400)
    # a rollout group of two ranks (generate_config.parallel_config.data_parallel 2), a training group of two
    # (sep0g, sep0gl, sep1g, sep0gt: actor_config.parallel_config.data_parallel 2) beside one rollout rank, and one
    # training rank beside a rollout replica of two tensor-parallel pieces (sep0tp, sep1tp, sep1ptp): world 3
    run_msrun("one_stage_runs.py", 3, str(out / "replicas"),
              args=[str(out), "sep0d,sep1d,sep0g,sep0dt,sep0gl,sep1g,sep0gt,sep0tp,sep1tp,sep1ptp,sep0tpg,sep0ppg,sep0gz,"
                    "sep0tpl,sep0tpgl,sep0ppgl,sep1pg,sep1pd,sep1ed,sep1pde",
                    *shared],
              timeout=2400)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests", "parallel"),
                                                       os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, os.path.join(WORKERS, "one_stage_runs.py"), str(out),
                        "col0,col1,col1p,col0t,col0l,col2,col2r,col0e,col1e,col0u,col0lu,col0s,col1pt,col1pe,col1pen",
                        *shared],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=2400)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def metrics(folder):
    return [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))]


def same_steps(ms, mc, keys=("reward_mean",), label=None) -> None:
    """Two runs' metrics, step by step: `keys` equal, the loss within 1e-6, the gradient norm within rel 1e-5."""
    for a, b in zip(ms, mc):
        where = a["step"] if label is None else (label, a["step"])
        assert [a[k] for k in keys] == [b[k] for k in keys], where
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6), where
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5), where


def prompts(steps):
    """Every trained prompt of the given steps (of `samples`: G = 4 rows a prompt), as a sorted multiset."""
    return sorted(row[0] for step in steps for row in step[::4])


def samples(folder, fields=("completion", "reward"), steps=STEPS):
    """Per step, every sample's (text, reward) (or other fields of completions.jsonl) in order."""
    rows = [json.loads(line) for line in open(os.path.join(folder, "completions.jsonl"))]
    return [[tuple(r[k] for k in fields) for r in rows if r["step"] == s] for s in range(1, steps + 1)]


@pytest.mark.slow  # an msrun job of two grpo_one_stage.py runs and one process of two more: minutes of compiling
@pytest.mark.parametrize("run", ["0", "1", "1p", "0d", "1d", "0g", "1g", "0tp", "1tp", "1ptp", "0gz"])
def test_separate_placement_equals_the_colocated_run_step_for_step(runs, run):
    """0d, 1d: a rollout group of two ranks; 0g, 1g: a training group of two data-parallel ranks (each trains half of
    a mini-batch, the gradients summed over the two) beside one rollout rank, 1g's reward model scored on training
    rank 0 for both; 0tp, 1tp, 1ptp: one rollout replica of two tensor-parallel pieces (its layers' partial products
    summed over the pair: the rollout log-probs, which tis_token weighs, within about 1e-7 of one process's; 1ptp with
    partial rollouts, both pieces keeping the same groups in flight); the same peers (col0, col1, col1p) as one rollout
    rank's; 0gz: 0g with AdamW's moments split over the two training ranks (ZeRO-1),
    its checkpoints each rank's pieces, read back on the resume. The losses within the tolerance of a colocated
    data-parallel update against one process (tests/parallel/test_msrun.py: abs 1e-6, grad_norm rel 1e-5)."""
    suffix = next(end for end in ("tp", "gz", "d", "g", "") if run.endswith(end))
    group, trainers, pieces = suffix == "d", suffix in ("g", "gz"), suffix == "tp"
    run = run[:-len(suffix)] if suffix else run
    sep, col = runs / f"sep{run}{suffix}", runs / f"col{run}"
    if suffix == "gz":  # each training rank wrote its pieces (its half of the moments), the rollout rank none
        assert sorted(os.listdir(sep / "checkpoints" / "step_00000002" / "policy")) == ["rank_0", "rank_1"]
    rows_s, rows_c = metrics(sep), metrics(col)  # with validation, a row at step 0 (before the first update)
    ms, mc = [m for m in rows_s if m["step"]], [m for m in rows_c if m["step"]]
    assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    got, want = samples(sep), samples(col)
    assert all(len(step) == 8 for step in want)  # batch 2 x 4 samples, all logged
    assert got == want
    same_steps(ms, mc)
    if run == "1":
        assert [m["staleness/mean"] for m in ms] == [m["staleness/mean"] for m in mc] == [0.0, 1.0, 1.0]
        # the reward model and the judge scored on the training rank (1g: rank 0, for both) as in one process, and
        # the reward model's scores differ between samples
        keys = ("reward/rm/mean", "reward/rm/std", "reward/critic/mean", "reward/critic/none", "reward/total/mean")
        assert [[repr(m[k]) for k in keys] for m in ms] == [[repr(m[k]) for k in keys] for m in mc]  # NaN: no score
        assert all(m["reward/rm/std"] > 0 and m["reward/rm/none"] == 0 for m in ms)
        # the judge's answers, logged with the completions (by training rank 0), are one process's
        answers = samples(sep, ("judge/critic",))
        assert answers == samples(col, ("judge/critic",)) and all(len(step) == 8 for step in answers)
        assert len({a for step in answers for a in step}) > 1
    if run == "0":  # the warm start moved the weights rank 1 samples with: sep1 samples step 1 without it (same seeds)
        assert samples(runs / f"sep1{suffix if group or pieces else ''}")[0] != got[0]
    if pieces:  # each rollout rank held its piece (half the KV heads: half the cache), the meeting moved whole weights
        assert [m["rollout/kv_bytes"] for m in ms] == [m["rollout/kv_bytes"] / 2 for m in mc]
        assert [m["sync/bytes"] for m in ms] == [m["sync/bytes"] for m in metrics(runs / f"sep{run}") if m["step"]]
    # two training ranks: after each update (the last included) rank 1's weights are rank 0's, bit for bit (each
    # weights meeting compares them); one training rank: no such figure
    assert [m.get("sync/train_weights_max_diff") for m in ms] == ([0.0] * STEPS if trainers else [None] * STEPS)
    if run != "1p":  # validation: the rollout rank's answers (one update behind with k = 1) scored on rank 0
        def validations(rows):
            return [(m["step"], m["val/accuracy"], m.get("val/policy_version")) for m in rows if "val/accuracy" in m]

        val = validations(rows_s)
        assert val == validations(rows_c)
        assert [v[0] for v in val] == [0, STEPS] and val[0][1] != val[1][1] and val[0][1] > 0
        assert [v[2] for v in val] == ([None, None] if run == "0" else [0.0, STEPS - 1.0])
    if run == "1p":  # the sampling versions of every token (a carried sample's oldest) and the groups in flight
        keys = ("staleness/mean", "staleness/max", "staleness/dropped", "partial/carried_groups",
                "partial/carried_samples", "partial/continued_samples")
        assert [[m[k] for k in keys] for m in ms] == [[m[k] for k in keys] for m in mc]
        # samples were carried half done into a later step and went on there with newer weights
        assert sum(m["partial/continued_samples"] for m in ms) > 0 and max(m["staleness/max"] for m in ms) >= 1
    # the later steps' samples differ from the first's weights: the sync carried new weights each step
    assert got[1] != got[0] and got[2] != got[1]
    # both ranks' figures: the rollout rank's generating and waiting, the training rank's waiting, the sync
    for m in ms:
        assert m["async/generate_seconds"] > 0 and m["async/wait_seconds"] >= 0 and m["async/train_wait_seconds"] > 0
        assert m["sync/bytes"] > 0 and m["rollout/tokens_per_s"] > 0
        assert m["async/wait_seconds_sum"] >= m["async/wait_seconds"]
    if group:  # each rollout rank's throughput and idle seconds; the group's: the slowest rank's seconds, all tokens
        for m in ms:
            rates = [m[f"async/rollout{i}/tokens_per_s"] for i in range(2)]
            idle = [m[f"async/rollout{i}/wait_seconds"] for i in range(2)]
            assert min(rates) > 0 and m["rollout/tokens_per_s"] <= sum(rates) + 1e-6
            assert m["async/wait_seconds"] == max(idle) and m["async/wait_seconds_sum"] == pytest.approx(sum(idle))
            assert "async/rollout2/tokens_per_s" not in m
    else:
        assert not any(k.startswith("async/rollout") for m in ms for k in m)  # one rollout rank: no per-rank figures


def whole_model_bytes(model_yaml) -> int:
    """fp32 bytes of every parameter of the model at `model_yaml`."""
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.convert import expected_shapes

    return 4 * sum(int(np.prod(shape)) for shape in expected_shapes(Qwen2Config.load(str(model_yaml))).values())


@pytest.mark.slow  # the same msrun job
@pytest.mark.parametrize("run, peer, model", [("sep0tpg", "col0", "micro_one_layer.yaml"),
                                              ("sep0ppg", "col0u", os.path.join(WORKERS, "micro_untied.yaml"))])
def test_a_training_replica_in_pieces_equals_the_colocated_run_and_resumes_from_its_shards(runs, run, peer, model):
    """One training replica of two ranks beside one rollout rank, sep0's schedule (a warm start, validation), stopped
    after step 2 and resumed for step 3. sep0tpg: two tensor-parallel pieces; sep0ppg: two pipeline stages (the untied
    micro model of three layers: two and one). Each weights meeting sums the pieces (stages) in their places into the
    whole weights the rollout rank samples with, and both training ranks read back the sharded checkpoint they wrote
    (a colocated run's: rank_0/, rank_1/ and the strategy file). The peer's samples, rewards and validation in one
    process; the losses within a colocated tp update's tolerance against one process (the pieces' partial products
    summed over the pair: tests/parallel/test_msrun.py, abs 1e-6, grad_norm rel 1e-5)."""
    sep, col = runs / run, runs / peer
    rows_s, rows_c = metrics(sep), metrics(col)
    ms, mc = [m for m in rows_s if m["step"]], [m for m in rows_c if m["step"]]
    assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    got, want = samples(sep), samples(col)
    assert all(len(step) == 8 for step in want) and got == want
    assert got[1] != got[0] and got[2] != got[1]  # each update's whole weights reached the rollout rank
    same_steps(ms, mc)
    for a in ms:
        assert a["sync/bytes"] == whole_model_bytes(runs / model)  # the whole model's, made of the pieces
        assert "sync/train_weights_max_diff" not in a  # one replica: nothing to compare

    def validations(rows):
        return [(m["step"], m["val/accuracy"]) for m in rows if "val/accuracy" in m]

    assert validations(rows_s) == validations(rows_c) and [v[0] for v in validations(rows_s)] == [0, STEPS]
    step2 = sep / "checkpoints" / "step_00000002"  # the colocated tp run's sharded layout, one folder a rank
    groups = [p for p in step2.iterdir() if p.is_dir()]  # the policy, its moments (each a folder of rank pieces)
    assert groups and all(sorted(q.name for q in p.iterdir()) == ["rank_0", "rank_1"] for p in groups)
    assert (step2 / "train_strategy.ckpt").is_file()


@pytest.mark.slow  # the same msrun job
# sep2p, col2p (partial rollouts with off_policy_steps 2, workers/one_stage_runs.py) give the same samples, losses,
# staleness and partial/ figures too, 2 x 75 s of CI: not in the job (sep2's queue, sep1p's groups in flight)
def test_two_steps_off_policy_under_a_separate_placement_equals_the_one_process_run_step_for_step(runs):
    """sep2: off_policy_steps 2 over five steps (the rollout rank up to two steps ahead: steps 1-3 sample with the
    first weights, step 4 with update 1's, step 5 with update 2's; the validation after update 3 with update 1's),
    against col2, the same in one process (the trainer's LaggedSync); sep2r, col2r: each resumed from its step-2
    checkpoint, the lag starting again from the restored weights (steps 3-5 sample with update 2's)."""
    steps = 5
    for sep, col, first in (("sep2", "col2", 1), ("sep2r", "col2r", 3)):
        rows_s, rows_c = metrics(runs / sep), metrics(runs / col)
        ms, mc = [m for m in rows_s if m["step"]], [m for m in rows_c if m["step"]]
        assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(first, steps + 1))
        got, want = samples(runs / sep, ("prompt", "completion", "reward"), steps), \
            samples(runs / col, ("prompt", "completion", "reward"), steps)
        assert [len(step) for step in want] == [0] * (first - 1) + [8] * (steps + 1 - first) and got == want
        same_steps(ms, mc, label=sep)
        # the staleness: steps 1-3 sample with the first weights (0, 1, 2 updates old), then two updates behind;
        # resumed, the lag restarts from the restored update 2
        keys = ("staleness/mean", "staleness/max", "staleness/dropped")
        assert [[m[k] for k in keys] for m in ms] == [[m[k] for k in keys] for m in mc] == \
            [[float(min(s - first, 2)), float(min(s - first, 2)), 0.0] for s in range(first, steps + 1)]
        if sep == "sep2":  # validation at step 0 and after update 3 (with update 1's weights: two behind)
            def validations(rows):
                return [(m["step"], m["val/accuracy"], m.get("val/policy_version")) for m in rows
                        if "val/accuracy" in m]

            assert validations(rows_s) == validations(rows_c)
            assert [(v[0], v[2]) for v in validations(rows_s)] == [(0, 0.0), (3, 1.0)]
    # the resumed run trains the straight run's prompts (none lost, none twice), sampled with fresher weights
    straight, resumed = samples(runs / "sep2", ("prompt", "completion"), steps), \
        samples(runs / "sep2r", ("prompt", "completion"), steps)
    assert all(p for p in prompts(straight)) and prompts(resumed[2:]) == prompts(straight[2:])
    assert [r[0] for step in resumed[2:] for r in step] == [r[0] for step in straight[2:] for r in step]
    assert [r[1] for r in resumed[2]] != [r[1] for r in straight[2]]


@pytest.mark.slow  # the same msrun job
def test_the_rollout_ranks_first_step_line_says_what_it_compiled(runs):
    """The rollout rank logs a line per step handed over; the first says what the rank compiled for it (its engine's
    graphs, the weights meeting's: utils/compiles.py), as the training rank's progress line does."""
    lines = [line for line in open(runs / "sep0" / "logs" / "rank_1.log") if "rollout rank: step " in line]
    assert [line.split("rollout rank: step ")[1].split()[0] for line in lines] == [str(s) for s in range(1, STEPS + 1)]
    graphs = re.search(r"; compiled (\d+) graphs in \d+\.\ds$", lines[0].rstrip())  # compiled_text's words
    assert graphs is not None and int(graphs.group(1)) >= 2, lines[0]


@pytest.mark.slow  # the same msrun job
@pytest.mark.parametrize("lag", [0, 1])
def test_a_resumed_separate_run_trains_the_prompts_of_the_straight_run(runs, lag):
    """The last step again from the checkpoint of step 2 (--resume_from): the rollout rank draws from the restored
    position (the training rank checks its prompts every step), with the restored weights."""
    sep, res = runs / f"sep{lag}", runs / f"sep{lag}r"
    m = metrics(res)
    assert [r["step"] for r in m] == [STEPS]
    fields = ("prompt", "completion", "reward")
    straight, resumed = samples(sep, fields), samples(res, fields)
    assert resumed[:STEPS - 1] == [[]] * (STEPS - 1) and len(resumed[-1]) == 8
    # steps 1-2 of the straight run then the resumed step: the straight run's prompts, none lost, none twice
    assert [r[0] for r in resumed[-1]] == [r[0] for r in straight[-1]]
    if lag == 0:  # the same weights sample: the same samples and loss
        assert resumed[-1] == straight[-1]
        assert m[0]["loss"] == pytest.approx(metrics(sep)[-1]["loss"], abs=1e-6)
    else:  # the lag starts again from the restored weights: step 3 samples with update 2's, not update 1's
        assert m[0]["staleness/mean"] == 0.0 and metrics(sep)[-1]["staleness/mean"] == 1.0
        assert [r[1:] for r in resumed[-1]] != [r[1:] for r in straight[-1]]


@pytest.mark.slow  # the same msrun jobs
def test_a_separate_run_killed_after_a_checkpoint_resumes_without_losing_or_repeating_a_prompt(runs):
    """sepk (sep1p's config) had its training rank killed with SIGKILL right after the checkpoint of step 1 (the
    rollout rank, one step ahead, had generated step 2's samples: lost with it); --resume in its folder (sepkr)
    trains steps 2-3. The checkpoint holds the prompts in flight (in_flight.json, without samples: those were the
    rollout rank's); the rollout rank draws them again by their draw numbers and generates them from scratch with the
    restored weights, before any fresh prompt: the prompts of the uninterrupted sep1p's three steps, none lost, none
    twice."""
    with open(runs / "sepk_killed.json") as f:
        killed = json.load(f)
    assert killed["steps"] == [1] and "Error code: -9" in killed["msrun"]  # SIGKILL, after step 1 was logged
    assert [d for d in killed["checkpoints"] if d.startswith("step_")] == ["step_00000001"]
    with open(runs / "sepk" / "checkpoints" / "step_00000001" / "in_flight.json") as f:
        in_flight = json.load(f)["groups"]
    assert in_flight and all(g["samples"] == [] for g in in_flight)
    straight, chaos = samples(runs / "sep1p", ("prompt", "completion")), samples(runs / "sepk", ("prompt",
                                                                                                "completion"))
    m = metrics(runs / "sepk")
    assert [r["step"] for r in m] == list(range(1, STEPS + 1))
    assert chaos[0] == straight[0] and [len(step) for step in chaos] == [8] * STEPS  # the same run up to the kill
    assert all(p for p in prompts(straight))  # the texts are logged: the comparison below compares something
    assert prompts(chaos) == prompts(straight)
    # the groups in flight went first, every sample generated again whole with the restored weights (update 1)
    assert sorted(g["columns"]["prompt"] for g in in_flight) == prompts(chaos[1:2])
    assert m[1]["partial/continued_samples"] == 4 * len(in_flight) and m[1]["staleness/max"] == 0.0


@pytest.mark.slow  # the same msrun jobs
def test_partial_rollouts_on_a_training_group_of_two_resume_as_on_one_training_rank(runs):
    """sep1pg: sep1p's config (partial rollouts, off_policy_steps 1) on two data-parallel training ranks beside one
    rollout rank, stopped after step 1 and resumed (--resume) for steps 2-3. The samples meeting gives every training
    rank every group, so each keeps the same prompts in flight (the same draws); rank 0 writes them once into the
    step-1 checkpoint and both read them back. Step 1 is col1p's (one process); steps 2-3 are those of sepk + sepkr,
    the same stop and resume on one training rank: the same samples, staleness and groups in flight, the losses
    within a data-parallel update's tolerance; and over the run the prompts of the uninterrupted col1p, none lost,
    none twice."""
    run, peer, col = runs / "sep1pg", runs / "sepk", runs / "col1p"
    ms, mk, mc = metrics(run), metrics(peer), metrics(col)
    assert [m["step"] for m in ms] == [m["step"] for m in mk] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    # the checkpoint the resume read: the prompts in flight at step 1 (no samples), those of one training rank's run
    folder = os.path.join("checkpoints", "step_00000001", "in_flight.json")
    with open(run / folder) as f, open(peer / folder) as g:
        in_flight, single = json.load(f), json.load(g)
    assert in_flight["groups"] and all(g["samples"] == [] for g in in_flight["groups"]) and in_flight == single
    fields = ("prompt", "completion", "reward")
    got, want, straight = samples(run, fields), samples(peer, fields), samples(col, fields)
    assert all(len(step) == 8 for step in got) and got == want
    assert got[0] == straight[0] and all(p for p in prompts(straight)) and prompts(got) == prompts(straight)
    keys = ("staleness/mean", "staleness/max", "staleness/dropped", "partial/carried_groups",
            "partial/carried_samples", "partial/continued_samples", "reward_mean")
    for a, b in zip(ms, mk):
        assert [a[k] for k in keys] == [b[k] for k in keys], a["step"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"],
                                                                                                   rel=1e-5)
    assert ms[0]["loss"] == pytest.approx(mc[0]["loss"], abs=1e-6)
    # the resumed step generated the groups in flight again, whole; training rank 1's weights are rank 0's throughout
    assert ms[1]["partial/continued_samples"] == 4 * len(in_flight["groups"])
    assert [m["sync/train_weights_max_diff"] for m in ms] == [0.0] * STEPS


@pytest.mark.slow  # the same msrun jobs
def test_partial_rollouts_on_two_rollout_replicas_train_every_drawn_prompt_once(runs):
    """sep1pd: sep1p's config on one training rank beside two rollout replicas, each keeping its own groups in flight
    and handing over its share of each step's groups (one each), stopped after step 1 and resumed (--resume) for
    steps 2-3 (each replica redraws its share of the prompts in flight). No one-process run draws the same groups
    (each replica stops its call at its own complete groups), so the test checks what must hold, from the files:
    every step trains batch_size complete groups; the prompts trained over the run and those still in flight at its
    end are the first prompts of the data (col0s: one process's six steps of two, in the data's order), as many as
    were drawn: none lost, none twice; every sample within the staleness bound (off_policy_steps + 1: a continuation
    runs to its end, so a sample is carried once at most)."""
    run = runs / "sep1pd"
    ms = metrics(run)
    assert [m["step"] for m in ms] == list(range(1, STEPS + 1))
    trained = samples(run, ("prompt", "completion"))
    assert all(len(step) == 8 and step[0][0] != step[4][0] and len({r[0] for r in step[:4]}) == 1
               and len({r[0] for r in step[4:]}) == 1 for step in trained)  # 2 groups of 4 samples a step
    data = [row[0] for step in samples(runs / "col0s", ("prompt",), steps=6) for row in step[::4]]
    assert len(data) == 12 and all(data)
    folder = run / "checkpoints"
    with open(folder / "step_00000001" / "in_flight.json") as f, open(folder / "step_00000003" / "in_flight.json") as g:
        first, last = json.load(f), json.load(g)
    assert first["groups"] and first["drawn"] < last["drawn"] <= len(data)
    kept = [g["columns"]["prompt"] for g in last["groups"]]
    assert sorted(prompts(trained) + kept) == sorted(data[:last["drawn"]])
    # the resumed step generated the groups in flight at step 1 again, whole (both replicas' shares of them)
    assert ms[1]["partial/continued_samples"] == 4 * len(first["groups"])
    assert not Counter(g["columns"]["prompt"] for g in first["groups"]) - Counter(prompts(trained[1:]) + kept)
    for m in ms:
        assert m["staleness/max"] <= 2 and m["staleness/dropped"] == 0, m["step"]
        assert min(m[f"async/rollout{i}/tokens_per_s"] for i in range(2)) > 0  # both replicas generated


@pytest.mark.slow  # the same msrun jobs
def test_dynamic_sampling_with_partial_rollouts_equals_the_colocated_run(runs):
    """sep1pe: dynamic sampling with partial rollouts, one step off-policy, one training rank and one rollout rank, the
    coarse reward test_length_mod3 (some groups' four samples score the same). The rollout rank runs each step's
    rounds when it generates it, a step ahead: each round a partial rollout of the groups still needed, its complete
    groups scored with the rule rewards, those without a spread dropped, and hands over every round with the count of
    the next; rank 0 follows it and takes each round's groups by their draw numbers. The same samples, rewards,
    rounds, kept groups, staleness and partial/ figures as col1pe in one process step for step, the losses within
    1e-6."""
    sep, col = runs / "sep1pe", runs / "col1pe"
    ms, mc = metrics(sep), metrics(col)
    assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    fields = ("prompt", "completion", "reward")
    got = samples(sep, fields)
    assert got == samples(col, fields) and all(len(step) == 8 for step in got)
    keys = ("reward_mean", "dynamic_sampling/rounds", "dynamic_sampling/kept_groups", "staleness/mean",
            "staleness/max", "staleness/dropped", "partial/carried_groups", "partial/carried_samples",
            "partial/continued_samples")
    same_steps(ms, mc, keys)
    # a step drew prompts again, samples were carried into a later step and went on there
    assert max(m["dynamic_sampling/rounds"] for m in ms) > 1
    assert sum(m["partial/continued_samples"] for m in ms) > 0
    for m, step in zip(ms, got):  # the kept groups (first in the batch) have a spread of rewards
        kept = int(m["dynamic_sampling/kept_groups"])
        assert kept == 2 and all(len({r for _, _, r in step[4 * g:4 * g + 4]}) > 1 for g in range(kept)), m["step"]


@pytest.mark.slow  # the same msrun jobs
def test_dynamic_sampling_with_partial_rollouts_on_two_rollout_replicas_resumes_without_losing_prompts(runs):
    """sep1pde: sep1pe's settings on one training rank beside two rollout replicas (each its share of every round's
    groups, their counts of groups with a spread summed), stopped after step 1 and resumed for steps 2-3. From the
    files: every step trains batch_size groups with a spread; the prompts trained over the run and those in flight at
    its end are among the data's first prompts as drawn (col0s: the data's order), none twice, fewer than were drawn
    (the prompts not trained nor in flight: the dropped groups', spent; which ones the files do not say); the resumed
    step generated the groups in flight at the stop again, whole."""
    run = runs / "sep1pde"
    ms = metrics(run)
    assert [m["step"] for m in ms] == list(range(1, STEPS + 1))
    trained = samples(run, ("prompt", "completion", "reward"))
    for m, step in zip(ms, trained):
        assert len(step) == 8 and m["dynamic_sampling/kept_groups"] == 2, m["step"]
        assert all(len({r[0] for r in step[4 * g:4 * g + 4]}) == 1 and len({r[2] for r in step[4 * g:4 * g + 4]}) > 1
                   for g in range(2)), m["step"]
    assert max(m["dynamic_sampling/rounds"] for m in ms) > 1
    data = [row[0] for step in samples(runs / "col0s", ("prompt",), steps=6) for row in step[::4]]
    folder = run / "checkpoints"
    with open(folder / "step_00000001" / "in_flight.json") as f, open(folder / "step_00000003" / "in_flight.json") as g:
        first, last = json.load(f), json.load(g)
    assert first["groups"] and first["drawn"] < last["drawn"] <= len(data)
    kept = [g["columns"]["prompt"] for g in last["groups"]]
    seen = prompts(trained) + kept
    assert len(set(seen)) == len(seen) and set(seen) <= set(data[:last["drawn"]])
    # the step that drew prompts again spent some: drawn, neither trained nor in flight
    assert len(seen) < last["drawn"]
    assert ms[1]["partial/continued_samples"] == 4 * len(first["groups"])  # generated again, whole, after the resume


def adapter_bytes(model_yaml: str, rank: int) -> int:
    """fp32 bytes of LoRA rank `rank` on the seven projections of every layer: A (r, in) and B (out, r) each."""
    c = yaml.safe_load(open(model_yaml))
    h, inter, nh, nkv = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = h // nh
    # (in, out): q, k, v, o, gate, up, down
    shapes = [(h, nh * d), (h, nkv * d), (h, nkv * d), (nh * d, h), (h, inter), (h, inter), (inter, h)]
    return c["num_hidden_layers"] * sum(rank * (i + o) for i, o in shapes) * 4


@pytest.mark.slow  # the same msrun jobs
@pytest.mark.parametrize("run", ["sep0t", "sep0dt", "sep0gt"])
def test_tool_calls_with_the_separate_placement_equal_the_colocated_run(runs, run):
    """The rollout rank runs the conversations; rank 0 gets the same trajectories, trains the same tokens (the model
    masks: the gradient's norm moves with them), rewards the same tool answers and logs the same tool/ and turns/
    metrics as the colocated run. sep0dt: two rollout ranks, each running its half of the prompts' conversations on
    its own tool workers, rank 0 merging their values (counts summed, means over the whole batch: the masked fraction
    of a merge within rounding). sep0gt: two training ranks beside one rollout rank, each receiving the conversations'
    values and training its half of the samples."""
    sep, col = runs / run, runs / "col0t"
    ms, mc = metrics(sep), metrics(col)
    assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    assert samples(sep) == samples(col)
    keys = ("tool/calls_mean", "tool/errors", "tool/timeouts", "tool/samples_with_calls", "turns/mean", "turns/cut",
            "reward_mean")
    for a, b in zip(ms, mc):
        assert [a[k] for k in keys] == [b[k] for k in keys], a["step"]
        assert a["turns/masked_fraction"] == (b["turns/masked_fraction"] if run != "sep0dt" else
                                              pytest.approx(b["turns/masked_fraction"], rel=1e-12)), a["step"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"],
                                                                                                   rel=1e-5)
    # conversations happened: tool turns in the trajectories (context, not trained), answered with errors (the calls
    # close a call they never opened), and their answers reached the rewards (test_tool_outcome)
    assert all(m["turns/masked_fraction"] > 0.3 and m["tool/errors"] > 0 for m in ms)
    assert any("<tool_response>" in text for step in samples(sep) for text, _ in step)
    if run == "sep0gt":  # training rank 1 trained its half to rank 0's weights after every update
        assert [m["sync/train_weights_max_diff"] for m in ms] == [0.0] * STEPS
    assert max(r for step in samples(sep) for _, r in step) > 1.0  # a tool answer's length and error counted


@pytest.mark.slow  # the same msrun job
def test_partial_rollouts_with_tool_calls_under_the_separate_placement_equal_one_process(runs):
    """sep1pt: partial rollouts with tool calls, one step off-policy (workers/one_stage_runs.py: PARTIAL_TOOLS). The
    rollout rank stops each step's rollout at its complete groups, carries the unfinished conversations (their tool
    calls with them: grpo/partial_conversations.py) into the next step and hands over the groups with their
    conversations' columns and metrics; col1pt, the same in one process: the samples, rewards, losses, staleness,
    partial/ and tool/ figures step for step."""
    sep, col = runs / "sep1pt", runs / "col1pt"
    ms, mc = metrics(sep), metrics(col)
    assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    got = samples(sep, ("prompt", "completion", "reward"))
    assert got == samples(col, ("prompt", "completion", "reward")) and all(len(step) == 8 for step in got)
    keys = ("reward_mean", "staleness/mean", "staleness/max", "staleness/dropped", "partial/carried_groups",
            "partial/carried_samples", "partial/carried_turns", "partial/continued_samples", "tool/calls_mean",
            "tool/errors", "tool/timeouts", "tool/samples_with_calls", "turns/mean", "turns/cut",
            "turns/masked_fraction")
    same_steps(ms, mc, keys)
    # conversations were carried part way (all 16 samples of a step decode at once) and went on a step later, their
    # tool turns in the trajectories
    assert sum(m["partial/continued_samples"] for m in ms) > 0 and max(m["staleness/max"] for m in ms) >= 1
    assert max(m["partial/carried_turns"] for m in ms) > 0  # some carried after their tool turn
    assert all(m["turns/masked_fraction"] > 0.3 and m["tool/errors"] > 0 for m in ms)
    assert any("<tool_response>" in text for step in got for _, text, _ in step)


@pytest.mark.slow  # the same msrun job
def test_partial_rollouts_with_an_environment_under_the_separate_placement_equal_one_process(runs):
    """sep1pen: partial rollouts with sep0e's environment (guess_number) and dynamic sampling, one step off-policy
    (workers/one_stage_runs.py: PARTIAL_ENVIRONMENT). The rollout rank resets the games of its fresh prompts, stops each
    round at its complete groups, carries the unfinished games (their pickled state) into later steps and hands over the
    groups with the prompts as its resets wrote them and their env_reward, env_done and messages; the training rank
    checks its draw of the data's prompts against the rollout rank's every round and trains the written ones. col1pen,
    the same in one process: the prompts as written, samples, rewards, losses, staleness, partial/, env/, turns/ and
    dynamic_sampling/ figures step for step."""
    sep, col = runs / "sep1pen", runs / "col1pen"
    ms, mc = metrics(sep), metrics(col)
    assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    got = samples(sep, ("prompt", "completion", "reward"))
    assert got == samples(col, ("prompt", "completion", "reward")) and all(len(step) == 8 for step in got)
    keys = ("reward_mean", "staleness/mean", "staleness/max", "staleness/dropped", "partial/carried_groups",
            "partial/carried_samples", "partial/carried_turns", "partial/continued_samples", "env/errors",
            "env/timeouts", "env/reward_mean", "env/steps_mean", "env/done_fraction", "turns/mean", "turns/cut",
            "turns/masked_fraction", "dynamic_sampling/rounds", "dynamic_sampling/kept_groups", "prompt_length/mean")
    same_steps(ms, mc, keys)
    # games were carried part way and went on a step later (some after the game's answer), and they were played: the
    # game's answers in the trajectories, updates on groups with a spread of rewards
    assert sum(m["partial/continued_samples"] for m in ms) > 0 and max(m["staleness/max"] for m in ms) >= 1
    assert max(m["partial/carried_turns"] for m in ms) > 0
    assert all(m["turns/mean"] > 0 and m["env/steps_mean"] >= 1 and m["dynamic_sampling/kept_groups"] >= 1 for m in ms)
    # the trained prompts are the resets' (the chat template around the game's first message), not the data's as
    # drawn (completions.jsonl's prompt: at most one token a byte)
    for m, step in zip(ms, got):
        assert m["prompt_length/mean"] > max(len(prompt.encode()) for prompt, _, _ in step) + 20, m["step"]
    assert any("Higher." in text or "Lower." in text or "Answer with one whole number." in text
               for step in got for _, text, _ in step)


@pytest.mark.slow  # the same msrun job
def test_partial_rollouts_with_an_environment_resume_under_the_separate_placement(runs):
    """sep1penr: sep1pen stopped after step 1 with games in flight and resumed (--resume). Its checkpoint holds their
    prompts as drawn from the data (the training rank's, no games); the rollout rank draws them again, resets their
    games and plays them from the start before any fresh prompt, its prompt check naming the drawn prompts (the
    training rank compares it every round: the run would stop otherwise). Step 1 is col1pen's; every step trains
    batch_size complete groups on the prompts the resets wrote, no prompt twice."""
    run = runs / "sep1penr"
    ms = metrics(run)
    assert [m["step"] for m in ms] == list(range(1, STEPS + 1))
    got = samples(run, ("prompt", "completion", "reward"))
    assert got[0] == samples(runs / "col1pen", ("prompt", "completion", "reward"))[0]
    assert all(len(step) == 8 for step in got)
    with open(run / "checkpoints" / "step_00000001" / "in_flight.json") as f:
        first = json.load(f)
    assert first["groups"] and all(g["samples"] == [] for g in first["groups"])
    # the games in flight at the save played again from their resets, whole, in the first step after the resume
    assert ms[1]["partial/continued_samples"] >= 4 * len(first["groups"])
    for m, step in zip(ms, got):  # the resets' prompts trained (at most one token a byte of the data's)
        assert m["prompt_length/mean"] > max(len(prompt.encode()) for prompt, _, _ in step) + 20, m["step"]
        assert m["turns/mean"] > 0 and m["env/steps_mean"] >= 1, m["step"]
    trained = prompts(got)
    assert len(set(trained)) == len(trained)


@pytest.mark.slow  # the same msrun jobs
@pytest.mark.parametrize("run, peer", [("sep0e", "col0e"), ("sep1ed", "col1e")])
def test_an_environment_and_dynamic_sampling_with_the_separate_placement_equal_the_colocated_run(runs, run, peer):
    """sep0e: an environment (guess_number, workers/one_stage_runs.py: ENVIRONMENT) under separate, with dynamic
    sampling. The rollout rank writes the prompts (the environment's resets), plays the games, scores them with the
    run's rule rewards to decide each step's further rollouts of the prompts whose games all scored the same, and hands
    over every rollout, their columns and env/ metrics; rank 0 checks its draw, rewards the games (env_reward), follows
    the rollout rank's count of rollouts and trains the model's own tokens: col0e's samples, rewards, rollouts a step,
    losses and metrics step for step. sep1ed: the same one step off-policy on a rollout group of two (each rank its
    share of every rollout, their counts of groups with a spread summed), the rollout ranks deciding each step's
    rollouts a step ahead, every rollout of step s with the weights of version s - 2 as in col1e."""
    sep, col = runs / run, runs / peer
    ms, mc = metrics(sep), metrics(col)
    assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    got = samples(sep, ("prompt", "completion", "reward"))
    assert got == samples(col, ("prompt", "completion", "reward")) and all(len(step) == 8 for step in got)
    keys = ("env/errors", "env/timeouts", "turns/cut", "reward_mean", "dynamic_sampling/rounds",
            "dynamic_sampling/kept_groups", "dynamic_sampling/no_update", "staleness/mean", "staleness/max")
    # per-sample and per-token means: two rollout ranks' merged within rounding (m * w / w), one rank's its own
    means = ("env/reward_mean", "env/steps_mean", "env/done_fraction", "turns/mean", "turns/masked_fraction")
    lag, tol = (1, 1e-12) if run == "sep1ed" else (0, 0.0)
    for a, b in zip(ms, mc):
        assert [a.get(k) for k in keys] == [b.get(k) for k in keys], a["step"]
        assert [a[k] for k in means] == pytest.approx([b[k] for k in means], rel=tol, abs=0.0), a["step"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"],
                                                                                                   rel=1e-5)
    # the games were played: the environment's answers in the trajectories (context, not trained), its rewards
    # (2 x the game's: -1 a turn without a number) in the total, differing within a step
    assert all(m["turns/mean"] > 0 and m["turns/masked_fraction"] > 0.3 and m["env/steps_mean"] >= 1 for m in ms)
    assert any("Answer with one whole number." in text or "Higher." in text or "Lower." in text
               for step in got for _, text, _ in step)
    assert all(m["reward_mean"] == pytest.approx(2 * m["env/reward_mean"], rel=tol, abs=0.0) for m in ms)
    assert max(m["dynamic_sampling/rounds"] for m in ms) > 1  # a step drew prompts again
    assert all(len({r for _, _, r in step}) > 1 for step in got)
    if lag:  # every sample of step s, of each of its rollouts, with version s - 2 (staleness 1; step 1: the first)
        assert [m["staleness/mean"] for m in ms] == [m["staleness/max"] for m in ms] == [0.0, 1.0, 1.0]
    assert got[1] != got[0] and got[2] != got[1]


@pytest.mark.slow  # the same msrun job
def test_tool_calls_on_colocated_inference_replicas_equal_the_one_process_run(runs):
    """dp0t: two colocated replicas (generate_config.parallel_config.data_parallel 2, training data_parallel 2), each
    generating its half of the prompts and running their conversations on its own tool workers: the same trajectories
    and rewards as col0t in one process (the tool answers reached the rewards), the same tool/ and turns/ metrics
    (counts summed, means over the whole batch), the losses within the data-parallel runs' tolerance."""
    dp, col = runs / "dp0t", runs / "col0t"
    md, mc = metrics(dp), metrics(col)
    assert [m["step"] for m in md] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    assert samples(dp) == samples(col)
    for a, b in zip(md, mc):
        for key in ("tool/calls_mean", "tool/errors", "tool/timeouts", "tool/samples_with_calls", "turns/mean",
                    "turns/cut", "reward_mean"):
            assert a[key] == b[key], (a["step"], key)
        assert a["turns/masked_fraction"] == pytest.approx(b["turns/masked_fraction"], rel=1e-12), a["step"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"],
                                                                                                   rel=1e-5)
    assert all(m["turns/masked_fraction"] > 0.3 and m["tool/errors"] > 0 for m in md)
    assert max(r for step in samples(dp) for _, r in step) > 1.0  # a tool answer's length and error counted


@pytest.mark.slow  # the same msrun job
# sep1l, col1l (off_policy_steps 1: the same meetings) pass too, 46 s of CI; and sep0dl (sep0l with a rollout group of
# two, the meetings of sep0d), against col0l
@pytest.mark.parametrize("run", ["0", "0g", "0tp", "0tpg", "0ppg"])
def test_lora_under_a_separate_placement_equals_the_colocated_run_and_syncs_the_adapters(runs, run):
    """sep0l: LoRA rank 4 with a warm start (the base trains, then moves whole to the rollout rank), stopped after
    step 2 and resumed (the base and adapters move again), the reference the policy with its adapters off (beta > 0);
    col0l: the same in one process, the engine on the policy itself. sep1l, col1l: LoRA with off_policy_steps 1.
    sep0gl: sep0l on a training group of two (the adapters' gradients summed over the two, rank 0's adapters to the
    rollout rank, both training ranks resuming from the adapters rank 0 saved: their weights equal after every
    update). sep0tpl: sep0l beside a rollout replica of two tensor-parallel pieces (each piece keeps its slice of the
    base and of the adapters each meeting brings, and merges its pieces into its fused copies). sep0tpgl: sep0l on a
    training replica of two tensor-parallel pieces (each training rank gives its pieces of the adapters in their
    places; the checkpoints hold each rank's pieces and a PEFT folder made whole, the resume loads each rank's piece
    of the base file); sep0ppgl: the same on two pipeline stages (each gives its layers' adapters), the untied micro
    model, against col0lu."""
    lag = int(run[0])
    stages = run == "0ppg"
    sep, col = runs / f"sep{run}l", runs / ("col0lu" if stages else f"col{lag}l")
    ms, mc = metrics(sep), metrics(col)
    assert [m["step"] for m in ms] == [m["step"] for m in mc] == list(range(1, STEPS + 1))
    got, want = samples(sep), samples(col)
    assert all(len(step) == 8 for step in want) and got == want
    for a, b in zip(ms, mc):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6), a["step"]
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert ms[-1]["kl"] > 0  # the adapters moved the policy off the base, the reference
    if lag:
        assert [m["staleness/mean"] for m in ms] == [m["staleness/mean"] for m in mc] == [0.0, 1.0, 1.0]
    assert got[1] != got[0] and got[2] != got[1]  # each update's adapters reached the rollout rank
    # each update's meeting moved the adapters alone: their bytes, far below the whole model's (sep0's meetings)
    model = os.path.join(WORKERS, "micro_untied.yaml") if stages else str(runs / "micro_one_layer.yaml")
    lora = adapter_bytes(model, 4)
    assert [m["sync/bytes"] for m in ms] == [float(lora)] * STEPS
    assert lora * 5 < metrics(runs / ("sep0ppg" if stages else "sep0"))[-1]["sync/bytes"]  # 9.9x and 12.6x here
    if run == "0g":  # training rank 1's adapters are rank 0's after every update, the resumed one's included
        assert [m["sync/train_weights_max_diff"] for m in ms] == [0.0] * STEPS
    if run.endswith("g"):
        assert os.listdir(sep / "checkpoints" / "step_00000002" / "adapter")  # PEFT's files, as one process's
    if run in ("0tpg", "0ppg"):  # each training rank wrote its pieces; the PEFT folder: the whole adapters, one process's
        # to the rounding of the pieces' sums over three updates and AdamW's steps: measured 1.6e-6 on AVX-512
        # machines, 1.34e-5 for the two pipeline stages on an AVX2-only AMD EPYC Zen 2 (tp: 8.4e-7), the largest entry
        # 0.18 (not measured: a piece missing or summed twice would move entries by about their own size)
        assert sorted(os.listdir(sep / "checkpoints" / "step_00000002" / "lora")) == ["rank_0", "rank_1"]
        got, want = (safetensors.numpy.load_file(str(folder / "checkpoints" / f"step_{STEPS:08d}" / "adapter" /
                                                     "adapter_model.safetensors")) for folder in (sep, col))
        assert sorted(got) == sorted(want) and all(got[k].shape == want[k].shape for k in want)
        assert max(float(np.abs(got[k] - want[k]).max()) for k in want) <= 5e-5
