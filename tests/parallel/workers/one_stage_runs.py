"""msrun worker for tests/parallel/test_msrun.py: scripts/grpo_one_stage.py several times in one job,
with the given key=value settings plus each run's own, into folders of OUT_DIR:

    msrun --worker_num=2 ... one_stage_runs.py OUT_DIR layouts [key=value ...]          # swap_on, swap_off, pp2
    msrun --worker_num=2 ... one_stage_runs.py OUT_DIR optimizer_shard [key=value ...]  # opt_whole, opt_shard

opt_shard stops after one step and resumes (--resume) for the rest: its sharded checkpoint is
read back by every rank.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import grpo_one_stage  # noqa: E402

TP2 = ["actor_config.parallel_config.model_parallel=2", "generate_config.parallel_config.data_parallel=2"]
PP2 = ["actor_config.parallel_config.pipeline_stage=2", "generate_config.parallel_config.data_parallel=2"]
RUNS = {
    "layouts": [("swap_on", ["--swap", "True"], TP2), ("swap_off", ["--swap", "False"], TP2),
                ("pp2", ["--swap", "True"], PP2)],
    "optimizer_shard": [("opt_whole", [], ["actor_config.parallel_config.optimizer_shard=false"]),
                        ("opt_shard", [], ["actor_config.parallel_config.optimizer_shard=true", "rl_config.max_steps=1"]),
                        ("opt_shard", ["--resume"], ["actor_config.parallel_config.optimizer_shard=true"])],
}

out, vary, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
for folder, flags, more in RUNS[vary]:
    code = grpo_one_stage.main(["--use_parallel", "True", *flags, "--output_dir", os.path.join(out, folder),
                                *overrides, *more])
    if code:
        sys.exit(code)
