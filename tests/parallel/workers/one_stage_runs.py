"""Worker for tests/parallel/test_msrun.py: scripts/grpo_one_stage.py several times in one process,
with the given key=value settings plus each run's own, into folders of OUT_DIR named after the runs:

    msrun --worker_num=2 ... one_stage_runs.py OUT_DIR RUN[,RUN ...] [key=value ...]
    python one_stage_runs.py OUT_DIR single,single_packed [key=value ...]

Under msrun (--use_parallel True): swap_on, swap_off (training tp2, swap on and off), pp2 (two
pipeline stages), opt_whole, opt_shard (dp2 for two steps, the AdamW moments whole and split: ZeRO-1), sep0,
sep1 (generate_config.placement separate, off_policy_steps 0 with a warm start and 1, both validating; their
one-process peers: col0, col1), sep1p (sep1 with partial rollouts; its peer col1p), sep0r, sep1r (after sep0, sep1:
their last step again, resumed from their step-2 checkpoints), sep0l (sep0 with LoRA rank 4, without validation,
stopped after step 2 and resumed for step 3; its peer col0l), sep1l (LoRA with off_policy_steps 1; its peer col1l).
opt_shard stops after one step and resumes (--resume) for the second: its sharded checkpoint is read
back by every rank. One process, their peers: single (swap off), single_packed (packed rows). Runs in
one process share its start-up and imports (a process each cost seconds of CPU before it compiled).
"""

import gc
import os
import sys

import mindgrpo.grpo.builder  # noqa: F401  (imported by each run: here so that they are frozen below)
import mindgrpo.grpo.trainer  # noqa: F401
from scripts import grpo_one_stage
from worker_clock import Clock

# what the imports made stays out of the full collection MindSpore runs before each compile (tests/conftest.py)
gc.collect()
gc.freeze()

TP2 = ["actor_config.parallel_config.model_parallel=2", "generate_config.parallel_config.data_parallel=2"]
PP2 = ["actor_config.parallel_config.pipeline_stage=2", "generate_config.parallel_config.data_parallel=2"]
DP2 = ["actor_config.parallel_config.data_parallel=2", "generate_config.parallel_config.data_parallel=2",
       "rl_config.max_steps=2"]  # two steps: the second update reads the moments of the first
# the single-process peer on packed rows (mindgrpo/grpo/packing.py): the trainer's update through them
PACKED = ["actor_config.max_tokens_per_micro_batch=1024", "actor_config.packing=true"]
MSRUN = ["--use_parallel", "True"]
# save_interval 2: the checkpoint of step 2 that sep0r and sep1r resume from
SEPARATE, OFF1 = ["generate_config.placement=separate", "rl_config.save_interval=2"], ["rl_config.off_policy_steps=1"]
# validation at step 0 and after the last step (the test's 3) on 4 held-out prompts, greedy (VAL) or sampled (SAMPLED:
# a micro model's greedy answers may not move in 2 updates, its samples do); and a 2-step warm start
VAL, SAMPLED = ["rl_config.val_interval=3", "rl_config.val_size=4"], ["rl_config.val_temperature=1.0"]
WARM = \
    ["sft_config={steps: 2, batch_size: 4, lr: 1.0e-2}"]  # a section: the shared overrides set it as one
# partial rollouts; a tenth of the micro model's 512 ids stop a sample, so that lengths differ and a step's rollout
# stops with samples half done (they go on in the next step)
# rank 4 on all seven projections (docs/lora.md); beta > 0: the reference is the policy with its adapters off
LORA = ["actor_config.lora_rank=4", "rl_config.beta=0.04"]
PARTIAL = OFF1 + ["generate_config.partial_rollout=true", f"generate_config.stop_token_ids={list(range(100, 152))}"]
RUNS = {
    # name: the invocations of grpo_one_stage.py, each (flags, overrides after the shared ones)
    "swap_on": [(MSRUN + ["--swap", "True"], TP2)],
    "swap_off": [(MSRUN + ["--swap", "False"], TP2)],
    "pp2": [(MSRUN + ["--swap", "True"], PP2)],
    "opt_whole": [(MSRUN, DP2 + ["actor_config.parallel_config.optimizer_shard=false"])],
    "opt_shard": [(MSRUN, DP2 + ["actor_config.parallel_config.optimizer_shard=true", "rl_config.max_steps=1"]),
                  (MSRUN + ["--resume"], DP2 + ["actor_config.parallel_config.optimizer_shard=true"])],
    # generate_config.placement separate (rank 0 trains, rank 1 generates), synchronous and one step off-policy,
    # and their one-process peers (tests/grpo/test_off_policy.py); sep0 with a warm start, both with validation
    "sep0": [(MSRUN, SEPARATE + WARM + VAL)],
    "sep1": [(MSRUN, SEPARATE + OFF1 + VAL + SAMPLED)],
    "col0": [([], WARM + VAL)],
    "col1": [([], OFF1 + VAL + SAMPLED)],
    "sep1p": [(MSRUN, SEPARATE + PARTIAL)],
    "col1p": [([], PARTIAL)],
    # LoRA under a separate placement: the base at the start, after the warm start and after the resume (sep0l stops
    # after step 2 and resumes for step 3), the adapters each update
    "sep0l": [(MSRUN, SEPARATE + WARM + LORA + ["rl_config.max_steps=2"]),
              (MSRUN + ["--resume"], SEPARATE + WARM + LORA)],
    "col0l": [([], WARM + LORA)],
    "sep1l": [(MSRUN, SEPARATE + OFF1 + LORA)],
    "col1l": [([], OFF1 + LORA)],
    "single": [(["--swap", "False"], [])],
    "single_packed": [(["--swap", "False"], PACKED)],
}

out, names, overrides = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
# sep0r, sep1r: sep0 and sep1 again from their step-2 checkpoints (--resume_from) for their last step
for lag in (0, 1):
    RUNS[f"sep{lag}r"] = [(MSRUN + ["--resume_from", os.path.join(out, f"sep{lag}", "checkpoints", "step_00000002")],
                           RUNS[f"sep{lag}"][0][1])]
unknown = [n for n in names if n not in RUNS]
if unknown:
    sys.exit(f"one_stage_runs.py: unknown runs {unknown}; valid: {sorted(RUNS)}")
clock = Clock("one_stage_runs")
for name in names:
    for flags, more in RUNS[name]:
        code = grpo_one_stage.main([*flags, "--output_dir", os.path.join(out, name), *overrides, *more])
        if code:
            sys.exit(code)
        clock.mark(" ".join([name, *flags]))
