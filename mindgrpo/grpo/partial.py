"""Partial rollouts (generate_config.partial_rollout, docs/async.md): a step's rollout admits more prompts than
the step trains on and stops once it has the groups it needs; the samples not finished then keep their tokens and
go on in the next step's rollout, with that step's weights.

A carried sample goes on from its prompt and its own tokens as a new prompt, prefilled again with the new weights
(its KV cache is not kept: the cache of the old weights would mix two versions in one attention context, and the
engine's cache belongs to one call), for the tokens it has left; each token keeps the version that generated it
(`Completion.versions`), so a sample's staleness is that of its oldest token. A group (the G samples of a prompt)
trains once all its samples are finished, oldest groups first. With conversations (tools or an environment, in one
process or on a separate placement's rollout ranks) each sample also keeps its conversation's state and the calls run
through `partial_conversations.PartialConversations` (given to `PartialRollouts.step`); an environment's groups keep
their prompts as its resets wrote them and as drawn from the data (`Group.drawn`, which a prompt check names).

Under generate_config.placement separate the rollout rank keeps the groups in flight and runs each step's partial
rollout (`PartialRollouts.step`, the same calls as one process); each training rank keeps only the prompts the
rollout rank drew and has not handed over yet (`DrawnPrompts`), and takes the step's groups from the samples
meeting by their draw numbers. The meeting gives every training rank every group and each draws the same prompts,
so with several training ranks (data-parallel replicas, tensor-parallel pieces, pipeline stages) they all keep the
same prompts in flight: rank 0 writes them into a checkpoint and every training rank reads them back.

With rl_config.dynamic_sampling a step's rollout is rounds of `PartialRollouts.step`, each asking for the groups
still needed (the trainer's `collect`, a separate placement's `RolloutWorker.partial_round`); the groups it drops
(no spread of rewards) were taken, so they are not in flight: their prompts are spent.

A checkpoint holds the groups in flight (IN_FLIGHT, beside its state.json: each prompt, its dataset columns and its
samples' tokens, log-probs and per-token versions, and with conversations their states), so that a resumed run trains
them as the run it continues would have: their prompts were drawn before the save and are not drawn again. Under a
separate placement the training rank writes it with the prompts only (their samples were the rollout rank's, which
writes nothing); after a resume the rollout rank draws those prompts again by their draw numbers
(`PartialRollouts.redraw`) and generates them from scratch, with the restored weights, before any fresh prompt.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from mindgrpo.grpo.prompts import PromptBatch, PromptSource
from mindgrpo.inference.engine import Completion
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.parallel.checkpoint_folders import CheckpointError
from mindgrpo.parallel.data_parallel import row_width

PARTIAL = "partial"
CONTINUED = 1_000_000  # a continuation's random-stream key: past any batch index
# a step's figures (`PartialRollouts.step`), logged as partial/<name>
METRICS = ("carried_groups", "carried_samples", "carried_turns", "continued_samples")
IN_FLIGHT = "in_flight.json"  # a checkpoint's groups in flight (`PartialRollouts.write`, `read`)


@dataclass
class Group:
    """One prompt's G samples, finished or not, and the prompt's dataset columns."""

    prompt: List[int]
    columns: Dict[str, object]
    samples: List[Completion]
    number: int = 0  # the prompt's draw number in the run (0, 1, ...: the order the rollout drew prompts)
    states: Optional[List[dict]] = None  # conversations: each sample's (`partial_conversations`), JSON
    drawn: Optional[List[int]] = None  # an environment's: the prompt as drawn from the data (`prompt` as written)

    @property
    def complete(self) -> bool:
        return all(c.finish_reason != PARTIAL for c in self.samples)


def _plain(v):
    """A dataset column's value as JSON has it (numpy scalars as Python's)."""
    return v.item() if isinstance(v, np.generic) else v


def _array(values: Optional[list], dtype) -> Optional[np.ndarray]:
    return None if values is None else np.asarray(values, dtype)


def _list(a: Optional[np.ndarray]) -> Optional[list]:
    return None if a is None else a.tolist()  # fp32 -> Python float -> fp32 is exact


def sample_state(c: Completion) -> dict:
    return {"prompt_index": int(c.prompt_index), "token_ids": [int(t) for t in c.token_ids],
            "finish_reason": c.finish_reason, "logprobs": _list(c.logprobs),
            "sampling_logprobs": _list(c.sampling_logprobs), "model_mask": _list(c.model_mask),
            "turns": int(c.turns), "versions": _list(c.versions)}


def sample_of(s: dict) -> Completion:
    return Completion(int(s["prompt_index"]), [int(t) for t in s["token_ids"]], str(s["finish_reason"]),
                      _array(s["logprobs"], np.float32), _array(s["sampling_logprobs"], np.float32),
                      _array(s["model_mask"], bool), int(s["turns"]), _array(s["versions"], np.int64))


def unstarted() -> Completion:
    """A sample not generated yet: a continuation of it generates it whole."""
    return Completion(0, [], PARTIAL, np.zeros(0, np.float32), np.zeros(0, np.float32), None, 0,
                      np.zeros(0, np.int64))


def write_in_flight(folder: str, state: dict) -> List[str]:
    """The groups in flight into folder/IN_FLIGHT (a checkpoint's folder before its manifest: the checkpoint is
    published whole or not at all); returns the file's path relative to the folder."""
    with open(os.path.join(folder, IN_FLIGHT), "w") as f:
        json.dump(state, f)
    return [IN_FLIGHT]


def read_in_flight(folder: str, load: Callable[[dict], None]) -> bool:
    """load(the state in folder/IN_FLIGHT); False when the checkpoint has none (saved by a run without partial
    rollouts, which has nothing in flight). CheckpointError naming the file when it is not one."""
    path = os.path.join(folder, IN_FLIGHT)
    if not os.path.isfile(path):
        return False
    try:
        with open(path) as f:
            load(json.load(f))
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: not the groups in flight of a checkpoint ({e!r})") from None
    return True


def joined(before: Completion, after: Completion) -> Completion:
    """A carried sample's tokens so far followed by its continuation's (the continuation's end)."""
    def cat(a, b):
        return None if a is None or b is None else np.concatenate([a, b])

    def mask(c):  # a plain sample's tokens (no mask) are all the model's own
        return np.ones(len(c.token_ids), bool) if c.model_mask is None else c.model_mask

    own = None if before.model_mask is None and after.model_mask is None else np.concatenate([mask(before),
                                                                                                mask(after)])
    return replace(before, token_ids=before.token_ids + after.token_ids, finish_reason=after.finish_reason,
                   logprobs=cat(before.logprobs, after.logprobs),
                   sampling_logprobs=cat(before.sampling_logprobs, after.sampling_logprobs),
                   versions=cat(before.versions, after.versions), model_mask=own, turns=before.turns + after.turns)


class PartialRollouts:
    """The groups in flight between steps. max_tokens: generate_config.max_tokens (a sample's whole budget)."""

    def __init__(self, group: int, max_tokens: int):
        self.G, self.max_tokens = group, max_tokens
        self.groups: List[Group] = []  # oldest first
        self.drawn = 0  # prompts drawn so far (the next group's number)
        self.taken: List[int] = []  # the draw numbers of the groups the last `take` gave, in its order
        self.taken_states: List[Optional[dict]] = []  # with conversations: their samples' states (None: none)
        self.taken_drawn: List[List[int]] = []  # their prompts as drawn from the data (the prompt check names them)

    def continuations(self) -> Tuple[List[List[int]], List[int], List[Tuple[int, int]]]:
        """The carried unfinished samples as prompts (the prompt and the sample's tokens: a conversation's appended
        turns too), the tokens each has left of its own, and where each is ((group, sample))."""
        prompts, left, where = [], [], []
        for i, g in enumerate(self.groups):
            for j, c in enumerate(g.samples):
                if c.finish_reason == PARTIAL:
                    prompts.append(g.prompt + c.token_ids)
                    own = len(c.token_ids) if c.model_mask is None else int(np.sum(c.model_mask))
                    left.append(self.max_tokens - own)  # max_tokens counts the model's own tokens
                    where.append((i, j))
        return prompts, left, where

    def resume(self, where: List[Tuple[int, int]], comps: List[Completion],
               states: Optional[List[dict]] = None) -> None:
        """The continuations' completions (one a carried sample, in `continuations` order) joined to theirs; with
        conversations (states: theirs after the call) already joined (`partial_conversations`)."""
        for k, ((i, j), c) in enumerate(zip(where, comps)):
            g = self.groups[i]
            g.samples[j] = joined(g.samples[j], c) if states is None else c
            if states is not None:
                g.states = g.states or [None] * len(g.samples)
                g.states[j] = states[k]

    def carried(self, where: List[Tuple[int, int]]) -> Tuple[List[Completion], List[Optional[dict]]]:
        """The samples at `where` (`continuations`) and their conversations' states (None: a group without, drawn
        again unstarted after a resume under a separate placement: its conversations begin in the continuation)."""
        return ([self.groups[i].samples[j] for i, j in where],
                [None if self.groups[i].states is None else self.groups[i].states[j] for i, j in where])

    def add(self, batch: PromptBatch, comps: List[Completion], first: Optional[int] = None,
            states: Optional[List[dict]] = None, drawn: Optional[List[List[int]]] = None) -> None:
        """A rollout call's samples of fresh prompts (G a prompt, adjacent), finished or not; first: the first one's
        draw number (default the next: `drawn`, which then counts them); states: with conversations, each sample's;
        drawn: with an environment, the prompts as drawn from the data (batch's are as the resets wrote them)."""
        for p, ids in enumerate(batch.ids):
            self.groups.append(Group(list(ids), {k: v[p] for k, v in batch.columns.items()},
                                     list(comps[p * self.G:(p + 1) * self.G]),
                                     self.drawn if first is None else first + p,
                                     None if states is None else list(states[p * self.G:(p + 1) * self.G]),
                                     None if drawn is None else list(drawn[p])))
            if first is None:
                self.drawn += 1

    def complete(self) -> int:
        return sum(g.complete for g in self.groups)

    def take(self, n: int) -> Tuple[PromptBatch, List[Completion]]:
        """The n oldest complete groups, out of the carried ones: their prompts and samples (prompt_index into
        the batch)."""
        taken = [g for g in self.groups if g.complete][:n]
        kept = {id(g) for g in taken}
        self.groups = [g for g in self.groups if id(g) not in kept]
        self.taken = [g.number for g in taken]
        self.taken_states = [s for g in taken for s in (g.states or [None] * len(g.samples))]
        self.taken_drawn = [g.prompt if g.drawn is None else g.drawn for g in taken]
        keys = sorted({k for g in taken for k in g.columns})
        batch = PromptBatch([g.prompt for g in taken], {k: [g.columns[k] for g in taken] for k in keys})
        comps = [replace(c, prompt_index=p) for p, g in enumerate(taken) for c in g.samples]
        return batch, comps

    def state(self) -> dict:
        return {"drawn": self.drawn,
                "groups": [{"prompt": [int(t) for t in g.prompt], "number": g.number,
                            "columns": {k: _plain(v) for k, v in g.columns.items()},
                            "samples": [sample_state(c) for c in g.samples],
                            **({} if g.states is None else {"states": g.states}),
                            **({} if g.drawn is None else {"drawn": [int(t) for t in g.drawn]})}
                           for g in self.groups]}

    def load_state(self, state: dict) -> None:
        """A group saved without samples (by the training rank of a separate placement) is generated again."""
        self.groups = [Group([int(t) for t in g["prompt"]], dict(g["columns"]),
                             [sample_of(s) for s in g["samples"]] or [unstarted() for _ in range(self.G)],
                             int(g["number"]), g.get("states"), g.get("drawn")) for g in state["groups"]]
        self.drawn = int(state["drawn"])

    def write(self, folder: str) -> List[str]:
        return write_in_flight(folder, self.state())

    def read(self, folder: str) -> None:
        """The groups in flight of the checkpoint at `folder` (none without its IN_FLIGHT)."""
        self.groups = []
        read_in_flight(folder, self.load_state)

    def redraw(self, prompts: PromptSource, drawn: int, numbers: List[int]) -> None:
        """After a --resume under a separate placement (the rollout rank): the training rank's groups in flight, by
        their draw numbers, put back in flight unstarted; `drawn` prompts were drawn in all, the last of them just
        before the position `prompts` is at. Their prompts are drawn again from that many positions back (the draws
        are consecutive), and the next step generates their samples from scratch (as continuations of nothing).
        With R rollout replicas each takes its share of the numbers (the caller's), all of them the same `drawn`."""
        self.groups, self.drawn = [], drawn
        if not numbers:
            return
        first = min(numbers)
        back = drawn - first
        if first < 0 or back <= 0 or max(numbers) >= drawn:
            raise CheckpointError(f"partial rollouts: groups in flight {sorted(numbers)} outside the {drawn} prompts "
                                  "drawn before the checkpoint")
        prompts.back(back)
        batch = prompts.next(back)  # back at the restored position
        wanted = set(numbers)
        for p, ids in enumerate(batch.ids):
            if first + p in wanted:
                self.groups.append(Group(list(ids), {k: v[p] for k, v in batch.columns.items()},
                                         [unstarted() for _ in range(self.G)], first + p))

    def metrics(self) -> Dict[str, float]:
        """What stays in flight after a step took its groups."""
        return {"carried_groups": float(len(self.groups)),
                "carried_samples": float(sum(c.finish_reason == PARTIAL for g in self.groups for c in g.samples)),
                # conversations: the turns (tool answers, observations) the samples in flight already had appended
                "carried_turns": float(sum(c.turns for g in self.groups for c in g.samples
                                           if c.finish_reason == PARTIAL))}

    def step(self, engine, prompts: PromptSource, want: int, sampling: Callable[[int, int], SamplingParams],
             seeds: Tuple[int, int], replicas: Optional["Replicas"] = None, conversations=None
             ) -> Tuple[PromptBatch, List[Completion], Dict[str, float]]:
        """One step's partial rollout with the engine's weights: the carried unfinished samples go on (prefilled
        again; sampling(1, seeds[1])), then fresh prompts, twice the groups still needed (sampling(G, seeds[0])),
        until that many are complete. The engine runs every fresh sample to its end if it must: a step never
        trains fewer than `want` groups. Returns the `want` oldest complete groups (their prompts and samples) and
        the step's figures: new_tokens, drawn (fresh prompts), METRICS.

        replicas: this replica's place among R rollout replicas that each keep groups in flight and hand over
        `want`, their share of the step's groups (separate placement); its `needs(n)` gives every replica's count
        of groups still needed, in replica order. The step's fresh prompts are then drawn once for all, consecutive:
        replica 0's twice its count, then replica 1's, ...; each replica draws them all (every rank's data stays in
        step) and generates its own, keyed by their places in the step's draw (the carried samples by k R + i):
        draw numbers stay global and unique. Without: one replica (i = 0, R = 1), the same calls.

        conversations: a `partial_conversations.PartialConversations` (generate_config.tools or environment): the
        calls run the conversations, each sample keeps its conversation's state, and its `last` holds the reward
        columns and metrics of the groups returned."""
        index, count = (0, 1) if replicas is None else (replicas.index, replicas.count)
        carried, left, where = self.continuations()
        tokens, drawn = 0, 0
        if conversations is not None:
            conversations.begin()
            conversations.reset_games(self.groups)  # groups drawn again after a resume (separate): their resets
            carried, left, where = self.continuations()  # their prompts as written
        if carried:  # keyed past any batch index: their own random streams (each replica its own)
            keys = [CONTINUED + k * count + index for k in range(len(left))]
            if conversations is None:
                self.resume(where, engine.generate(carried, sampling(1, seeds[1]), max_tokens=left, prompt_index=keys))
            else:
                self.resume(where, *conversations.continued(engine, carried, sampling(1, seeds[1]), left, keys,
                                                            *self.carried(where)))
            tokens += engine.last_stats["new_tokens"]
        need = max(want - self.complete(), 0)
        needs = [need] if replicas is None else replicas.needs(need)
        total = 2 * sum(needs)
        if total:
            fresh = prompts.next(total)
            first = 2 * sum(needs[:index])
            if need:
                mine = range(first, first + 2 * need)
                batch = PromptBatch([fresh.ids[k] for k in mine], {c: [v[k] for k in mine]
                                                                    for c, v in fresh.columns.items()})
                if conversations is None:
                    comps = engine.generate(batch.ids, sampling(self.G, seeds[0]), min_groups=need,
                                            prompt_index=list(mine))
                    self.add(batch, comps, self.drawn + first)
                else:  # an environment writes the prompts: the groups keep them as written
                    ids, comps, states = conversations.fresh(engine, batch, sampling(self.G, seeds[0]), need,
                                                             list(mine))
                    self.add(PromptBatch(ids, batch.columns), comps, self.drawn + first, states,
                             batch.ids if conversations.writes_prompts else None)
                drawn = len(batch.ids)
                tokens += engine.last_stats["new_tokens"]
            self.drawn += total
        batch, comps = self.take(want)
        if conversations is not None:
            conversations.end(comps, self.taken_states)
        return batch, comps, dict(self.metrics(), new_tokens=float(tokens), drawn=float(drawn),
                                  continued_samples=float(len(carried)))


class Replicas(NamedTuple):
    """A rollout replica's place among R that each keep groups in flight (`PartialRollouts.step`): its index, R,
    and needs(n): every replica's count of groups it still needs this step, in replica order, from its own n (a
    meeting of the rollout ranks: `separate.Meeting.replica_counts`)."""
    index: int
    count: int
    needs: Callable[[int], List[int]]


class DrawnPrompts:
    """The training rank's side of partial rollouts under generate_config.placement separate: the prompts the
    rollout rank drew (the same PromptSource, in the same order), by draw number, until their group is handed
    over in a samples meeting (`separate.RemoteRollout.groups`)."""

    def __init__(self, group: int):
        self.G = group
        self.rows: Dict[int, Tuple[List[int], Dict[str, object]]] = {}
        self.drawn = 0

    def draw(self, prompts: PromptSource, n: int) -> None:
        batch = prompts.next(n) if n else PromptBatch([], {})
        for p, ids in enumerate(batch.ids):
            self.rows[self.drawn] = (list(ids), {k: v[p] for k, v in batch.columns.items()})
            self.drawn += 1

    def take(self, numbers: List[int]) -> PromptBatch:
        missing = [k for k in numbers if k not in self.rows]
        if missing:
            raise RuntimeError(f"partial rollouts under generate_config.placement separate: the rollout rank handed "
                               f"over groups of prompts {missing} that this rank has not drawn or already trained")
        rows = [self.rows.pop(k) for k in numbers]
        keys = sorted({k for _, columns in rows for k in columns})
        return PromptBatch([ids for ids, _ in rows], {k: [columns[k] for _, columns in rows] for k in keys})

    def in_flight(self) -> List[int]:
        """The draw numbers of the prompts drawn and not trained yet, oldest first."""
        return sorted(self.rows)

    def state(self) -> dict:
        """IN_FLIGHT's format with no samples: the rollout rank generates these groups again after a resume."""
        return {"drawn": self.drawn,
                "groups": [{"prompt": [int(t) for t in ids], "number": k,
                            "columns": {c: _plain(v) for c, v in columns.items()}, "samples": []}
                           for k, (ids, columns) in sorted(self.rows.items())]}

    def load_state(self, state: dict) -> None:
        self.rows = {int(g["number"]): ([int(t) for t in g["prompt"]], dict(g["columns"])) for g in state["groups"]}
        self.drawn = int(state["drawn"])

    def write(self, folder: str) -> List[str]:
        return write_in_flight(folder, self.state())

    def read(self, folder: str) -> None:
        """The prompts in flight of the checkpoint at `folder` (none without its IN_FLIGHT)."""
        self.rows = {}
        read_in_flight(folder, self.load_state)

    def step(self, engine, prompts: PromptSource, want: int, sampling: Callable[[int, int], SamplingParams],
             seeds: Tuple[int, int], turns=None) -> Tuple[PromptBatch, List[Completion], Dict[str, float]]:
        """`PartialRollouts.step` as the rollout ranks ran it (with their weights and these seeds): their `want`
        complete groups (each replica its share), from the samples meeting, and their figures. The training rank
        draws as many prompts as the rollout replicas drew together, so the data order (what a checkpoint records)
        stays the same on every rank. turns: the run's conversations' (their size sets the rows), None without."""
        params = sampling(self.G, seeds[0])
        comps, numbers, figures = engine.groups(want * self.G, self.G, row_width(params, turns))
        self.draw(prompts, int(figures["drawn"]))  # every rollout replica's fresh prompts (summed)
        batch = self.take(numbers)  # in the meeting's rows: each replica's share of the groups, in replica order
        engine.check_prompts(figures, batch.ids)  # the rollout replicas generated these prompts
        return batch, comps, figures
