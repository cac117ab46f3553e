"""msrun worker for tests/parallel/test_msrun.py: scripts/grpo_one_stage.py twice in one job, with
host-memory swap on and off (everything else equal), into OUT_DIR/swap_on and OUT_DIR/swap_off.

    msrun --worker_num=2 ... one_stage_twice.py OUT_DIR [key=value ...]
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import grpo_one_stage  # noqa: E402

out, overrides = sys.argv[1], sys.argv[2:]
for swap in ("True", "False"):
    code = grpo_one_stage.main(["--use_parallel", "True", "--swap", swap, "--output_dir",
                                os.path.join(out, "swap_on" if swap == "True" else "swap_off"), *overrides])
    if code:
        sys.exit(code)
