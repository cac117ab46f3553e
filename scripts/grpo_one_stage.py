"""One-stage GRPO: rollout, reward, reference, update and weight sync in one process group.

    python scripts/grpo_one_stage.py                       # the built-in tiny default, on CPU
    python scripts/grpo_one_stage.py --config CONFIG.yaml [--output_dir DIR] [key.sub=value ...]
    msrun --worker_num=2 --local_worker_num=2 scripts/grpo_one_stage.py --use_parallel True --config ...

With no --config the tiny recipe `model_configs/qwen_grpo/tiny/grpo_config.yaml` runs: a tiny
Qwen2 learns to add three single-digit numbers (a supervised warm start on a flawed teacher that
forgets carries, then GRPO with the accuracy reward) with a tokenizer and data it makes itself. Dotted overrides such as `rl_config.max_steps=1` apply on
top of the YAML. Our users' mindrlhf flags are accepted (see --help).
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(REPO, "model_configs", "qwen_grpo", "tiny", "grpo_config.yaml")


def str2bool(v: str) -> bool:
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {v!r}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="GRPO YAML (default: the tiny recipe)")
    ap.add_argument("--output_dir", help="metrics, logs, checkpoints (default: rl_config.output_dir)")
    ap.add_argument("--sft_path_train", help="policy weights: HF directory or MindSpore .ckpt "
                                             "(sets actor_config.load_checkpoint)")
    ap.add_argument("--sft_path_infer", help="inference weights (default: the policy's)")
    ap.add_argument("--ref_path", help="reference weights (default: the policy's; sets ref_config.load_checkpoint)")
    ap.add_argument("--vocab_path")
    ap.add_argument("--merges_file_path")
    ap.add_argument("--tokenizer_config")
    ap.add_argument("--mind_dataset_dir", help="training prompts (MindRecord from data_tools/rlhf_data.py; "
                                               "sets rl_config.dataset_path)")
    ap.add_argument("--val_dataset", help="held-out prompts (MindRecord; sets rl_config.val_dataset_path)")
    ap.add_argument("--save_data_file", help="write each step's experience to this MindRecord")
    ap.add_argument("--save_ckpt_dir", help="checkpoint folder (default: OUTPUT_DIR/checkpoints)")
    ap.add_argument("--use_parallel", type=str2bool, default=False, help="run under msrun with collectives")
    ap.add_argument("--load_sft_checkpoint_train", type=str2bool, default=True)
    ap.add_argument("--load_sft_checkpoint_infer", type=str2bool, default=True)
    ap.add_argument("--load_ref_checkpoint", type=str2bool, default=True)
    ap.add_argument("--enable_compile_cache", type=str2bool, default=False)
    ap.add_argument("--only_save_strategy", type=str2bool, default=False,
                    help="write the training and inference strategy files and exit")
    ap.add_argument("--resume", action="store_true",
                    help="continue from the newest complete checkpoint in the checkpoint folder")
    ap.add_argument("--resume_from", metavar="PATH", help="continue from this checkpoint folder (step_N); newer "
                                                          "checkpoints beside it are set aside")
    ap.add_argument("--allow_config_change", action="store_true",
                    help="with --resume: accept changed config keys that break the run's exactness or its data "
                         "order (num_generations, batch size, seeds, data, the algorithm; mindgrpo/config/resume.py)")
    ap.add_argument("--reward_plugin", help="a .py file that registers more reward functions "
                                            "(same as reward_config.reward_plugin=PATH)")
    ap.add_argument("--swap", type=str2bool, default=None, help="host-memory swap (default: rl_config.swap)")
    ap.add_argument("overrides", nargs="*", help="key.sub=value config overrides")
    return ap.parse_intermixed_args(argv)  # overrides may come before and after flags


def main(argv=None) -> int:
    args = parse_args(argv)
    from mindgrpo.grpo.recycle import Restart, exec_fresh, restart_argv
    from mindgrpo.grpo.run import SetupError, run
    from mindgrpo.rewards import RewardError

    try:
        return run(args)
    except (SetupError, RewardError) as e:  # RewardError: a reward function broke its contract
        print(f"grpo_one_stage: error: {e}", file=sys.stderr)
        return 2
    except Restart as e:  # resident memory grew (rl_config.restart_on_memory_growth): the same run, a fresh process
        if argv is not None:  # called in-process (not as the script): leave the process to the caller
            print(f"grpo_one_stage: {e}; run again with --resume to continue", file=sys.stderr)
            return 3
        exec_fresh(restart_argv(sys.executable, sys.argv), str(e))


if __name__ == "__main__":
    from mindgrpo.utils.malloc import reexec_with_allocator

    reexec_with_allocator()  # jemalloc preloaded when found: graph compiles take ~0.8x the CPU
    sys.exit(main())
