"""Partial rollouts (generate_config.partial_rollout, docs/async.md): a step's rollout admits more prompts than
the step trains on and stops once it has the groups it needs; the samples not finished then keep their tokens and
go on in the next step's rollout, with that step's weights.

A carried sample goes on from its prompt and its own tokens as a new prompt, prefilled again with the new weights
(its KV cache is not kept: the cache of the old weights would mix two versions in one attention context, and the
engine's cache belongs to one call), for the tokens it has left; each token keeps the version that generated it
(`Completion.versions`), so a sample's staleness is that of its oldest token. A group (the G samples of a prompt)
trains once all its samples are finished, oldest groups first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Tuple

import numpy as np

from mindgrpo.grpo.prompts import PromptBatch
from mindgrpo.inference.engine import Completion

PARTIAL = "partial"


@dataclass
class Group:
    """One prompt's G samples, finished or not, and the prompt's dataset columns."""

    prompt: List[int]
    columns: Dict[str, object]
    samples: List[Completion]

    @property
    def complete(self) -> bool:
        return all(c.finish_reason != PARTIAL for c in self.samples)


def joined(before: Completion, after: Completion) -> Completion:
    """A carried sample's tokens so far followed by its continuation's (the continuation's end)."""
    def cat(a, b):
        return None if a is None or b is None else np.concatenate([a, b])

    return replace(before, token_ids=before.token_ids + after.token_ids, finish_reason=after.finish_reason,
                   logprobs=cat(before.logprobs, after.logprobs),
                   sampling_logprobs=cat(before.sampling_logprobs, after.sampling_logprobs),
                   versions=cat(before.versions, after.versions))


class PartialRollouts:
    """The groups in flight between steps. max_tokens: generate_config.max_tokens (a sample's whole budget)."""

    def __init__(self, group: int, max_tokens: int):
        self.G, self.max_tokens = group, max_tokens
        self.groups: List[Group] = []  # oldest first

    def continuations(self) -> Tuple[List[List[int]], List[int], List[Tuple[int, int]]]:
        """The carried unfinished samples as prompts (the prompt and the sample's tokens), the tokens each has
        left, and where each is ((group, sample))."""
        prompts, left, where = [], [], []
        for i, g in enumerate(self.groups):
            for j, c in enumerate(g.samples):
                if c.finish_reason == PARTIAL:
                    prompts.append(g.prompt + c.token_ids)
                    left.append(self.max_tokens - len(c.token_ids))
                    where.append((i, j))
        return prompts, left, where

    def resume(self, where: List[Tuple[int, int]], comps: List[Completion]) -> None:
        """The continuations' completions (one a carried sample, in `continuations` order) joined to theirs."""
        for (i, j), c in zip(where, comps):
            g = self.groups[i]
            g.samples[j] = joined(g.samples[j], c)

    def add(self, batch: PromptBatch, comps: List[Completion]) -> None:
        """A rollout call's samples of fresh prompts (G a prompt, adjacent), finished or not."""
        for p, ids in enumerate(batch.ids):
            self.groups.append(Group(list(ids), {k: v[p] for k, v in batch.columns.items()},
                                     list(comps[p * self.G:(p + 1) * self.G])))

    def complete(self) -> int:
        return sum(g.complete for g in self.groups)

    def take(self, n: int) -> Tuple[PromptBatch, List[Completion]]:
        """The n oldest complete groups, out of the carried ones: their prompts and samples (prompt_index into
        the batch)."""
        taken = [g for g in self.groups if g.complete][:n]
        kept = {id(g) for g in taken}
        self.groups = [g for g in self.groups if id(g) not in kept]
        keys = sorted({k for g in taken for k in g.columns})
        batch = PromptBatch([g.prompt for g in taken], {k: [g.columns[k] for g in taken] for k in keys})
        comps = [replace(c, prompt_index=p) for p, g in enumerate(taken) for c in g.samples]
        return batch, comps

    def metrics(self) -> Dict[str, float]:
        """What stays in flight after a step took its groups."""
        return {"partial/carried_groups": float(len(self.groups)),
                "partial/carried_samples": float(sum(c.finish_reason == PARTIAL for g in self.groups
                                                     for c in g.samples))}
