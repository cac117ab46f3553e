"""A rollout rank of generate_config.placement separate (docs/async.md; the meetings: parallel/separate.py).

It draws the training rank's prompts in the same order (the same PromptSource, the same seeds), generates its share
of each step's samples with its inference copy (with R rollout ranks, generate_config.parallel_config.data_parallel,
rank D + i the i-th contiguous share of the groups, D the training ranks: `Meeting.share`; validation's prompts too)
and meets the training ranks (and the other rollout ranks) once for the samples and once for the new weights, in the
trainer's order: the first weights (version 0), then per step s its samples and the weights of update s. With
off_policy_steps 0 it generates step s + 1 after receiving update s (the ranks take turns, as a colocated run); with
k >= 1 it generates the steps up to s + k right after handing over step s, with the weights it has (those of update
s - 1), while update s trains, keeping what it generated ahead in a queue (`StepQueue`):

    training rank   W0 | S1  train 1  W1 | S2  train 2  W2 | S3 ...
    rollout (k=0)   W0  gen 1  S1 | W1  gen 2  S2 | W2  gen 3 ...
    rollout (k=1)   W0  gen 1  S1  gen 2 | W1  S2  gen 3 | W2  S3 ...
    rollout (k=2)   W0  gen 1  S1  gen 2  gen 3 | W1  S2  gen 4 | W2  S3  gen 5 ...

Step s then samples with version s - 1 - k (at least the first weights), a one-process run's LaggedSync, and the
rank holds one version of the weights at a time: the queue holds samples.

With sft_config.steps the training rank warm-starts after the first weights meeting and then meets again with the
warm-started weights (its `sync_now`, still version 0): this rank waits in that meeting. With LoRA (actor_config.
lora_rank) a weights meeting moves the adapters only, and the first one, the warm start's and a resume's are each
preceded by a meeting of the base weights (the training rank's `base_sync`): both ranks know which comes next from
where they are in the run. A validation (rl_config.val_interval, and at step 0 with val_before_train) is one more
samples meeting: this rank generates the held-out prompts with its weights, the training rank scores them. With
k = 0 it validates after receiving update s; with k >= 1 the validation after update s answers with update s - k
(generated while this rank holds those weights, queued until its meeting), as a colocated run's engine, k updates
behind.

With generate_config.partial_rollout this rank keeps the groups in flight (`partial.PartialRollouts`) and a step's
"gen" is its partial rollout with the weights it has, the same calls as one process; it hands over the step's
complete groups with their draw numbers (the training ranks keep the prompts drawn: `partial.DrawnPrompts`). With R
rollout replicas each keeps its own groups in flight and hands over its share of the step's groups (`Meeting.share`),
generating until it has them; the step's fresh prompts are drawn once for all replicas, in replica order, after a
meeting of the rollout ranks that tells each how many groups the others still need (`Meeting.replica_counts`); after a
resume each redraws its share of the groups in flight.

With conversations (generate_config.tools or environment) this rank runs those of its share of the prompts on its
own tool workers (started with `run`, closed at its end, on an error and on SIGTERM: `close`), each prompt keyed by
its index in the whole batch: a sample's rows carry its model mask and turns, and each samples meeting is followed by
a value meeting where every rollout rank gives its share's prompts as generated (an environment's resets), reward
columns (tool_calls, messages; env_reward, env_done) and tool/ or env/, and turns/ metrics (a
`conversations.ReplicaValue`; `grpo/conversations.RemoteConversations` on the training rank merges them). Its prompt
check names the prompts it drew, with conversations too (with partial rollouts an environment's groups keep them beside
the prompts its resets wrote): the training ranks check their draw against it.

With rl_config.dynamic_sampling this rank decides a step's rounds (`rounds`; with partial rollouts each round a
partial rollout of the groups still needed, `partial_round`) when it generates the step, with the
weights it has then (k steps ahead: every round of step s samples with version s - 1 - k, as in one process): it
scores each rollout of its share with the run's rule rewards (reward_config.verifier_function, the conversations'
reward columns), the rollout ranks sum their counts of groups with a spread of rewards (`Meeting.replica_counts`),
and the next round draws as many prompts as the trainer's `collect` would (`trainer.resample_count`), with the round's
seed, until the step is complete. The step's rounds wait in the queue together and are handed over in order, each a
samples meeting whose figure "more" says how many prompts the next one draws (0: the last); the training ranks follow
it and train on their own scores. With reward models or judges (scored on training rank 0 only; off_policy_steps 0)
the training ranks decide instead: a step's first rollout is handed over, then their count of prompts to draw again
(`Meeting.more_prompts`) and, while it is not 0, a further rollout of that many prompts (`hand_over`).
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from mindgrpo.grpo.conversations import ReplicaValue
from mindgrpo.grpo.partial import PartialRollouts, Replicas
from mindgrpo.grpo.partial_conversations import PartialConversations
from mindgrpo.grpo.prompts import PromptBatch, PromptSource
from mindgrpo.grpo.trainer import (resample_count, rollout_seed, sampling_params, spread_groups,
                                   validation_request)
from mindgrpo.parallel.data_parallel import row_width
from mindgrpo.parallel.separate import Meeting, prompt_check
from mindgrpo.parallel.weight_sync import named_parameters
from mindgrpo.utils import compiles, heartbeat
from mindgrpo.utils.progress import compiled_text

logger = logging.getLogger(__name__)


class Samples(NamedTuple):
    """What this rank hands over in a samples meeting: its completions (from row `first` of the call's `rows`, each
    `width` token slots), its figures, the groups' numbers (partial rollouts; None: their prompts' indices) and its
    conversations' `ReplicaValue` (None: no conversations, or a share of no prompts)."""
    comps: list
    figures: dict
    rows: int
    first: int
    width: int
    groups: Optional[list]
    value: Optional[object]


class RolloutWorker:
    def __init__(self, cfg, engine, model, prompts: PromptSource, meeting: Meeting, stop_ids: tuple,
                 val_prompts: Optional[PromptSource] = None, conversations=None, tokenizer=None,
                 lora: Optional[Tuple[List[str], List[str]]] = None, rewards=None):
        """lora: the names of the base weights and of the adapters (LoRA's two meetings), None without LoRA; rewards:
        the run's rule rewards (a `rewards.RewardSet`) when this rank decides dynamic sampling's rounds
        (`GRPOConfig.rollout_ranks_resample`), else None."""
        self.cfg, self.engine, self.prompts, self.meeting, self.stop_ids = cfg, engine, prompts, meeting, stop_ids
        self.val_prompts, self.rewards = val_prompts, rewards
        self.conversations, self.tokenizer = conversations, tokenizer  # grpo/conversations.Conversations, or None
        params = named_parameters(model)  # by path: the training rank's policy has the same paths
        base, moved = ([], list(params)) if lora is None else lora
        self.params = {n: params[n] for n in moved}  # every weights meeting
        self.base = {n: params[n] for n in base}  # LoRA: before the first, the warm start's and a resume's
        self.waited = 0.0  # seconds in meetings since the last samples were handed over
        gen = cfg.generate_config
        self.partial = PartialRollouts(cfg.rl_config.num_generations, gen.max_tokens) if gen.partial_rollout else None
        # partial rollouts with tools: the conversations carried between steps (grpo/partial_conversations.py)
        self.partial_conversations = PartialConversations(conversations, tokenizer) \
            if self.partial is not None and conversations is not None else None

    def receive(self, version: int, phase: str = "sync", whole: bool = False) -> None:
        """A weights meeting; whole: at the start, after the warm start or a resume (LoRA: the base first)."""
        t0 = time.perf_counter()
        with heartbeat.phase(phase):
            if whole and self.base:
                self.meeting.weights(self.base)
            self.meeting.weights(self.params)
        self.engine.version = version
        self.waited += time.perf_counter() - t0

    def generate(self, step: int) -> List[Samples]:
        """This rank's samples of step `step` (counted from 1) and the figures that go with them: one rollout, with
        dynamic sampling decided here each round's (`rounds`)."""
        with heartbeat.phase("rollout"):
            return self.rounds(step)

    def rounds(self, step: int) -> List[Samples]:
        """Step `step`'s rollouts with the weights this rank has (`plain_round`, with partial rollouts
        `partial_round`): the first of rl_config.batch_size prompts (groups), and with dynamic sampling decided here
        further ones as the trainer's `collect` runs them (as many as `resample_count` says from the groups with a
        spread of rewards so far, over every rollout rank: `spread`), each round's figure "more" its successor's
        prompts (0 on the last)."""
        rl = self.cfg.rl_config
        one_round = self.plain_round if self.partial is None else self.partial_round
        want = count = rl.batch_size
        out: List[Samples] = []
        have = 0
        while count:
            batch, samples = one_round(step, count, len(out))
            out.append(samples)
            if self.rewards is None:  # one rollout a step (or the training ranks decide: `hand_over`)
                break
            have += self.spread(batch, samples, local=self.partial is not None)
            count = resample_count(want, have, len(out), rl.max_resample_times)
            samples.figures["more"] = float(count)
        return out

    def plain_round(self, step: int, count: int, r: int) -> Tuple[PromptBatch, Samples]:
        """Round r of step `step`: `count` fresh prompts with the round's seed (this rank its share)."""
        rl, gen = self.cfg.rl_config, self.cfg.generate_config
        params = sampling_params(gen, rl.num_generations, rollout_seed(self.sample_seed, step - 1, r), self.stop_ids)
        t0 = time.perf_counter()
        batch = self.prompts.next(count)
        return batch, self.run_call(batch, params, t0)

    def partial_round(self, step: int, count: int, r: int) -> Tuple[PromptBatch, Samples]:
        """generate_config.partial_rollout: the trainer's `partial_round` r with this rank's weights, for this
        replica's share of the round's `count` groups (several replicas: each its own groups in flight, a round's
        fresh prompts drawn for all of them); round r's seeds rollout_seed(.., 2r) and (.., 2r + 1)."""
        rl, gen = self.cfg.rl_config, self.cfg.generate_config
        meeting, n = self.meeting, rl.num_generations
        replicas = Replicas(meeting.index, meeting.replicas, meeting.replica_counts) if meeting.replicas > 1 else None
        conv = {} if self.partial_conversations is None else {"conversations": self.partial_conversations}
        t0 = time.perf_counter()
        seeds = (rollout_seed(self.sample_seed, step - 1, 2 * r), rollout_seed(self.sample_seed, step - 1, 2 * r + 1))
        params = sampling_params(gen, n, seeds[0], self.stop_ids)
        mine = meeting.share(count)
        batch, comps, extra = self.partial.step(
            self.engine, self.prompts, len(mine), lambda k, seed: sampling_params(gen, k, seed, self.stop_ids),
            seeds, replicas, **conv)
        value = None
        if self.partial_conversations is not None and comps:  # what the conversations of its groups give besides
            columns, metrics = self.partial_conversations.last
            value = ReplicaValue(batch.ids, columns, metrics, len(comps), sum(len(c.token_ids) for c in comps))
        # the prompt check names the prompts as drawn (an environment's groups keep those it wrote in batch.ids)
        return batch, Samples(comps, self.figures(self.partial.taken_drawn, t0, self.engine.last_stats, extra),
                              count * n, int(mine[0]) * n if len(mine) else 0, self.width(params), self.partial.taken,
                              value)

    def spread(self, batch: PromptBatch, samples: Samples, local: bool = False) -> int:
        """How many of a rollout's groups have a spread of rewards (the trainer's `collect` keeps them), over the
        rollout group: each replica scores its share (its first rank; the run's rule rewards on what the trainer's
        `Rollouts` gives them: the texts, the prompts' dataset columns, completion_length, the conversations' reward
        columns), the counts summed over the rollout ranks (`Meeting.replica_counts`) when there are several. local:
        the batch is this replica's groups (partial rollouts), not the whole rollout's."""
        comps, n = samples.comps, self.cfg.rl_config.num_generations
        count = 0
        if self.meeting.hands_over and comps:
            mine = np.arange(len(batch.ids)) if local else self.meeting.share(len(batch.ids))
            texts = self.tokenizer.decode_batch([c.token_ids for c in comps], skip_special_tokens=True)
            columns = {k: [v[int(mine[c.prompt_index])] for c in comps] for k, v in batch.columns.items()}
            columns["completion_length"] = [len(c.token_ids) for c in comps]
            if samples.value is not None:  # conversations: tool_calls, messages; env_reward, env_done
                columns.update(samples.value.columns)
            total, _, _ = self.rewards(texts, **columns)
            count = int(spread_groups(total, n).sum())
        if self.meeting.comm.world - self.meeting.trainers > 1:  # several rollout ranks: the same decision on each
            count = sum(self.meeting.replica_counts(count))
        return count

    def run_call(self, batch, params, t0: float) -> Samples:
        """This rank's share of the batch's groups generated, each prompt keyed by its index in the batch (its samples'
        random streams: a one-process run's samples); with conversations, theirs run on this rank's workers."""
        conv, n = self.conversations, params.n
        mine = self.meeting.share(len(batch.ids))

        def generate(ids):  # a share of none: nothing generated
            turns = {} if conv is None else {"turns": conv.turns}
            return self.engine.generate(ids, params, prompt_index=mine, **turns) if len(mine) else []

        drawn = [batch.ids[k] for k in mine]  # the prompt check names them (the training ranks drew the same)
        if conv is None:
            comps, value = generate(drawn), None
        else:  # the prompts as generated: an environment's resets, keyed by their indices too
            comps, value = conv.generate_share(generate, lambda: self.engine.last_stats, batch.ids,
                                               batch.columns["prompt"], mine, self.tokenizer)
        stats = self.engine.last_stats if len(mine) else {"new_tokens": 0}
        return Samples(comps, self.figures(drawn, t0, stats), len(batch.ids) * n, int(mine[0]) * n if len(mine) else 0,
                       self.width(params), None, value)

    def width(self, params) -> int:
        return row_width(params, None if self.conversations is None else self.conversations.turns)

    def validation(self) -> Samples:
        """This rank's share of the held-out prompts' samples with this rank's weights, as the trainer's `validate`
        draws them."""
        rl, gen = self.cfg.rl_config, self.cfg.generate_config
        batch, params = validation_request(rl, gen, self.val_prompts, self.stop_ids)
        t0 = time.perf_counter()
        with heartbeat.phase("validate"):
            return self.run_call(batch, params, t0)

    def figures(self, ids, t0: float, stats: dict, extra: Optional[dict] = None) -> dict:
        """The figures of a generation of the prompts `ids` started at perf_counter `t0` (stats: the engine's last
        call's; extra: the partial rollout's)."""
        extra = extra or {}
        stats = dict(stats, **extra)  # partial: the step's new tokens, not its last call's
        figures = {k: float(stats.get(k, 0.0)) for k in ("useful_fraction", "slots_in_use", "kv_bytes",
                                                         "prefill_seconds", "decode_seconds", "decode_steps",
                                                         "compiled_graphs", *extra)}
        figures.update(new_tokens=float(stats["new_tokens"]), generate_seconds=time.perf_counter() - t0,
                       version=float(self.engine.version), prompt_check=prompt_check(ids))
        return figures

    def hand_over(self, rounds: List[Samples], step: int) -> None:
        """Step `step`'s rollouts, in order (with dynamic sampling decided here, each names the next one's prompts);
        with dynamic sampling decided by the training ranks (reward models or judges), then each further rollout of
        the step they ask for after rewarding the last (`Meeting.more_prompts`: how many prompts to draw again, 0 when
        the step is complete), each with the seed of its round, as the trainer's `collect` draws them."""
        for samples in rounds:
            self.send(samples)
        rl, gen = self.cfg.rl_config, self.cfg.generate_config
        count = len(rounds)
        while rl.dynamic_sampling and self.rewards is None:
            t0 = time.perf_counter()
            with heartbeat.phase("samples"):
                more = self.meeting.more_prompts()
            self.waited += time.perf_counter() - t0
            if not more:
                return
            params = sampling_params(gen, rl.num_generations, rollout_seed(self.sample_seed, step - 1, count),
                                     self.stop_ids)
            t0 = time.perf_counter()
            with heartbeat.phase("rollout"):
                samples = self.run_call(self.prompts.next(more), params, t0)
            self.send(samples)
            count += 1

    def send(self, samples: Samples, validation: bool = False) -> None:
        """A step's samples (or a validation's: its wait counts towards the next step's)."""
        t0 = time.perf_counter()
        figures = dict(samples.figures, wait_seconds=self.waited)
        n = self.cfg.rl_config.val_n if validation else self.cfg.rl_config.num_generations
        with heartbeat.phase("samples"):
            self.meeting.samples(samples.comps, samples.rows, n, samples.width, figures, samples.groups, samples.first)
            if self.conversations is not None:  # every rollout rank's ReplicaValue (RemoteConversations.generate)
                self.meeting.values(samples.value)
        self.waited = (self.waited if validation else 0.0) + time.perf_counter() - t0

    @property
    def sample_seed(self) -> int:
        rl, gen = self.cfg.rl_config, self.cfg.generate_config
        return rl.seed if gen.seed is None else gen.seed

    def resume(self) -> int:
        """After the training rank's --resume: the restored weights (its trainer's sync), then its step and prompt
        position (with partial rollouts, the prompts drawn and the groups in flight, generated again from scratch
        in the first step); the rollout goes on from them, the lag starting again from the restored weights (as a
        colocated run's). Returns the step."""
        self.receive(0, whole=True)
        (step, epoch, index, drawn), in_flight = self.meeting.start(None)
        self.prompts.load_state({"epoch": epoch, "index": index})
        if self.partial is not None:  # several replicas: each its share of them, in draw order
            numbers = sorted(in_flight)
            self.partial.redraw(self.prompts, drawn, [numbers[k] for k in self.meeting.share(len(numbers))])
        self.engine.version = step
        return step

    def validates(self, step: int) -> bool:
        """Whether the training rank validates after `step` updates (its `fit`)."""
        rl = self.cfg.rl_config
        if not rl.val_interval or self.val_prompts is None:
            return False
        return rl.val_before_train if step == 0 else step % rl.val_interval == 0

    def close(self) -> None:
        """The conversations' tool workers stopped, their folders removed, the rewards' worker pool stopped
        (idempotent)."""
        if self.conversations is not None:
            self.conversations.close()
        if self.rewards is not None:
            self.rewards.close()

    def run(self, resumed: bool = False, warm_start: bool = False) -> None:
        """Every meeting of the run, in the training rank's order (module docstring); resumed: the run continues a
        checkpoint (--resume); `warm_start`: the training rank runs the SFT warm start first. The conversations'
        workers run from its start to its end."""
        if self.conversations is not None:
            self.conversations.start()
        try:
            self.meet(resumed, warm_start)
        finally:
            self.close()

    def meet(self, resumed: bool, warm_start: bool) -> None:
        """The meetings of the run with off_policy_steps k: samples are generated in step order into a queue and
        handed over oldest first; before the weights meeting of update u the queue holds every step up to u + k
        (they need versions below u: step s samples with version s - 1 - k, at least the first), and so does the
        validation of every step up to u - 1 + k (the validation after update v answers with version v - k)."""
        rl = self.cfg.rl_config
        lag, last = rl.off_policy_steps, rl.max_steps
        counted = compiles.totals()  # each step's line says what the rank compiled since the last (utils/compiles.py)
        self.receive(0, whole=True)  # the builder's first sync on the training rank
        if warm_start:
            self.receive(0, "warm_start", whole=True)  # the warm-started weights (the training rank's sync_now)
        start = self.resume() if resumed else 0
        if start >= last:
            return
        if start == 0 and self.validates(0):  # the training rank validates before training only at step 0
            self.send(self.validation(), validation=True)
        queue = StepQueue(self, start, last)
        queue.generate(start + 1)
        for step in range(start + 1, last + 1):
            self.hand_over(queue.pop(step), step)
            queue.generate(step + lag)  # while update `step` trains, with the weights of update step - 1
            queue.validate(step - 1 + lag)
            self.receive(step)
            queue.validate(step)  # k = 0: with update `step`, now in
            checked = queue.checks.pop(step, None)
            if checked is not None:
                self.send(checked, validation=True)
            queue.generate(step + 1)  # k = 0: with update `step`; k >= 1: generated already
            now = compiles.totals()
            spent, counted = now - counted, now
            logger.info("rollout rank: step %d handed over; weights of update %d in; %d steps ahead; waited %.2f s%s",
                        step, step, len(queue.samples), self.waited,
                        f"; {compiled_text(spent)}" if spent.graphs else "")


class StepQueue:
    """A rollout rank's samples and validations generated ahead of their meetings (rl_config.off_policy_steps k:
    up to k steps' samples wait at once, each generated with the weights the rank had then)."""

    def __init__(self, worker: RolloutWorker, start: int, last: int):
        self.worker, self.last = worker, last
        self.samples: Dict[int, List[Samples]] = {}  # step -> its rollouts (dynamic sampling's rounds), not handed over
        self.checks: Dict[int, Samples] = {}  # step -> the validation after its update, not handed over yet
        self.generated = self.validated = start  # the last step generated, the last validated (step 0: before)

    def generate(self, upto: int) -> None:
        """Every step up to `upto` (at most the last) generated, in order, with the weights this rank has."""
        while self.generated < min(upto, self.last):
            self.generated += 1
            self.samples[self.generated] = self.worker.generate(self.generated)

    def validate(self, upto: int) -> None:
        """The validation of every step up to `upto` that validates, with the weights this rank has."""
        while self.validated < min(upto, self.last):
            self.validated += 1
            if self.worker.validates(self.validated):
                self.checks[self.validated] = self.worker.validation()

    def pop(self, step: int) -> List[Samples]:
        return self.samples.pop(step)
