"""msrun worker for tests/parallel/test_msrun.py: scripts/grpo_one_stage.py several times in one job,
with the given key=value settings plus each run's own, into folders of OUT_DIR named after the runs:

    msrun --worker_num=2 ... one_stage_runs.py OUT_DIR RUN[,RUN ...] [key=value ...]

Runs: swap_on, swap_off (training tp2, swap on and off), pp2 (two pipeline stages), opt_whole,
opt_shard (dp2 for two steps, the AdamW moments whole and split: ZeRO-1). opt_shard stops after
one step and resumes (--resume) for the second: its sharded checkpoint is read back by every rank.
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
RUNS = {
    # name: the invocations of grpo_one_stage.py, each (flags, overrides after the shared ones)
    "swap_on": [(["--swap", "True"], TP2)],
    "swap_off": [(["--swap", "False"], TP2)],
    "pp2": [(["--swap", "True"], PP2)],
    "opt_whole": [([], DP2 + ["actor_config.parallel_config.optimizer_shard=false"])],
    "opt_shard": [([], DP2 + ["actor_config.parallel_config.optimizer_shard=true", "rl_config.max_steps=1"]),
                  (["--resume"], DP2 + ["actor_config.parallel_config.optimizer_shard=true"])],
}

out, names, overrides = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
unknown = [n for n in names if n not in RUNS]
if unknown:
    sys.exit(f"one_stage_runs.py: unknown runs {unknown}; valid: {sorted(RUNS)}")
clock = Clock("one_stage_runs")
for name in names:
    for flags, more in RUNS[name]:
        code = grpo_one_stage.main(["--use_parallel", "True", *flags, "--output_dir", os.path.join(out, name),
                                    *overrides, *more])
        if code:
            sys.exit(code)
        clock.mark(" ".join([name, *flags]))
