"""The recipe behind scripts/grpo_one_stage.py: config, parts, warm start, fit, summary."""

from __future__ import annotations

import json
import logging
import os
import time

import numpy as np

logger = logging.getLogger("mindgrpo")


class SetupError(Exception):
    """A bad flag, config key, path or file found before training starts: one line, no traceback."""


def load_run_config(args):
    from mindgrpo.config import GRPOConfig, load_config

    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"rl_config.output_dir={args.output_dir}")
    if args.swap is not None:
        overrides.append(f"rl_config.swap={args.swap}")
    if args.reward_plugin:
        overrides.append(f"reward_config.reward_plugin={args.reward_plugin}")
    if args.save_ckpt_dir:
        overrides.append(f"actor_config.checkpoint_dir={args.save_ckpt_dir}")
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise SetupError(f"override {bad[0]!r} is not key.sub=value")
    return load_config(GRPOConfig, args.config, overrides)


# (flag, its attribute, the flag that says whether it is loaded)
WEIGHT_FLAGS = (("--sft_path_train", "sft_path_train", "load_sft_checkpoint_train"),
                ("--sft_path_infer", "sft_path_infer", "load_sft_checkpoint_infer"),
                ("--ref_path", "ref_path", "load_ref_checkpoint"))


def check_weight_paths(args) -> None:
    """A weights flag that names a missing file or folder stops the run before anything is built."""
    for flag, name, load in WEIGHT_FLAGS:
        path = getattr(args, name)
        if path and getattr(args, load) and not os.path.exists(path):
            raise SetupError(f"{flag} {path}: no such file or folder")


def run(args) -> int:
    check_weight_paths(args)
    import mindspore as ms

    from mindgrpo.config import ConfigError
    from mindgrpo.grpo import builder
    from mindgrpo.grpo.sft import sft_warm_start
    from mindgrpo.utils.metrics_log import MetricsLogger, setup_logging
    from mindgrpo.utils.plot import plot_training
    from mindgrpo.utils.progress import Progress

    try:
        cfg = load_run_config(args)
    except (ConfigError, OSError) as e:
        raise SetupError(str(e)) from None
    rl = cfg.rl_config
    out = rl.output_dir
    ms.set_context(mode=ms.GRAPH_MODE)
    if args.enable_compile_cache:
        ms.set_context(enable_compile_cache=True, compile_cache_path=os.path.join(out, "compile_cache"))

    from mindgrpo.parallel.placement import placement_for

    placement = placement_for(cfg, args.use_parallel)  # under msrun: communication initialised
    rank = placement.rank
    if args.only_save_strategy:
        from mindgrpo.parallel.placement import save_strategies

        for path in save_strategies(cfg, out):
            print(path)
        return 0

    os.makedirs(out, exist_ok=True)
    setup_logging(out, rank)
    logger.info("config %s, output %s", args.config, out)
    np.random.seed(rl.seed)
    ms.set_seed(rl.seed)
    try:
        parts = builder.build(cfg, builder.Paths(
            output_dir=out, sft_path_train=args.sft_path_train, sft_path_infer=args.sft_path_infer,
            ref_path=args.ref_path, vocab_path=args.vocab_path, merges_file_path=args.merges_file_path,
            tokenizer_config=args.tokenizer_config, dataset=args.mind_dataset_dir, val_dataset=args.val_dataset,
            load_sft_checkpoint_train=args.load_sft_checkpoint_train,
            load_sft_checkpoint_infer=args.load_sft_checkpoint_infer,
            load_ref_checkpoint=args.load_ref_checkpoint), placement)
    except (ConfigError, OSError, KeyError, ValueError) as e:
        raise SetupError(e.args[0] if isinstance(e, KeyError) and e.args else str(e)) from None

    metrics_log = MetricsLogger(out, rank=rank, console=False)  # the progress line is the console view
    progress = Progress(rl.max_steps)
    trainer = builder.make_trainer(cfg, parts, metrics_log, progress, out)
    trainer.save_data_file = args.save_data_file
    resumed = False
    if args.resume or args.resume_from:
        from mindgrpo.parallel import checkpoints

        root = trainer.checkpoints.root
        path = args.resume_from or checkpoints.latest(root)
        if path is None:
            raise SetupError(f"--resume: no checkpoint under {root}")
        trainer.resume(path)
        metrics_log.truncate_after(trainer.step + 1)  # keep what the checkpointed steps logged
        resumed = True
    if not resumed and cfg.sft_config.steps > 0:
        sft = cfg.sft_config
        m = sft_warm_start(parts.policy, parts.train_prompts, parts.tokenizer, steps=sft.steps, lr=sft.lr,
                           batch_size=sft.batch_size, micro_batch_size=cfg.actor_config.micro_batch_size,
                           seed=rl.seed, teacher_carry_error=sft.teacher_carry_error,
                           grad_reducer=parts.grad_reducer, pipeline=parts.pipeline)
        trainer.sync()
        if parts.ref_sync is not None:
            parts.ref_sync()  # the reference is the warm-started policy
        logger.info("sft warm start done: %s", json.dumps(m))

    t0 = time.perf_counter()
    trainer.fit()
    hist = trainer.val_history
    if hist:
        logger.info("final: val_accuracy start=%.3f end=%.3f", hist[0], hist[-1])
        if rank == 0:
            print(f"final: val_accuracy start={hist[0]:.3f} end={hist[-1]:.3f}", flush=True)
    metrics_log.close()
    if rank == 0:
        png = plot_training(os.path.join(out, "metrics.jsonl"), os.path.join(out, "training.png"))
        logger.info("done in %.1fs; metrics %s; plot %s", time.perf_counter() - t0,
                    os.path.join(out, "metrics.jsonl"), png)
    return 0
