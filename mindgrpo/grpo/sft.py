"""A short supervised warm start on reference solutions, through the GRPO training graph.

With advantage 1 on every token and old log-probs equal to the current ones (ratio 1, gradient
stopped), the GRPO surrogate -ratio * A has the gradient of the negative log-likelihood, so the
same compiled graph serves both. The reported loss is the graph's NLL metric of each batch before
its update (the surrogate's own value is constant).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Dict, List, Tuple

import numpy as np

from mindgrpo.data.synthetic import flawed_solution
from mindgrpo.grpo.actor import PolicyUpdater
from mindgrpo.grpo.experience import pack, round_up
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import AdamWSettings, lr_at
from mindgrpo.grpo.packing import Batching
from mindgrpo.grpo.prompts import PromptSource

logger = logging.getLogger(__name__)


R1_TARGET = "<think>\n{answer}\n</think>\n<answer>\n\\boxed{{{solution}}}\n</answer>"


def sft_targets(answers: List[str], solutions: List[str], tokenizer) -> List[List[int]]:
    """Token ids of each reference solution in the R1 format (reasoning in <think>, the final
    answer boxed in <answer>), followed by the end-of-turn token."""
    stop = tokenizer.stop_token_ids[0]
    texts = [R1_TARGET.format(answer=a, solution=s) for a, s in zip(answers, solutions)]
    return [ids + [stop] for ids in tokenizer.encode_batch(texts)]


def expression_of(answer: str) -> str:
    """The expression a worked chain solves ("123 + 456 = 579, 579 + 789 = 1368" -> "123 + 456 + 789")."""
    steps = [step.split(" = ")[0].split(" ") for step in answer.split(", ")]
    return " ".join(steps[0] + [part for step in steps[1:] for part in step[1:]])


def tool_targets(answers: List[str], solutions: List[str], tokenizer, turns, rng: np.random.Generator,
                 call_rate: float, carry_error: float) -> Tuple[List[List[int]], List[np.ndarray]]:
    """A teacher's conversations for synthetic chains with the calculator (generate_config.tools): with probability
    `call_rate` it calls the calculator on the chain's expression and boxes the answer the tool gives; otherwise it
    answers at once, its value from the flawed teacher (`flawed_solution` with carry_error). Each turn tokenized
    as the rollout engine sees it: the model's turns and their stop token, the tool turn as `turns.tool_turn_text`
    writes it. Returns each target's ids and its model mask (the tool turn False: context, not trained)."""
    from mindgrpo.tools import get_tool

    stop, calculator = tokenizer.stop_token_ids[0], get_tool("calculator").fn
    targets, masks = [], []
    for answer, solution in zip(answers, solutions):
        if rng.random() < call_rate:
            expression = expression_of(answer)
            call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
            first = tokenizer.encode(f"<tool_call>\n{call}\n</tool_call>") + [stop]
            result = str(calculator(expression=expression))
            tool = tokenizer.encode(turns.tool_turn_text([result]))
            final = tokenizer.encode("\\boxed{%s}" % result) + [stop]
            targets.append(first + tool + final)
            masks.append(np.array([True] * len(first) + [False] * len(tool) + [True] * len(final)))
        else:
            value = flawed_solution(answer, rng, carry_error)[1] if carry_error > 0 else solution
            targets.append(tokenizer.encode("\\boxed{%s}" % value) + [stop])
            masks.append(np.ones(len(targets[-1]), bool))
    return targets, masks


def sft_warm_start(policy, prompts: PromptSource, tokenizer, *, steps: int, lr: float, batch_size: int,
                   micro_batch_size: int, seed: int, teacher_carry_error: float = 0.0,
                   log_every: int = 10, grad_reducer=None, pipeline=None, tool_turns=None,
                   tool_call_rate: float = 0.0) -> Dict[str, float]:
    """`steps` AdamW steps on `batch_size` prompts each, cosine lr from `lr` to lr / 10 after a 10% warmup.
    With teacher_carry_error > 0 the targets come from a flawed teacher (synthetic chains only): each
    solution is redrawn per use, so every carrying fact is seen both right and wrong.
    tool_turns (generate_config.tools on the synthetic task: the run's ToolTurns): the targets are the teacher's
    conversations of `tool_targets` instead, calling the calculator at tool_call_rate.
    grad_reducer, pipeline: the policy's data-parallel and pipeline parts (distributed runs)."""
    if steps <= 0:
        return {}
    updater = PolicyUpdater(policy, GRPOLoss(beta=0.0, agg_mode="token-mean"), Batching(micro_batch_size),
                            detach_old=True, use_ref=False, optimizer=AdamWSettings(beta2=0.98), with_entropy=False,
                            grad_reducer=grad_reducer, pipeline=pipeline)
    source = PromptSource({"prompt_ids": [np.array(i) for i in prompts.ids],
                           "prompt_length": [len(i) for i in prompts.ids], **prompts.columns}, seed=seed)
    teacher_rng = np.random.default_rng([seed, 1])
    # no batch pads beyond the data's longest prompt + target (a flawed teacher's are no longer) rounded up
    # to 8: on short, even data (the built-in task) one compiled shape with little padding
    columns = (prompts.columns["answer"], prompts.columns["solution"])
    full = sft_targets(list(columns[0]), list(columns[1]), tokenizer)
    tokenized = dict(zip(zip(*columns), full))  # (answer, solution) -> target ids: the faithful teacher's
    if tool_turns is not None:  # the longest: every target a call
        full, _ = tool_targets(list(columns[0]), list(columns[1]), tokenizer, tool_turns, np.random.default_rng(0),
                               1.0, 0.0)
    caps = (round_up(max(len(p) + len(t) for p, t in zip(prompts.ids, full)), 8), round_up(max(map(len, full)), 8))
    t0, nll = time.perf_counter(), float("nan")
    for step in range(steps):
        batch = source.next(batch_size)
        answers, solutions = batch.columns["answer"], batch.columns["solution"]
        masks = None
        if tool_turns is not None:
            targets, masks = tool_targets(list(answers), list(solutions), tokenizer, tool_turns, teacher_rng,
                                          tool_call_rate, teacher_carry_error)
        elif teacher_carry_error > 0:  # solutions redrawn per use: tokenized per batch
            answers, solutions = zip(*(flawed_solution(a, teacher_rng, teacher_carry_error) for a in answers))
            targets = sft_targets(list(answers), list(solutions), tokenizer)
        else:
            targets = [tokenized[key] for key in zip(answers, solutions)]
        exp = pack(batch.ids, targets, np.ones(len(targets), np.float32), pad_id=tokenizer.pad_token_id, caps=caps,
                   response_masks=masks)
        m = updater.update(exp, lr_at(step, lr, steps, warmup_steps=max(1, steps // 10), schedule="cosine",
                                      min_lr=lr * 0.1))
        nll = m["nll"]  # of this batch, before its update
        if (step + 1) % log_every == 0 or step + 1 == steps:
            logger.info("sft warm start %d/%d | nll %.3f | %.1fs", step + 1, steps, nll, time.perf_counter() - t0)
    return {"sft/nll": nll, "sft/seconds": time.perf_counter() - t0}
