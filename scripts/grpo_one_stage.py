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


# our users' mindrlhf flags that name the same thing as a config key: --flag -> key
FLAG_KEYS = {"sft_path_train": "actor_config.load_checkpoint", "ref_path": "ref_config.load_checkpoint",
             "mind_dataset_dir": "rl_config.dataset_path", "val_dataset": "rl_config.val_dataset_path"}
# (flag, its attribute, the flag that says whether it is loaded)
WEIGHT_FLAGS = (("--sft_path_train", "sft_path_train", "load_sft_checkpoint_train"),
                ("--sft_path_infer", "sft_path_infer", "load_sft_checkpoint_infer"),
                ("--ref_path", "ref_path", "load_ref_checkpoint"))


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


def _overrides(args) -> list:
    """The dotted overrides, with the flags that are short for one key (--output_dir, --swap, ...) among them."""
    from mindgrpo.grpo.run import SetupError

    overrides = list(args.overrides)
    for flag, key in (("output_dir", "rl_config.output_dir"), ("swap", "rl_config.swap"),
                      ("reward_plugin", "reward_config.reward_plugin"),
                      ("save_ckpt_dir", "actor_config.checkpoint_dir")):
        value = getattr(args, flag)
        if value is not None and value != "":
            overrides.append(f"{key}={value}")
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise SetupError(f"override {bad[0]!r} is not key.sub=value")
    return overrides


def load_run_config(args):
    """The config, read once, with the flags folded in: each flag of FLAG_KEYS sets its key (both given and
    naming different files: an error naming both); a path that a key names must exist."""
    from mindgrpo.config import ConfigError, GRPOConfig, config_data, data_value, from_dict
    from mindgrpo.grpo.run import SetupError

    try:
        data = config_data(args.config, _overrides(args))
    except ConfigError as e:
        raise SetupError(str(e)) from None
    flagged = {}  # key -> the flag that set it
    for flag, key in FLAG_KEYS.items():
        given = getattr(args, flag, None)
        if given is None:
            continue
        current = data_value(data, key)
        if current is not None and not _same_path(given, str(current)):
            raise SetupError(f"--{flag} {given} and config key '{key}' {current} name different files; give one")
        section, name = key.split(".")
        node = data.get(section) or {}
        if isinstance(node, dict):  # else from_dict names the section that is no mapping
            data[section] = {**node, name: given}
            flagged[key] = flag
    try:
        cfg = from_dict(GRPOConfig, data)
    except ConfigError as e:
        raise SetupError(f"{e} (set by --{flagged[e.key]})" if e.key in flagged else str(e)) from None
    for key in FLAG_KEYS.values():
        section, name = key.split(".")
        path = getattr(getattr(cfg, section), name)
        if key not in flagged and path is not None and not os.path.exists(path):
            raise SetupError(f"config key '{key}': {path} does not exist")
    return cfg


def check_weight_paths(args) -> None:
    """A weights flag that names a missing file or folder stops the run before anything is built."""
    from mindgrpo.grpo.run import SetupError

    for flag, name, load in WEIGHT_FLAGS:
        path = getattr(args, name)
        if path and getattr(args, load) and not os.path.exists(path):
            raise SetupError(f"{flag} {path}: no such file or folder")


def check_compile_cache(args) -> None:
    """MindSpore 2.10's compile cache finds a graph by the order in which the process compiles it, not
    by what it computes (tests/test_environment.py pins it): a run that compiles in another order
    than the run that filled the cache (a resumed run, another config, another version of this code)
    would run other graphs, silently when their inputs match. The flag stays for command lines that
    pass it off."""
    from mindgrpo.grpo.run import SetupError

    if args.enable_compile_cache:
        raise SetupError("--enable_compile_cache is refused: MindSpore 2.10's compile cache finds a graph by "
                         "its order of compilation, not by what it computes, so a resumed run or another "
                         "config could silently run other graphs")


def run_options(cfg, args):
    """The run's options (mindgrpo.grpo.run.RunOptions): the flags that are no config key; the builder's paths
    take the weights and data from the config, where the flags were folded in."""
    from mindgrpo.grpo.builder import Paths
    from mindgrpo.grpo.run import RunOptions

    paths = Paths(output_dir=cfg.rl_config.output_dir, sft_path_train=cfg.actor_config.load_checkpoint,
                  sft_path_infer=args.sft_path_infer, ref_path=cfg.ref_config.load_checkpoint,
                  vocab_path=args.vocab_path, merges_file_path=args.merges_file_path,
                  tokenizer_config=args.tokenizer_config, dataset=cfg.rl_config.dataset_path,
                  val_dataset=cfg.rl_config.val_dataset_path,
                  load_sft_checkpoint_train=args.load_sft_checkpoint_train,
                  load_sft_checkpoint_infer=args.load_sft_checkpoint_infer,
                  load_ref_checkpoint=args.load_ref_checkpoint)
    return RunOptions(paths=paths, config_path=args.config, use_parallel=args.use_parallel, resume=args.resume,
                      resume_from=args.resume_from or None, allow_config_change=args.allow_config_change,
                      save_data_file=args.save_data_file, only_save_strategy=args.only_save_strategy)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mindgrpo.grpo.recycle import Restart, exec_fresh, restart_argv
    from mindgrpo.grpo.run import SetupError, run
    from mindgrpo.rewards import RewardError

    try:
        check_weight_paths(args)
        check_compile_cache(args)
        cfg = load_run_config(args)
        return run(cfg, run_options(cfg, args))
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
