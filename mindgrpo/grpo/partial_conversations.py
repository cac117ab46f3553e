"""Partial rollouts with conversations (generate_config.partial_rollout with generate_config.tools or
generate_config.environment; docs/async.md): the engine calls of `partial.PartialRollouts.step` made with the run's
`conversations.Conversations`, and what an unfinished conversation keeps between steps.

A step's fresh call appends each answered turn before its next decode step (so where it stops does not depend on the
tools' timing) and stops at its complete groups (engine `min_groups`) after a decode step, then waits for the turns
its parked samples asked for (the tools' answers, the environment's observations) and writes them into their
trajectories: an unfinished conversation is parked in the middle of a model turn (as a plain sample: a long model
turn is the tail partial rollouts cut) or right after an appended turn, never between a model turn's end and its
answer (the answer is the tools' work, already under way; carrying it would mean carrying the pool's calls). It keeps
what a plain sample keeps (its tokens, model turns and appended turns alike; the model mask; per-token versions and
log-probs; its turn count: `partial.joined`) and its conversation's state (`Turns.carry`: JSON; the tool calls and
answers so far, or an environment's state object as the tool workers pickle it after each step, its steps,
observations and first messages), so an IN_FLIGHT checkpoint holds it whole. The next step's continuation call
`restore`s each conversation, tells the engine its turns so far and the model turn under way (`engine.Carried`) and
runs it to its end with that step's weights, prefilled again. An environment's groups also keep the prompt as drawn
from the data (`Group.drawn`: a separate placement's prompt check names it); the groups a separate placement's rollout
rank draws again after a resume (no states) have their games reset before the step's continuation (`reset_games`).

The reward columns (tool_calls, messages; env_reward, env_done, messages) and the conversation metrics (tool/*, env/*,
turns/*) of a step are those of the samples it trains, from their whole conversations, whichever steps ran their turns
(an environment's failed reset then counts once per sample, not once per prompt); turns/cut counts the turns that did
not fit in the step's calls.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.grpo.conversations import Conversations, conversation_columns, conversation_metrics
from mindgrpo.grpo.partial import Group, joined
from mindgrpo.grpo.prompts import PromptBatch
from mindgrpo.inference.engine import Carried, Completion
from mindgrpo.inference.sampling import SamplingParams


def turn_under_way(c: Completion) -> List[int]:
    """The ids of the model turn an unfinished sample was in: its trajectory's last run of the model's own tokens,
    none when an appended turn (or nothing) ends it."""
    mask = np.ones(len(c.token_ids), bool) if c.model_mask is None else np.asarray(c.model_mask, bool)
    start = len(mask)
    while start > 0 and mask[start - 1]:
        start -= 1
    return [int(t) for t in c.token_ids[start:]]


class PartialConversations:
    """The conversation calls of partial rollouts (module docstring); after each step `last` holds (the reward
    columns, the metrics) of the groups it returned."""

    def __init__(self, conv: Conversations, tokenizer):
        self.conv, self.tokenizer = conv, tokenizer
        self.cut = 0  # turns cut in the step's calls
        self.last: Tuple[Dict[str, list], Dict[str, float]] = ({}, {})

    @property
    def writes_prompts(self) -> bool:
        """Whether the conversations write the prompts (an environment's resets)."""
        return self.conv.prompts is not None

    def begin(self) -> None:
        self.cut = 0

    def reset_games(self, groups: Sequence[Group]) -> None:
        """The groups drawn again unstarted after a --resume under a separate placement (no conversation states,
        `PartialRollouts.redraw`): with an environment their games reset now, each group's prompt the reset wrote
        (the data's kept in `drawn` for the prompt check) and each sample's state its reset's, so the step's
        continuation plays them from the start; tools begin their conversations in the continuation itself."""
        new = [g for g in groups if g.states is None and not any(c.token_ids for c in g.samples)]
        if not new or not self.writes_prompts:
            return
        turns = self.conv.turns
        turns.reset()
        keys = list(range(len(new)))  # a reset is the dataset row's: the key only pairs it with its prompt
        ids = self.conv.prompts([g.columns["prompt"] for g in new], keys)
        for k, (g, written) in enumerate(zip(new, ids)):
            g.drawn, g.prompt = g.prompt, [int(t) for t in written]
            g.states = [turns.carry(k * len(g.samples) + j, keys[k]) for j in range(len(g.samples))]

    def continued(self, engine, prompts: List[List[int]], params: SamplingParams, left: List[int], keys: List[int],
                  before: Sequence[Completion], states: Sequence[Optional[dict]]
                  ) -> Tuple[List[Completion], List[dict]]:
        """The carried conversations (each prompt its prompt and trajectory so far, `before` its sample and `states`
        its state; None: a sample not started, drawn again after a resume under a separate placement, whose tool
        conversation begins here; an environment's has its reset's state from `reset_games`) run to their ends: the
        samples whole, and their states."""
        turns = self.conv.turns
        turns.reset()
        for k, (state, c) in enumerate(zip(states, before)):
            if state is not None:
                turns.restore(k, state)
            elif c.token_ids or self.conv.prompts is not None:
                raise RuntimeError("partial rollouts with conversations: a carried sample has no conversation state")
        comps = engine.generate(prompts, params, max_tokens=left, prompt_index=keys, turns=turns,
                                carried=[Carried(c.turns, turn_under_way(c)) for c in before])
        self.cut += int(engine.last_stats["turns_cut"])
        whole = [joined(b, c) for b, c in zip(before, comps)]
        self.conv.finish(whole)  # an environment steps the last turns the engine ended
        return whole, [turns.carry(k, keys[k]) for k in range(len(whole))]

    def fresh(self, engine, batch: PromptBatch, params: SamplingParams, need: int, index: List[int]
              ) -> Tuple[List[List[int]], List[Completion], List[dict]]:
        """Fresh prompts (keyed by `index`) until `need` groups are complete: the prompts as generated (an
        environment's resets), the samples (finished or "partial") and their states."""
        turns = self.conv.turns
        turns.reset()
        ids = batch.ids if self.conv.prompts is None else self.conv.prompts(batch.columns["prompt"], index)
        comps = engine.generate(ids, params, min_groups=need, prompt_index=index, turns=turns)
        self.cut += int(engine.last_stats["turns_cut"])
        self.conv.finish(comps)  # the finished ones' last turns (an unfinished one's goes on)
        return ids, comps, [turns.carry(r, index[r // params.n]) for r in range(len(comps))]

    def end(self, comps: List[Completion], states: Sequence[Optional[dict]]) -> None:
        """The step's groups: `last` = their reward columns and metrics, from their conversations' states."""
        if not comps:
            self.last = ({}, {})
            return
        turns = self.conv.turns
        turns.reset()
        for r, state in enumerate(states):
            if state is None:
                raise RuntimeError("partial rollouts with conversations: a finished sample has no conversation state")
            turns.restore(r, state)
        self.conv.finish(comps)  # every turn was stepped: an environment's messages
        self.last = (conversation_columns(turns, comps, self.tokenizer),
                     conversation_metrics(turns, comps, {"turns_cut": self.cut}))


__all__ = ["PartialConversations", "turn_under_way"]
