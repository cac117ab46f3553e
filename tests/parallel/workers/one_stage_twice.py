"""msrun worker for tests/parallel/test_msrun.py: scripts/grpo_one_stage.py twice in one job, everything
equal but one setting, into two folders of OUT_DIR:

    msrun --worker_num=2 ... one_stage_twice.py OUT_DIR swap [key=value ...]             # swap_on, swap_off
    msrun --worker_num=2 ... one_stage_twice.py OUT_DIR optimizer_shard [key=value ...]  # opt_whole, opt_shard
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import grpo_one_stage  # noqa: E402

RUNS = {
    "swap": [("swap_on", ["--swap", "True"], []), ("swap_off", ["--swap", "False"], [])],
    "optimizer_shard": [("opt_whole", [], ["actor_config.parallel_config.optimizer_shard=false"]),
                        ("opt_shard", [], ["actor_config.parallel_config.optimizer_shard=true"])],
}

out, vary, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
for folder, flags, more in RUNS[vary]:
    code = grpo_one_stage.main(["--use_parallel", "True", *flags, "--output_dir", os.path.join(out, folder),
                                *overrides, *more])
    if code:
        sys.exit(code)
