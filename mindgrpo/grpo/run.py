"""The recipe behind scripts/grpo_one_stage.py: config, parts, warm start, fit, summary."""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

logger = logging.getLogger("mindgrpo")


class SetupError(Exception):
    """A bad flag, config key, path or file found before training starts: one line, no traceback."""


@dataclass(frozen=True)
class RunOptions:
    """What a run is asked besides its config: the command line's flags that are no config key
    (scripts/grpo_one_stage.py parses them and folds the others into the config)."""

    paths: "Paths"  # mindgrpo.grpo.builder.Paths: the weights, tokenizer and data locations
    config_path: Optional[str] = None  # the YAML the config came from (logged)
    use_parallel: bool = False  # under msrun, with collectives
    resume: bool = False  # from the newest complete checkpoint, or `resume_from`
    resume_from: Optional[str] = None
    allow_config_change: bool = False  # accept changed keys that break exactness or the data order on resume
    save_data_file: Optional[str] = None  # each step's experience written to this MindRecord
    only_save_strategy: bool = False  # write the strategy files and return

    @property
    def resumed(self) -> bool:
        return self.resume or self.resume_from is not None


def start_from_checkpoint(trainer, resume_from: Optional[str], resume: bool, allow_config_change: bool = False) -> None:
    """Remove what killed saves left; with `resume`, load `resume_from` or the newest complete
    checkpoint, its config compared with this run's (mindgrpo/config/resume.py: every changed key
    logged, those that break exactness or the data order refused unless `allow_config_change`);
    then set aside the checkpoints beyond the step this run starts from."""
    from mindgrpo.config.resume import resume_changes
    from mindgrpo.parallel.checkpoint_folders import CheckpointError

    checkpoints = trainer.checkpoints
    try:
        checkpoints.clean()
    except CheckpointError as e:
        raise SetupError(str(e)) from None
    if resume:
        try:
            path = checkpoints.find(resume_from)
            if path is None:
                raise SetupError(f"--resume: no complete checkpoint under {checkpoints.root}")
            if resume_from is None:
                logger.info("--resume: the newest complete checkpoint is %s", path)
            state = trainer.resume(path)
        except CheckpointError as e:
            raise SetupError(str(e)) from None
        lines, error = resume_changes(state.get("config"), trainer.cfg, allow_config_change)
        for line in lines:
            logger.warning("%s", line)
        if error:
            raise SetupError(f"{path}: {error}")
    checkpoints.set_aside_after(trainer.step, "this run resumed" if resume else "this run starts")


# seconds between the lines of a step in flight (utils/progress.Ticker): 60 unless set (tests set it shorter)
PROGRESS_INTERVAL_ENV = "MINDGRPO_PROGRESS_INTERVAL_S"


def progress_interval_s() -> float:
    text = os.environ.get(PROGRESS_INTERVAL_ENV, "60")
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise SetupError(f"environment variable {PROGRESS_INTERVAL_ENV}={text!r}: expected seconds > 0")
    return value


def close_on_sigterm(close, in_collectives: bool = False) -> None:
    """On SIGTERM, `close()` first (the tool workers reaped, their folders removed), then the signal's default
    action: the process ends as it would have. The handler runs when the main thread is back in Python; a rank that
    waits in collectives (`in_collectives`: every msrun rank, colocated or separate) must still die at once, so
    there a thread woken by the signal (`signal.set_wakeup_fd`; MindSpore's graph calls let other threads run)
    closes too and ends the process with status 128 + SIGTERM."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if in_collectives:
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)  # the C handler writes the signal's number here at once

        def watch() -> None:
            while signal.SIGTERM not in os.read(read, 64):
                pass
            try:
                close()
            finally:
                os._exit(128 + signal.SIGTERM)

        threading.Thread(target=watch, name="mindgrpo-sigterm", daemon=True).start()

    def on_term(signum, frame):
        try:
            close()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            # to this thread, which may block it (a rank's main thread back from a wait), not to a thread that may
            # have ended since the signal came: left pending, the process would go on and exit 0
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
            signal.pthread_kill(threading.get_ident(), signum)

    signal.signal(signal.SIGTERM, on_term)


def close_conversations_on_sigterm(conversations, use_parallel: bool) -> None:
    """On SIGTERM, the conversations' tool workers closed (`close_on_sigterm`) on every rank that has them. Under
    msrun (use_parallel) any rank may be waiting in a collective when the signal comes (msrun sends it to every rank
    when one fails or when it is ended itself): a colocated rank in the data-parallel sums of the rollouts and the
    gradients, the rollout rank of a separate placement in its meetings; so there the signal's own thread closes them
    and ends the process at once. None: no conversations, nothing to close."""
    if conversations is not None:
        close_on_sigterm(conversations.close, in_collectives=use_parallel)


def run(cfg, options: RunOptions) -> int:
    """Train by `cfg` (a GRPOConfig): build the parts, warm-start, fit, summarise; 0 when done, 1 when training
    stopped (TrainingStopped). Raises SetupError for what is found wrong before training starts, and
    recycle.Restart when the process should continue fresh (rl_config.restart_on_memory_growth)."""
    interval_s = progress_interval_s()
    import mindspore as ms

    from mindgrpo.config import ConfigError
    from mindgrpo.data.tokenizer import write_run_tokenizer
    from mindgrpo.grpo import builder
    from mindgrpo.grpo.sft import sft_warm_start
    from mindgrpo.grpo.recycle import Restart
    from mindgrpo.grpo.trainer import TrainingStopped
    from mindgrpo.parallel.checkpoints import checkpoint_root
    from mindgrpo.models.lora import base_trains
    from mindgrpo.utils.metrics_log import MetricsLogger, setup_logging
    from mindgrpo.utils.plot import plot_training
    from mindgrpo.utils import compiles
    from mindgrpo.utils.progress import Progress, Ticker

    # MindSpore runs a full gc.collect() before compiling each graph: what the imports made lives for
    # the whole run, so it leaves the collector's lists (~0.1 s less per graph; DEVELOPERS.md)
    gc.collect()
    gc.freeze()
    counting = compiles.install()  # each step's compiles: time/compile, compile/graphs (utils/progress.py)
    rl = cfg.rl_config
    out = rl.output_dir
    ms.set_context(mode=ms.GRAPH_MODE)

    from mindgrpo.parallel.placement import placement_for

    try:
        placement = placement_for(cfg, options.use_parallel)  # under msrun: communication initialised, rank guarded
    except ValueError as e:  # a layout that does not fit the world, a placement that needs msrun
        raise SetupError(str(e)) from None
    rank = placement.rank
    if options.only_save_strategy:
        from mindgrpo.parallel.placement import save_strategies

        for path in save_strategies(cfg, out):
            print(path)
        return 0

    os.makedirs(out, exist_ok=True)
    setup_logging(out, rank)
    logger.info("config %s, output %s", options.config_path, out)
    np.random.seed(rl.seed)
    ms.set_seed(rl.seed)
    if placement.rollout_rank:  # generate_config.placement separate: this rank only generates (docs/async.md)
        try:
            worker = builder.build_rollout(cfg, options.paths, placement)
        except (ConfigError, OSError, KeyError, ValueError) as e:
            raise SetupError(e.args[0] if isinstance(e, KeyError) and e.args else str(e)) from None
        # its tool workers: worker.run starts them and closes them at its end
        close_conversations_on_sigterm(worker.conversations, options.use_parallel)
        resumed = options.resumed
        worker.run(resumed=resumed, warm_start=cfg.sft_config.steps > 0 and not resumed)  # as rank 0's
        logger.info("rollout rank done")
        return 0
    try:
        parts = builder.build(cfg, options.paths, placement)
    except (ConfigError, OSError, KeyError, ValueError) as e:
        raise SetupError(e.args[0] if isinstance(e, KeyError) and e.args else str(e)) from None

    metrics_log = MetricsLogger(out, rank=rank, console=False)  # the progress line is the console view
    progress = Progress(rl.max_steps, compiles=compiles.totals if counting else None)
    trainer = builder.make_trainer(cfg, parts, metrics_log, progress, out)
    trainer.save_data_file = options.save_data_file
    parts.rewards.start()  # the reward workers start while the first rollout compiles
    conversations = parts.conversations
    if conversations is not None:
        conversations.start()  # the tool workers too
    close_conversations_on_sigterm(conversations, options.use_parallel)
    resumed = options.resumed
    start_from_checkpoint(trainer, options.resume_from, resumed, options.allow_config_change)
    if resumed:
        metrics_log.truncate_after(trainer.step + 1)  # keep what the checkpointed steps logged
        if placement.remote_rollout:  # the rollout rank goes on from the step and prompt position restored
            drawn = trainer.partial  # partial rollouts (DrawnPrompts): the prompts drawn and those in flight too
            position = (trainer.step, *(trainer.train_prompts.state()[k] for k in ("epoch", "index")))
            placement.meeting.start((*position, 0 if drawn is None else drawn.drawn),
                                    None if drawn is None else drawn.in_flight())
    if rank == 0:  # checkpoints/tokenizer: generate.py and evaluate.py find it for checkpoints/step_N/policy.ckpt
        write_run_tokenizer(parts.tokenizer, checkpoint_root(cfg, out))
    if not resumed and cfg.sft_config.steps > 0:
        sft = cfg.sft_config
        with base_trains(parts.policy):  # LoRA: the warm start trains the base, the adapters after it
            m = sft_warm_start(parts.policy, parts.train_prompts, parts.tokenizer, steps=sft.steps, lr=sft.lr,
                               batch_size=sft.batch_size, micro_batch_size=cfg.actor_config.micro_batch_size,
                               seed=rl.seed, teacher_carry_error=sft.teacher_carry_error,
                               grad_reducer=parts.grad_reducer, pipeline=parts.pipeline,
                               # the synthetic task with tools: the teacher's conversations (grpo/sft.tool_targets)
                               tool_turns=parts.conversations.turns if parts.conversations is not None
                               and parts.conversations.kind == "tools" and rl.dataset_path is None else None,
                               tool_call_rate=sft.teacher_tool_call_rate)
        if trainer.lora is not None:
            trainer.lora.base_changed()  # the checkpoints write the warm-started base once and refer to it
            trainer.sync_base()  # an inference copy takes the warm-started base; the sync moves the adapters
        trainer.sync_now()  # the engine starts from the warm-started weights (off_policy_steps: so does its lag)
        if parts.ref_sync is not None:
            parts.ref_sync()  # the reference is the warm-started policy
        logger.info("sft warm start done: %s", json.dumps(m))
        # the warm start's weights are a checkpoint of step 0: a crash in the first steps resumes from them (--resume)
        # instead of warming up again, and another run can start from them (--sft_path_train .../policy.ckpt)
        logger.info("the warm-started policy: checkpoint %s", trainer.save())

    t0 = time.perf_counter()
    ticker = Ticker(progress, logger.info, interval_s).start()  # a line a minute while a step runs for minutes
    try:
        trainer.fit()
    except TrainingStopped as e:
        metrics_log.close()
        logger.error("%s", e)
        return 1
    except Restart:  # the checkpoint is saved: the caller continues in a fresh process (grpo/recycle.py)
        metrics_log.close()
        raise
    finally:
        ticker.stop()
        parts.rewards.close()  # the reward workers (also stopped at exit)
        if conversations is not None:
            conversations.close()  # the tool workers and their scratch folders (also at exit and on SIGTERM)
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
