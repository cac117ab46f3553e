"""The one-stage GRPO loop: rollout, reward, advantage, reference, update, sync, log.

The trainer is given its parts (`mindgrpo/grpo/builder.py` makes them): the policy being trained,
the inference model that generates (its own copy of the weights, in its own layout; where the
layouts match, the policy model itself, and the weight sync moves nothing), the reference model
(None when beta == 0), a rollout engine, a weight sync, a swap manager, the reward set, the prompt
sources and a metrics logger. Each step method below is one phase.
"""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from dataclasses import asdict, replace
from typing import Dict, List, Optional

import numpy as np
import mindspore as ms

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.grpo import algos
from mindgrpo.grpo.actor import PolicyUpdater, Scorer
from mindgrpo.grpo.conversations import merge_replicas
from mindgrpo.grpo.experience import Experience, pack
from mindgrpo.grpo.lora_checkpoint import LoraCheckpoint
from mindgrpo.grpo.off_policy import LaggedSync, sample_versions, staleness
from mindgrpo.grpo.partial import IN_FLIGHT, METRICS as PARTIAL_METRICS, DrawnPrompts, PartialRollouts
from mindgrpo.grpo.partial_conversations import PartialConversations
from mindgrpo.grpo.optim import AdamWSettings, lr_at
from mindgrpo.grpo.packing import Batching
from mindgrpo.grpo.prompts import PromptBatch, PromptSource
from mindgrpo.grpo.recycle import MemoryWatch, Restart
from mindgrpo.grpo.rollouts import Rollouts, rollout_metrics, save_experience
from mindgrpo.grpo.throughput import DEFAULT_PEAK_TFLOPS, PHASES, model_shape, perf_metrics, update_flops
from mindgrpo.grpo.train_graph import MAXIMA
from mindgrpo.grpo.validation import Best, val_metrics
from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.memory.policy import MemoryPolicy
from mindgrpo.models.lora import adapters_off, lora_spec
from mindgrpo.parallel.checkpoint_folders import BEST, CheckpointError
from mindgrpo.parallel.checkpoints import LocalCheckpoints, checkpoint_root
from mindgrpo.rewards.combine import add_model_scores
from mindgrpo.utils import heartbeat, host_memory

logger = logging.getLogger(__name__)

class TrainingStopped(Exception):
    """rl_config.max_bad_steps steps in a row had a non-finite loss or gradient norm."""


def sampling_params(gen, n: int, seed: int, stop_ids: tuple, greedy: bool = False) -> SamplingParams:
    """The rollout's sampling by generate_config `gen`: n samples a prompt, the random streams of `seed`."""
    return SamplingParams(max_tokens=gen.max_tokens, temperature=0.0 if greedy else gen.temperature,
                          top_k=gen.top_k, top_p=gen.top_p, min_p=gen.min_p, n=n, stop_token_ids=stop_ids, seed=seed)


def validation_request(rl, gen, val_prompts: PromptSource, stop_ids: tuple) -> tuple:
    """(the held-out prompts a validation generates for, its sampling): the first rl_config.val_size prompts,
    rl_config.val_n samples each at val_temperature (greedy at 0). The trainer's and the rollout rank's."""
    batch = val_prompts.take(range(min(rl.val_size, len(val_prompts))))
    params = sampling_params(gen, rl.val_n, seed=0, stop_ids=stop_ids, greedy=rl.val_temperature == 0)
    if rl.val_temperature > 0:
        params = replace(params, temperature=rl.val_temperature)
    return batch, params


def rollout_seed(sample_seed: int, step: int, rounds: int = 0) -> int:
    """The sampling seed of step `step` (steps done before it) and its dynamic-sampling round."""
    return int(np.random.SeedSequence([sample_seed, step, rounds]).generate_state(1)[0])


def spread_groups(rewards, group: int) -> np.ndarray:
    """(groups,) bool: the groups (`group` adjacent samples each) whose fp32 rewards are not all equal, the ones
    dynamic sampling keeps (a group without a spread has advantages 0). The trainer's `collect` and a separate
    placement's rollout ranks (grpo/rollout_worker.py) decide by it, so the two sides count alike."""
    return np.asarray(rewards, np.float32).reshape(-1, group).std(-1) > 0


def resample_count(want: int, have: int, rounds: int, max_resample_times: int) -> int:
    """Dynamic sampling (DAPO): how many prompts the next rollout of a step draws, after `rounds` rollouts kept `have`
    groups with a spread of rewards of the `want` a step trains; 0 when the step is complete (enough groups, or
    max_resample_times further rollouts done). The trainer's `collect` and a separate placement's rollout ranks
    (grpo/rollout_worker.py) decide by it."""
    return 0 if have >= want or rounds > max_resample_times else want - have


def stop_ids_of(tokenizer, gen) -> tuple:
    """The rollout's stop token ids: the tokenizer's and generate_config.stop_token_ids."""
    return tuple(sorted(set(tokenizer.stop_token_ids) | set(gen.stop_token_ids)))


class GRPOTrainer:
    def __init__(self, cfg: GRPOConfig, *, policy, inference, reference, engine: RolloutEngine, sync,
                 ref_sync, memory, rewards, tokenizer, train_prompts: PromptSource,
                 val_prompts: Optional[PromptSource], metrics_log, progress, output_dir: str,
                 rank: int = 0, grad_reducer=None, save_data_file: Optional[str] = None, checkpoints=None,
                 pipeline=None, ref_pipeline=None, reward_models=None, memory_policy: Optional[MemoryPolicy] = None,
                 base_path: Optional[str] = None, conversations=None, lora: Optional[LoraCheckpoint] = None,
                 base_sync=None):
        self.cfg = cfg
        # generate_config.tools / environment: the engine's conversation turns (grpo/conversations.py), None without
        self.conversations = conversations
        self.conversation_stats: Dict[str, float] = {}  # of the last generate call
        # the memory savers on: the builder's resolved rl_config.memory, else the config's explicit switches
        self.memory_policy = mp = memory_policy or MemoryPolicy.of_config(cfg)
        rl, actor, gen = cfg.rl_config, cfg.actor_config, cfg.generate_config
        self.policy, self.inference, self.reference = policy, inference, reference
        self.engine, self.sync, self.ref_sync, self.memory = engine, sync, ref_sync, memory
        self.rewards, self.tokenizer = rewards, tokenizer
        self.reward_models = reward_models  # grpo/reward_models.ModelRewards, or None
        self.train_prompts, self.val_prompts = train_prompts, val_prompts
        self.log, self.progress, self.output_dir, self.rank = metrics_log, progress, output_dir, rank
        self.save_data_file = save_data_file
        self.checkpoints = checkpoints or LocalCheckpoints(checkpoint_root(cfg, output_dir), rl.keep_last_k)
        self.G = rl.num_generations
        self.needs_old = rl.num_iterations > 1 or rl.num_mini_batches > 1
        # every log-prob is of the distribution the rollouts sample: softmax(logits / T)
        temperature = gen.temperature if gen.temperature > 0 else 1.0
        chunk = actor.logprob_chunk_size
        device = ms.get_context("device_target")
        cfg.check_device(device)
        # perf/*: the run's devices and one device's peak (mindgrpo/grpo/throughput.py)
        self.devices = actor.parallel_config.world_size
        self.peak_tflops = rl.device_peak_tflops or DEFAULT_PEAK_TFLOPS.get(device, DEFAULT_PEAK_TFLOPS["CPU"])
        self.step_lengths = ([], [])  # the trained batch's prompt and response lengths (B,) each
        # micro-batches (mindgrpo/grpo/packing.py): the update and the old log-probs by actor_config, the reference
        # pass by its own budget
        batching = dict(max_tokens=actor.max_tokens_per_micro_batch, packing=actor.packing,
                        attention=actor.packed_attention, shared_prefix=actor.shared_prefix)
        # old log-probs: the rollout engine's (old_logprobs_from_rollout), else a scoring pass when the
        # policy changes between the rollout and an update, else the update's own with the gradient stopped
        self.updater = PolicyUpdater(
            policy, self._loss(), Batching(actor.micro_batch_size, **batching),
            detach_old=not (self.needs_old or rl.old_logprobs_from_rollout), use_ref=rl.beta > 0,
            optimizer=AdamWSettings.of_actor(actor), memory=mp, grad_reducer=grad_reducer, temperature=temperature,
            chunk=chunk, pipeline=pipeline, old_is_training=not rl.old_logprobs_from_rollout, seed=rl.seed)
        # LoRA (docs/lora.md): the reference is the policy with its adapters off (`adapters_off`), no copy; the
        # checkpoints hold the adapters and refer to the base (`lora`: the builder's, which knows the placement);
        # base_sync moves the base into an inference copy when it changed (the sync moves the adapters only)
        if lora is None and lora_spec(policy):
            lora = LoraCheckpoint(policy, self.checkpoints.root, base_path)
        self.lora, self.base_sync = lora, base_sync
        self.base_loaded = lora.base_path if lora is not None else None  # what an inference copy was loaded from
        self.ref_is_base = reference is None and self.lora is not None and rl.beta > 0
        scored = policy if self.ref_is_base else reference
        self.ref_scorer = Scorer(scored, actor.micro_batch_size, temperature, chunk,
                                 pipeline if self.ref_is_base else ref_pipeline,  # the policy's stages, or the ref's
                                 **dict(batching, max_tokens=cfg.ref_config.max_tokens(actor)),
                                 layerwise=mp.reference_layerwise) \
            if scored is not None else None
        self.old_scorer = Scorer(policy, actor.micro_batch_size, temperature, chunk, pipeline, **batching) \
            if self.needs_old and not rl.old_logprobs_from_rollout else None
        self.total_optimizer_steps = rl.max_steps * rl.num_iterations * rl.num_mini_batches
        self.stop_ids = stop_ids_of(tokenizer, gen)
        self.sample_seed = rl.seed if gen.seed is None else gen.seed
        self.step = 0
        # rl_config.off_policy_steps (mindgrpo/grpo/off_policy.py): the inference copy synced that many updates late
        self.off_policy_steps = rl.off_policy_steps
        self.lagged = None
        if rl.off_policy_steps > 0 and gen.placement == "colocated":  # separate: the schedule makes the lag
            if inference is policy:
                raise ValueError("rl_config.off_policy_steps > 0 needs an inference copy of its own (the engine's "
                                 "weights lag the policy's); the builder makes one")
            self.lagged = LaggedSync(sync, policy, rl.off_policy_steps)
        # generate_config.partial_rollout (mindgrpo/grpo/partial.py): the groups in flight between steps (separate
        # placement: the rollout rank keeps them, this rank the prompts drawn for them)
        self.partial = None if not gen.partial_rollout else DrawnPrompts(self.G) if gen.placement == "separate" \
            else PartialRollouts(self.G, gen.max_tokens)
        # with conversations: their calls, and what an unfinished one keeps between steps (grpo/partial_conversations)
        self.partial_conversations = PartialConversations(conversations, tokenizer) \
            if isinstance(self.partial, PartialRollouts) and conversations is not None else None
        self.val_history: List[float] = []
        self.best = Best(rl.save_best) if rl.save_best else None
        # steps with a skipped update (non-finite loss or gradient norm): in all, and the last ones in a row
        self.bad_steps = {"total": 0, "in_a_row": 0}
        # a fresh process when the resident memory grows (release_graphs compiles every step: mindgrpo/grpo/recycle.py)
        growth = rl.restart_on_memory_growth
        self.memory_watch = MemoryWatch(growth) if mp.release_graphs and growth > 0 and self.devices == 1 \
            and gen.placement == "colocated" else None  # one process only
        memory.register("grads", extra_bytes=self.updater.buffer.nbytes())
        memory.register("optimizer", self.updater.resident_parameters())

    def _loss(self):
        from mindgrpo.grpo.ms_objective import GRPOLoss

        rl = self.cfg.rl_config
        return GRPOLoss(beta=rl.beta, kl_kind=rl.kl_kind, agg_mode=rl.loss_agg_mode,
                        max_len=self.cfg.generate_config.max_tokens, policy_loss=rl.policy_loss,
                        top_entropy_quantile=rl.top_entropy_quantile, rollout_correction=rl.rollout_correction,
                        rollout_correction_threshold=rl.rollout_correction_threshold,
                        **rl.settings(algos.POLICY_LOSSES, rl.policy_loss))

    # ------------------------------------------------------------------ phases
    def sampling(self, n: int, seed: int, greedy: bool = False) -> SamplingParams:
        return sampling_params(self.cfg.generate_config, n, seed, self.stop_ids, greedy)

    def generate(self, batch: PromptBatch, params: SamplingParams) -> tuple:
        """(the batch as generated, the engine's completions, their per-sample columns): conversations give columns
        (tool_calls, messages; an environment's env_reward, env_done, messages) and an environment writes the
        prompts (its resets of the rows' `prompt` text), so the batch's ids are its; self.conversation_stats gets
        the call's tool/ (env/) and turns/ metrics."""
        conv = self.conversations
        if conv is None:
            return batch, self.engine.generate(batch.ids, params), {}
        ids, comps, columns, self.conversation_stats = conv.generate(self.engine, batch.ids, batch.columns["prompt"],
                                                                     params, self.tokenizer)
        return PromptBatch(ids, batch.columns), comps, columns

    def rollout(self, batch: PromptBatch, seed: int) -> Rollouts:
        with self.progress.phase("rollout"), self.memory.phase("rollout"):
            batch, comps, row_columns = self.generate(batch, self.sampling(self.G, seed))
        self.progress.add_tokens("rollout", self.engine.last_stats["new_tokens"])
        texts = self.tokenizer.decode_batch([c.token_ids for c in comps], skip_special_tokens=True)
        return Rollouts(batch, comps, texts, self.G, row_columns)

    def reward(self, r: Rollouts) -> Dict[str, float]:
        with self.progress.phase("reward"):
            total, per_fn, metrics = self.rewards(r.texts, **r.columns)
        if self.reward_models is not None:
            with self.progress.phase("reward_model"), self.memory.phase("reward_model"):
                scores, model_metrics = self.reward_models(r.prompt_ids, [c.token_ids for c in r.completions],
                                                           r.columns)
            self.release(self.reward_models)
            total, per_fn, metrics = add_model_scores(total, per_fn, metrics, scores, self.reward_models.weights)
            metrics.update(model_metrics)
            for name, answers in self.reward_models.last_answers.items():  # logged with the completions
                r.row_columns[f"judge/{name}"] = r.columns[f"judge/{name}"] = answers
        r.rewards, r.per_function = total.astype(np.float32), per_fn
        return metrics

    def collect(self) -> tuple:
        """Rollout + reward, with DAPO's dynamic sampling when enabled: groups whose rewards are
        all equal teach nothing and are replaced by fresh prompts, for up to max_resample_times
        extra rounds; if still short, dropped groups fill the batch (their advantages are 0). With partial rollouts
        each round is a partial rollout of the groups still needed (`partial_round`): the dropped groups' prompts are
        spent (drawn, not trained, not back in flight)."""
        rl = self.cfg.rl_config
        want = count = rl.batch_size
        kept, dropped, metrics, rounds, have = [], [], {}, 0, 0
        figures: Dict[str, float] = {}  # partial rollouts: the step's (`partial_round`)
        while True:
            r, m = self.partial_round(count, rounds, figures) if self.partial is not None \
                else self.plain_round(count, rounds)
            if rounds == 0:
                metrics.update(m)
            if not rl.dynamic_sampling:
                kept.append(r)
                break
            informative = spread_groups(r.rewards, self.G)
            kept.append(r.groups(informative))
            dropped.append(r.groups(~informative))
            have = sum(len(k.batch.ids) for k in kept)
            rounds += 1
            # separate placement: the rollout ranks' count (they decided when they generated the step), or this one
            # told to them (reward models: they score here)
            count = self.engine.next_round(resample_count(want, have, rounds, rl.max_resample_times))
            if not count:
                break
        if self.partial is not None:  # continued samples summed over the rounds, what stays in flight the last's
            metrics.update({f"partial/{k}": float(figures[k]) for k in PARTIAL_METRICS})
        if not rl.dynamic_sampling:
            return kept[0], metrics
        r = Rollouts.concat([k for k in kept + dropped if len(k)])
        r = r.groups(np.arange(len(r.batch.ids)) < want)
        metrics.update({"dynamic_sampling/rounds": rounds,
                        "dynamic_sampling/kept_groups": float(min(have, want))})
        return r, metrics

    def plain_round(self, count: int, rounds: int) -> tuple:
        """A rollout of `count` fresh prompts with the round's seed, rewarded: (its Rollouts, its metrics)."""
        batch = self.train_prompts.next(count)
        r = self.rollout(batch, rollout_seed(self.sample_seed, self.step, rounds))
        metrics = self.reward(r)
        metrics.update(rollout_metrics(r, self.engine.last_stats))
        metrics.update(self.conversation_stats)
        return r, metrics

    def partial_round(self, count: int, rounds: int, figures: Dict[str, float]) -> tuple:
        """generate_config.partial_rollout: the carried unfinished samples go on with the current weights (prefilled
        again), then fresh prompts, twice the groups still needed, until `count` groups are complete; the round takes
        the oldest `count` complete groups, the rest stays in flight (mindgrpo/grpo/partial.py; under a separate
        placement the rollout rank does that and hands over the groups). Round r's seeds are rollout_seed(.., 2r) (fresh
        prompts) and (.., 2r + 1) (continuations): round 0's those of a run without dynamic sampling. figures: the
        step's partial/ figures so far, updated (continued_samples summed, the rest this round's)."""
        seeds = (rollout_seed(self.sample_seed, self.step, 2 * rounds),
                 rollout_seed(self.sample_seed, self.step, 2 * rounds + 1))
        with self.progress.phase("rollout"), self.memory.phase("rollout"):
            conv = {"conversations": self.partial_conversations} if self.partial_conversations is not None else \
                {"turns": self.conversations.turns} if self.conversations is not None else {}  # separate: the rows
            batch, comps, step_figures = self.partial.step(self.engine, self.train_prompts, count, self.sampling,
                                                           seeds, **conv)
        self.progress.add_tokens("rollout", int(step_figures["new_tokens"]))
        texts = self.tokenizer.decode_batch([c.token_ids for c in comps], skip_special_tokens=True)
        columns, self.conversation_stats = ({}, {}) if self.partial_conversations is None \
            else self.partial_conversations.last
        if self.conversations is not None and self.partial_conversations is None:  # separate: the rollout ranks'
            values = [v for v in self.conversations.meeting.values(None) if v is not None]
            ids, columns, self.conversation_stats = merge_replicas(values, len(batch.ids))
            batch = PromptBatch(ids, batch.columns)  # as generated (an environment's resets); drawn: the check's
        r = Rollouts(batch, comps, texts, self.G, columns)
        metrics = self.reward(r)
        metrics.update(rollout_metrics(r, self.engine.last_stats))
        metrics.update(self.conversation_stats)
        continued = figures.get("continued_samples", 0.0) + float(step_figures["continued_samples"])
        figures.update({k: float(step_figures[k]) for k in PARTIAL_METRICS}, continued_samples=continued)
        return r, metrics

    def advantages(self, r: Rollouts) -> tuple:
        rl = self.cfg.rl_config
        estimate = algos.ADVANTAGES.get(rl.adv_estimator)
        return estimate(r.rewards, self.G, **rl.settings(algos.ADVANTAGES, rl.adv_estimator))

    def stale(self, r: Rollouts) -> tuple:
        """With off_policy_steps k > 0: (keep (B,) bool, the staleness/ metrics) of the samples against the policy
        before this update (a sample staler than rl_config.max_staleness is dropped from the loss); else (None, {})."""
        oldest = sample_versions([c.versions for c in r.completions]) if self.off_policy_steps else None
        if oldest is None:
            return None, {}
        return staleness(oldest, self.step, self.cfg.staleness_bound())

    def build_experience(self, r: Rollouts, adv: np.ndarray, fresh: Optional[np.ndarray] = None) -> Experience:
        """fresh (B,) bool: the samples within the staleness bound (`stale`), the others masked; None: all."""
        keep = fresh
        if self.cfg.rl_config.overlong_filtering:
            within = np.array([c.finish_reason != "length" for c in r.completions])
            keep = within if keep is None else keep & within
        with_logp = all(c.logprobs is not None for c in r.completions)
        return pack(r.prompt_ids, [c.token_ids for c in r.completions], adv,
                    pad_id=self.tokenizer.pad_token_id, loss_mask=keep,
                    rollout_logp=[c.logprobs for c in r.completions] if with_logp else None,
                    sampling_logp=[c.sampling_logprobs for c in r.completions] if with_logp else None,
                    response_masks=[c.model_mask for c in r.completions])

    def release(self, part) -> None:
        """With rl_config.release_graphs: a phase's compiled graphs (and the buffers the runtime keeps for
        them) dropped when the phase ends; `part` is the engine, a scorer, the updater or the reward models."""
        if self.memory_policy.release_graphs and part is not None:
            part.release()

    def reference_logprobs(self, exp: Experience) -> None:
        if self.ref_scorer is not None:
            with self.memory.phase("reference"), adapters_off(self.policy) if self.ref_is_base else nullcontext():
                exp.ref_logp = self.ref_scorer(exp)
            self.release(self.ref_scorer)

    def old_logprobs(self, exp: Experience) -> None:
        if self.cfg.rl_config.old_logprobs_from_rollout:
            if exp.rollout_logp is None:
                raise ValueError("rl_config.old_logprobs_from_rollout needs the rollout engine's log-probs of the "
                                 "sampled tokens, and this engine returned none")
            exp.old_logp = exp.rollout_logp
        elif self.old_scorer is not None:
            with self.memory.phase("old_logprobs"):
                exp.old_logp = self.old_scorer(exp)
            self.release(self.old_scorer)

    def update(self, exp: Experience) -> Dict[str, float]:
        rl, actor = self.cfg.rl_config, self.cfg.actor_config
        if rl.rollout_correction != "none" and exp.sampling_logp is None:
            raise ValueError(f"rl_config.rollout_correction={rl.rollout_correction} needs the rollout engine's "
                             "log-probs of the distribution it sampled from, and this engine returned none")
        rows = len(exp) // rl.num_mini_batches
        order = np.random.default_rng([rl.seed, self.step]).permutation(len(exp)) if rl.num_mini_batches > 1 \
            else np.arange(len(exp))
        results = []
        with self.memory.phase("update"):
            for i in range(rl.num_iterations):
                for k in range(rl.num_mini_batches):
                    lr = lr_at(self.updater.optimizer_steps, actor.lr, self.total_optimizer_steps,
                               actor.warmup_steps, actor.lr_schedule, actor.min_lr)
                    # with release_graphs the step's last update drops its training graphs before the optimizer
                    # step: their buffers go before AdamW's are made
                    last = self.memory_policy.release_graphs and i == rl.num_iterations - 1 and \
                        k == rl.num_mini_batches - 1
                    results.append(self.updater.update(exp.select(np.sort(order[k * rows:(k + 1) * rows])), lr,
                                                       release=last))
        self.release(self.updater)
        skipped = sum(m.pop("skipped") for m in results)
        out = {k: float((np.max if k in MAXIMA else np.mean)([m[k] for m in results])) for k in results[0]}
        out["lr"] = results[-1]["lr"]
        out["train/skipped_updates"] = float(skipped)
        if "mismatch/log_ppl_ratio" in out:  # training perplexity / rollout perplexity of the sampled tokens
            out["mismatch/ppl_ratio"] = float(np.exp(out["mismatch/log_ppl_ratio"]))
        return out

    def sync_weights(self) -> Dict[str, float]:
        """After update self.step + 1: the inference weights (with off_policy_steps k: those of update
        self.step + 1 - k) and their version stamped on the engine."""
        with self.memory.phase("sync"):
            if self.lagged is None:
                m, version = self.sync(), self.step + 1
            else:
                m, version = self.lagged(self.step + 1)
        self.engine.version = version
        every = self.cfg.rl_config.ref_model_sync_steps
        if self.ref_sync is not None and every and (self.step + 1) % every == 0:
            m.update({f"ref_{k}": v for k, v in self.ref_sync().items()})
        return m

    def sync_now(self) -> None:
        """The inference copy set to the policy as it is now (after a warm start or a resume), version self.step;
        with off_policy_steps the lag starts again from it (no older version is at hand)."""
        self.sync()
        self.engine.version = self.step
        if self.lagged is not None:
            self.lagged.restart(self.step)

    # ------------------------------------------------------------------ the step
    def check_spread(self, r: Rollouts, metrics: Dict[str, float]) -> bool:
        """Whether the step updates: a step whose groups all have equal rewards (zero spread: advantages 0) is said
        in the console; with dynamic sampling, which then kept no group, it does not update on nothing (the step
        still counts, as a no-update step: dynamic_sampling/no_update 1, weights and optimizer state unchanged)."""
        rl = self.cfg.rl_config
        spread = spread_groups(r.rewards, self.G)
        metrics["train/groups_with_reward_spread"] = float(spread.sum())
        if rl.dynamic_sampling:
            metrics["dynamic_sampling/no_update"] = float(not spread.any())
        if spread.any():
            return True
        if rl.dynamic_sampling:
            logger.warning("step %d: dynamic sampling kept no group in %d rounds (every group's rewards were equal): "
                           "no update this step (weights and optimizer state unchanged)", self.step + 1,
                           int(metrics["dynamic_sampling/rounds"]))
            return False
        logger.warning("step %d: every group's rewards are equal (zero spread in all %d groups): its advantages are 0 "
                       "and the policy loss teaches nothing", self.step + 1, len(spread))
        return True

    def train_step(self) -> Dict[str, float]:
        p = self.progress
        r, metrics = self.collect()
        self.release(self.engine)  # after all of dynamic sampling's rounds, which share the graphs
        self.step_lengths = ([len(p) for p in r.prompt_ids], [len(c.token_ids) for c in r.completions])
        fresh, stale_metrics = self.stale(r)
        metrics.update(stale_metrics)
        if not self.check_spread(r, metrics):
            metrics["train/skipped_updates"] = 0.0  # not a bad step: nothing to update on
            # the version still counts the step: the engine's lag moves on (separate: the rollout ranks wait for it)
            if self.lagged is not None or self.cfg.generate_config.placement == "separate":
                with p.phase("sync"):
                    metrics.update(self.sync_weights())
            self.maybe_log_completions(self.running_step, r)
            return metrics
        with p.phase("advantage"):
            adv, adv_metrics = self.advantages(r)
            exp = self.build_experience(r, adv, fresh)
        with p.phase("ref"):
            self.reference_logprobs(exp)
        with p.phase("old"):
            self.old_logprobs(exp)
        with p.phase("update"):
            metrics.update(self.update(exp))
        with p.phase("sync"):
            metrics.update(self.sync_weights())
        metrics.update({f"advantage/{k}": float(v) for k, v in adv_metrics.items()})
        self.maybe_log_completions(self.running_step, r)
        if self.save_data_file and self.rank == 0:
            save_experience(self.save_data_file, self.running_step, r, exp)
        return metrics

    def validate(self) -> Dict[str, float]:
        """rl_config.val_n samples per validation prompt at val_temperature (greedy at 0), scored by
        `accuracy` (mindgrpo/grpo/validation.py)."""
        if self.val_prompts is None:
            return {}
        rl = self.cfg.rl_config
        batch, params = validation_request(rl, self.cfg.generate_config, self.val_prompts, self.stop_ids)
        with self.progress.phase("validate"), self.memory.phase("validate"):
            batch, comps, row_columns = self.generate(batch, params)
        self.release(self.engine)
        texts = self.tokenizer.decode_batch([c.token_ids for c in comps], skip_special_tokens=True)
        columns = {k: [v[c.prompt_index] for c in comps] for k, v in batch.columns.items()}
        columns.update(row_columns)
        _, per_fn, _ = self.rewards(texts, **columns, completion_length=[len(c.token_ids) for c in comps])
        if "accuracy" not in per_fn:
            from mindgrpo.rewards import get_reward
            per_fn["accuracy"] = np.array(get_reward("accuracy")(texts, **columns), np.float32)
        metrics = val_metrics(np.asarray(per_fn["accuracy"], np.float32), texts, rl.val_n)
        if self.conversations is not None:  # e.g. val/tool/calls_mean (how often the policy calls a tool), val/env/*
            metrics.update({f"val/{k}": v for k, v in self.conversation_stats.items()})
        if self.off_policy_steps > 0:  # validation runs on the engine's weights: off_policy_steps behind the policy's
            # (separate placement: the rollout rank's, whose figures name their version)
            metrics["val/policy_version"] = float(self.engine.last_stats.get("version", self.engine.version))
        self.val_history.append(metrics["val/accuracy"])
        return metrics

    def perf(self, metrics: Dict[str, float]) -> Dict[str, float]:
        """perf/* of the step just done from its lengths and phase times (validation not counted)."""
        prompts, responses = self.step_lengths
        seconds = {"step": metrics["time/step"] - metrics.get("time/validate", 0.0),
                   **{phase: metrics.get(f"time/{phase}", 0.0) for phase in PHASES}}
        if self.ref_scorer is None:  # beta 0: the phase ran empty
            seconds["ref"] = 0.0
        flops = update_flops([p + r for p, r in zip(prompts, responses)], responses,
                             passes=self.cfg.rl_config.num_iterations, **model_shape(self.policy.config))
        return perf_metrics(prompts, responses, self.devices, seconds, flops, self.peak_tflops)

    @property
    def running_step(self) -> int:
        """The step in flight, counted from 1: the number metrics.jsonl, completions.jsonl, --save_data_file and
        the progress lines give it (`self.step` counts the steps done)."""
        return self.step + 1

    def maybe_log_completions(self, step: int, r: Rollouts) -> None:
        """The first 2G completions of step `step` into completions.jsonl: at step 1 and every
        rl_config.completions_interval steps."""
        every = self.cfg.rl_config.completions_interval
        if not every or (step != 1 and step % every):
            return
        rows = []
        for i in range(min(len(r), 2 * self.G)):
            rows.append({"step": step, "prompt": r.columns.get("prompt", [""] * len(r))[i],
                         "completion": r.texts[i], "reward": float(r.rewards[i]),
                         "solution": r.columns.get("solution", [""] * len(r))[i],
                         **{k: v[i] for k, v in r.columns.items() if k.startswith("judge/")}})
        self.log.log_completions(step, rows)

    def sync_base(self) -> None:
        """LoRA with an inference copy: the policy's base weights into it, after they changed (the warm start, a
        resume); nothing otherwise."""
        if self.base_sync is not None:
            m = self.base_sync()
            self.base_loaded = self.lora.base_path
            logger.info("LoRA: the base weights moved into the inference copy (%.1f MB)",
                        m.get("sync/bytes", 0.0) / 2 ** 20)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_groups(self) -> Dict[str, list]:
        if self.lora is not None:  # the base is referred to (state.json lora_base), not copied
            return self.lora.groups(self.updater.state_parameters())
        groups = {"policy": list(self.policy.get_parameters()), "optimizer": self.updater.state_parameters()}
        if self.reference is not None:  # it may be the warm-started or a synced policy: not rebuildable
            groups["reference"] = list(self.reference.get_parameters())
        return groups

    def count_bad_step(self, metrics: Dict[str, float]) -> None:
        """A step whose updates were skipped (non-finite loss or gradient norm) is a bad step;
        rl_config.max_bad_steps of them in a row stop the run."""
        bad = metrics["train/skipped_updates"] > 0
        self.bad_steps = {"total": self.bad_steps["total"] + bad,
                          "in_a_row": self.bad_steps["in_a_row"] + 1 if bad else 0}
        metrics["train/bad_steps"] = float(self.bad_steps["total"])
        if bad:
            logger.warning("step %d: non-finite loss %s or gradient norm %s: its %d update(s) skipped (weights and "
                           "optimizer state unchanged)", self.step, metrics["loss"], metrics["grad_norm"],
                           int(metrics["train/skipped_updates"]))

    def check_bad_steps(self) -> None:
        n, limit = self.bad_steps["in_a_row"], self.cfg.rl_config.max_bad_steps
        if n >= limit:
            raise TrainingStopped(
                f"stopped at step {self.step}: {n} steps in a row (rl_config.max_bad_steps = {limit}) had a "
                f"non-finite loss or gradient norm and skipped their updates, so the weights are still those of step "
                f"{self.step - n}; look for nan/inf in the rewards and the data, or lower actor_config.lr, then "
                "--resume from the last checkpoint")

    def save(self, name: Optional[str] = None) -> str:
        """A checkpoint of this step: checkpoints/step_<N>, or with name="best" checkpoints/best."""
        state = {"step": self.step, "optimizer_steps": self.updater.optimizer_steps,
                 "train_prompts": self.train_prompts.state(), "val_history": self.val_history,
                 "bad_steps": self.bad_steps, "config": asdict(self.cfg)}
        if self.best is not None:
            state["best"] = self.best.state()
        if self.reward_models is not None:
            state["reward_norms"] = self.reward_models.state()
        extra = {"name": name} if name else {}
        writers = []  # files beside state.json: the PEFT adapter, the partial rollouts in flight
        if self.lora is not None:
            state["lora_base"] = self.lora.state()
            writers.append(self.lora.write_adapter)
        if self.partial is not None and self.rank == 0:  # the same groups on every training rank: one writes them
            writers.append(self.partial.write)  # (separate: the prompts in flight, DrawnPrompts; no samples)
        if writers:
            extra["extra"] = lambda folder: [rel for write in writers for rel in write(folder)]
        return self.checkpoints.save(self.step, self.checkpoint_groups(), state, self.policy.config.to_hf_dict(),
                                     **extra)

    def resume(self, path: str) -> dict:
        """Load the checkpoint at `path` into the models, the optimizer and the loop; returns its state.json."""
        state = self.checkpoints.load(path, self.checkpoint_groups(), self.policy.config.to_hf_dict())
        if self.lora is not None:
            if "lora_base" not in state:
                raise CheckpointError(f"checkpoint {path} was saved without LoRA (actor_config.lora_rank 0)")
            self.lora.restore(state["lora_base"], path)
            # a base the run wrote (warm-started, drawn at random); separate: always (the rollout rank expects it)
            if self.lora.base_path != self.base_loaded or self.cfg.generate_config.placement == "separate":
                self.sync_base()
        self.step = int(state["step"])
        self.updater.optimizer_steps = int(state["optimizer_steps"])
        self.train_prompts.load_state(state["train_prompts"])
        if self.partial is not None:  # the groups in flight at the save: drawn before, trained after
            self.partial.read(path)
        elif os.path.isfile(os.path.join(path, IN_FLIGHT)):
            logger.warning("%s: the checkpoint's partial rollouts in flight are dropped (generate_config."
                           "partial_rollout is off): their prompts are not trained", os.path.join(path, IN_FLIGHT))
        self.val_history = list(state["val_history"])
        self.bad_steps = {"total": int(state["bad_steps"]["total"]), "in_a_row": int(state["bad_steps"]["in_a_row"])}
        if self.best is not None and "best" in state:  # checkpoints of runs without save_best have none
            self.best.load_state(state["best"])
        missing = self.reward_models.load_state(state.get("reward_norms", {})) if self.reward_models else []
        if missing:
            raise CheckpointError(f"checkpoint {path} holds no running statistics of the normalised reward model(s) "
                                  f"{missing} (saved by a run with other reward_config.reward_models / judges)")
        self.sync_now()  # the inference copy follows the restored policy
        self.progress.start_at(self.step)
        logger.info("resumed from %s at step %d", path, self.step)
        return state

    # ------------------------------------------------------------------ the loop
    def fit(self) -> Dict[str, float]:
        rl = self.cfg.rl_config
        last: Dict[str, float] = {}
        if rl.val_interval and rl.val_before_train and self.step == 0:
            m = self.validate()
            self.log.log(0, m)
        while self.step < rl.max_steps:
            metrics = self.train_step()
            self.step += 1
            self.count_bad_step(metrics)
            if rl.val_interval and self.step % rl.val_interval == 0:
                metrics.update(self.validate())
            metrics.update(self.memory.step_metrics())
            metrics.update(host_memory.step_metrics())
            metrics.update(self.progress.step_done(self.step))
            metrics.update(self.perf(metrics))
            self.log.log(self.step, metrics)
            if self.step % rl.log_interval == 0 or self.step == rl.max_steps:
                shown = {k: metrics[k] for k in ("reward_mean", "loss", "kl", "grad_norm", "response_length/mean",
                                                 "tool/calls_mean", "val/accuracy") if k in metrics}
                if "perf/e2e_tokens_per_s_per_device" in metrics:
                    shown["e2e tok/s/device"] = metrics["perf/e2e_tokens_per_s_per_device"]
                if "staleness/mean" in metrics:  # rl_config.off_policy_steps
                    shown["staleness"] = metrics["staleness/mean"]
                if "async/generate_seconds" in metrics:  # generate_config.placement separate: both ranks' seconds
                    shown["rollout gen/idle s"] = f"{metrics['async/generate_seconds']:.1f}/" \
                                                  f"{metrics['async/wait_seconds']:.1f}"
                    shown["train idle s"] = f"{metrics['async/train_wait_seconds'] + metrics['sync/seconds']:.1f}"
                if "memory/host_resident_bytes" in metrics:  # the host process, resident now
                    shown["host"] = f"{metrics['memory/host_resident_bytes'] / 1e9:.2f} GB"
                logger.info(self.progress.line(self.step, shown))
            self.check_bad_steps()  # after logging the step, before saving it
            saved = (rl.save_interval and self.step % rl.save_interval == 0) or self.step == rl.max_steps
            restart = self.memory_watch is not None and self.step < rl.max_steps and self.memory_watch.due()
            if saved or restart:
                with heartbeat.phase("save"):  # barriers under msrun: the watchdog names this phase
                    self.save()
            if self.best is not None and self.best.update(metrics, self.step):
                with heartbeat.phase("save"):
                    self.save(BEST)
            last = metrics
            if restart:  # the recipe continues in a fresh process from the checkpoint just saved
                raise Restart(self.step, self.memory_watch.reason)
        return last
