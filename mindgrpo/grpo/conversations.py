"""Conversations in the rollouts (docs/tools.md): the engine's `Turns` of a run, made by the builder its kind
registers, and what a step takes from them: the reward columns and the metrics.

    conv = build_conversations(cfg, tokenizer, chat_template)   # None: one answer per prompt
    conv.start()                                                  # the tool workers, while the first rollout compiles
    conv.turns.reset()
    completions = engine.generate(prompts, params, turns=conv.turns)
    columns = conversation_columns(conv.turns, completions, tokenizer)    # tool_calls, messages, ... per sample
    metrics = conversation_metrics(conv.turns, completions)               # tool/*, turns/*
    conv.close()                                                  # at the end of the run, SIGTERM included

A kind is an entry of CONVERSATIONS: a function (cfg, tokenizer, chat_template) -> Conversations whose `turns`
implements `inference.engine.Turns` and also `columns(request) -> dict` (per-sample columns for the rewards; a
`turn_messages` entry, each appended turn's chat messages, goes into `messages` instead), `stats(samples) -> dict`
(metrics of the last generate call) and `reset()` (before each call). `tools` (generate_config.tools) is the one
kind built here; a kind is chosen by `conversation_kind`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.config.loader import ConfigError, check
from mindgrpo.data.templates import ChatTemplateError
from mindgrpo.inference.engine import Completion
from mindgrpo.inference.tool_turns import ToolTurns
from mindgrpo.tools import TOOLS, ToolPool, load_tool_plugin, parse_tool_calls
from mindgrpo.utils.registry import Registry

logger = logging.getLogger(__name__)

CONVERSATIONS = Registry("conversation kind")
# the columns every conversation gives the rewards (a kind may add its own)
CONVERSATION_COLUMNS = ("tool_calls", "messages")
TURN_STEP = 16  # a tool turn's token budget is rounded up to this


@dataclass
class Conversations:
    """A run's conversations: the engine's `turns` (see the module docstring), and `start` / `close` of what they
    run on (the tool workers), closed once at the end of the run."""

    kind: str
    turns: object
    start: Callable[[], None]
    close: Callable[[], None]

    @property
    def extra_positions(self) -> int:
        """KV-cache positions a sample may need beyond its prompt and max_tokens: its appended turns."""
        return self.turns.max_turns * self.turns.max_turn_tokens


def conversation_kind(cfg: GRPOConfig) -> Optional[str]:
    """The kind of conversation the config asks for, or None (one answer per prompt)."""
    return "tools" if cfg.generate_config.tools else None


def build_conversations(cfg: GRPOConfig, tokenizer, chat_template: Optional[str]) -> Optional[Conversations]:
    """The run's conversations, or None. chat_template: the tokenizer_config.json whose chat template writes the
    turns (generate_config.chat_template, else the tokenizer's own; None: the tokenizer has none)."""
    kind = conversation_kind(cfg)
    return None if kind is None else CONVERSATIONS.get(kind)(cfg, tokenizer, chat_template)


def load_tools(cfg: GRPOConfig) -> None:
    """generate_config.tool_plugin loaded and every name of generate_config.tools registered (ConfigError naming the
    key otherwise): before the prompts that show the tools are written."""
    gen = cfg.generate_config
    if gen.tool_plugin:
        try:
            load_tool_plugin(gen.tool_plugin)
        except Exception as error:  # the user's file: any error it raises while loading stops the start-up
            raise ConfigError("generate_config.tool_plugin", f"{gen.tool_plugin}: {type(error).__name__}: {error}") \
                from None
    unknown = [n for n in gen.tools if n not in TOOLS]
    check(not unknown, "generate_config.tools", f"names unknown tool(s) {unknown}; registered: "
          f"{', '.join(TOOLS.names())} (more from generate_config.tool_plugin)")


@CONVERSATIONS.register("tools")
def tool_conversations(cfg: GRPOConfig, tokenizer, chat_template: Optional[str]) -> Conversations:
    """generate_config.tools: each turn's tool calls run on a ToolPool of tool_num_workers processes; a tool turn
    holds one answer of tool_response_max_tokens tokens (the template's text around it included), and a turn whose
    answers need more ends its sample (finish_reason "length")."""
    gen = cfg.generate_config
    load_tools(cfg)
    check(chat_template is not None, "generate_config.chat_template",
          "the tokenizer has no tokenizer_config.json with a chat template, which writes the tool turns: name one")
    pool = ToolPool({name: {} for name in gen.tools}, gen.tool_num_workers, gen.tool_timeout_s)
    turns = ToolTurns(tokenizer, pool, gen.tools, chat_template, max_turns=gen.max_turns,
                      tool_response_max_tokens=gen.tool_response_max_tokens)
    try:
        around = len(tokenizer.encode(turns.tool_turn_text([""])))
    except ChatTemplateError as error:
        raise ConfigError("generate_config.chat_template", str(error)) from None
    turns.max_turn_tokens = -(-(around + gen.tool_response_max_tokens) // TURN_STEP) * TURN_STEP
    logger.info("conversations: tools %s, at most %d tool turns of %d tokens a sample, calls in %d worker(s), "
                "%.0f s each", ", ".join(gen.tools), gen.max_turns, turns.max_turn_tokens, gen.tool_num_workers,
                gen.tool_timeout_s)
    return Conversations("tools", turns, pool.start, pool.close)


def tool_chat_texts(cfg: GRPOConfig, chat_template: str, count: int = 200) -> Tuple[str, ...]:
    """Conversations of the synthetic task's first `count` training problems in the chat template with the tools:
    the tiny tokenizer's extra training text (`TinyTokenizerSpec.chat_texts`), so the tool-call format and the
    tool turns take few tokens."""
    from mindgrpo.data.synthetic import arithmetic_rows
    from mindgrpo.data.templates import get_template, render_chat
    from mindgrpo.grpo.sft import expression_of
    from mindgrpo.tools import tool_schema

    syn, gen = cfg.synthetic_config, cfg.generate_config
    system = get_template(syn.template).system
    tools = [tool_schema(n) for n in gen.tools]
    texts = []
    for row in arithmetic_rows(syn.task)[0][:count]:
        call = {"type": "function", "function": {"name": "calculator",
                                                 "arguments": {"expression": expression_of(row.answer)}}}
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": row.question}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": row.solution}, {"role": "assistant", "content": "\\boxed{%s}" % row.solution}]
        texts.append(render_chat(messages, tools, tokenizer_config=chat_template, add_generation_prompt=False))
    return tuple(texts)


# ----------------------------------------------------------------------------------------- what a step takes


def trajectory_runs(token_ids: Sequence[int], model_mask: np.ndarray) -> List[Tuple[bool, List[int]]]:
    """The trajectory cut where the mask changes: (the model's own tokens?, their ids) in order."""
    runs: List[Tuple[bool, List[int]]] = []
    for token, own in zip(token_ids, np.asarray(model_mask, bool)):
        if runs and runs[-1][0] == own:
            runs[-1][1].append(int(token))
        else:
            runs.append((bool(own), [int(token)]))
    return runs


def assistant_message(text: str) -> dict:
    """A model turn as a chat message: its text before the first <tool_call>, and its calls as `tool_calls`."""
    calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text.split("<tool_call>", 1)[0].strip(),
            "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in calls]}


def conversation_columns(turns, completions: Sequence[Completion], tokenizer) -> Dict[str, list]:
    """Per sample (completions' order = the engine's requests): `messages`, the conversation after the prompt as
    chat messages (each model turn an assistant message, each appended turn the messages its kind gives, else one
    user message of its text), and the columns of `turns.columns(request)` (`tool_calls` for tools)."""
    out: Dict[str, list] = {"messages": []}
    for request, c in enumerate(completions):
        columns = dict(turns.columns(request))
        context = list(columns.pop("turn_messages", ()))
        messages = []
        mask = c.model_mask if c.model_mask is not None else np.ones(len(c.token_ids), bool)
        for own, ids in trajectory_runs(c.token_ids, mask):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            if own:
                messages.append(assistant_message(text))
            else:
                messages.extend(context.pop(0) if context else [{"role": "user", "content": text}])
        out["messages"].append(messages)
        for key, value in columns.items():
            out.setdefault(key, [None] * request).append(value)
    return out


def conversation_metrics(turns, completions: Sequence[Completion]) -> Dict[str, float]:
    """The kind's own (`turns.stats`: tool/calls_mean, tool/errors, tool/timeouts, tool/seconds for tools),
    turns/mean (turns appended per sample), tool/samples_with_calls (the fraction of samples that called a tool)
    and turns/masked_fraction (the trajectory tokens that are not the model's own: context, not trained)."""
    out = {k: float(v) for k, v in turns.stats(len(completions)).items()}
    out["turns/mean"] = float(np.mean([c.turns for c in completions]))
    out["tool/samples_with_calls"] = float(np.mean([c.turns > 0 for c in completions]))
    total = sum(len(c.token_ids) for c in completions)
    own = sum(int(np.sum(c.model_mask)) if c.model_mask is not None else len(c.token_ids) for c in completions)
    out["turns/masked_fraction"] = 1.0 - own / max(total, 1)
    return out


__all__ = ["CONVERSATIONS", "CONVERSATION_COLUMNS", "Conversations", "assistant_message", "build_conversations",
           "conversation_columns", "conversation_kind", "conversation_metrics", "load_tools", "tool_chat_texts", "tool_conversations",
           "trajectory_runs"]
