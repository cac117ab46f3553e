"""Conversations in the rollouts (docs/tools.md): the engine's `Turns` of a run, made by the builder its kind
registers, and what a step takes from them: the reward columns and the metrics.

    conv = build_conversations(cfg, tokenizer, chat_template)   # None: one answer per prompt
    conv.start()                                                  # the tool workers, while the first rollout compiles
    ids, completions, columns, metrics = conv.generate(engine, prompt_ids, questions, params, tokenizer)
    # ids: the prompts generated (an environment's own); columns: tool_calls, messages, ... per sample (one
    # call: conversation_columns); metrics: tool/*, env/*, turns/* (conversation_metrics)
    conv.close()                                                  # at the end of the run, SIGTERM included

A kind is an entry of CONVERSATIONS: a function (cfg, tokenizer, chat_template) -> Conversations whose `turns`
implements `inference.engine.Turns` and also `columns(request) -> dict` (per-sample columns for the rewards; a
`turn_messages` entry, each appended turn's chat messages, goes into `messages` instead; a `messages` entry is the
sample's messages whole), `stats(samples) -> dict` (metrics of the last generate call) and `reset()` (before each
call). A kind may also write the prompts (`prompts(questions, index=None) -> ids`: an environment's resets; index:
the questions' indices in the whole batch, the engine's prompt_index) and must then see
the completions after each generate call (`finish(completions)`). Kinds: `tools` (generate_config.tools) and
`environment` (generate_config.environment); `conversation_kind` chooses.
`Conversations.generate` makes one call of either kind (the trainer's and scripts/evaluate.py's). With partial rollouts
the turns also give a conversation's state as JSON and take it back (`carry(request, prompt) -> dict`,
`restore(request, state)`: grpo/partial_conversations.py carries unfinished conversations between steps).

Under generate_config.placement separate the rollout ranks run them (each its share of the prompts on its own workers,
`RolloutWorker`: `Conversations.generate_share`) and hand over, after each samples meeting, what a call gives besides
the tokens and model masks (a `ReplicaValue` each); the training ranks' are `remote_conversations`: no workers, each
call's prompts, columns and metrics the rollout ranks' merged (`merge_replicas`). Colocated with
inference replicas (generate_config.parallel_config.data_parallel N > 1; the engine a
`parallel/data_parallel.DataParallelEngine`) they are `replica_conversations`: each replica runs its share of the
prompts' conversations on its own workers, and every rank gets the whole call's prompts, columns and metrics
(`merge_replicas`: the replicas' values in prompt order, each metric combined by `COMBINED`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.config.loader import ConfigError, check
from mindgrpo.data.templates import ChatTemplateError
from mindgrpo.envs import ENVIRONMENTS, check_environment_settings, load_environment_plugin
from mindgrpo.inference.engine import Completion, appended_positions
from mindgrpo.inference.env_turns import EnvTurns
from mindgrpo.inference.tool_turns import ToolTurns
from mindgrpo.tools import TOOLS, ToolPool, load_tool_plugin, parse_tool_calls
from mindgrpo.utils.registry import Registry

logger = logging.getLogger(__name__)

CONVERSATIONS = Registry("conversation kind")
# the columns the tool conversations give the rewards
CONVERSATION_COLUMNS = ("tool_calls", "messages")
# the columns an environment's conversations give the rewards (the `environment` reward reads env_reward)
ENVIRONMENT_COLUMNS = ("messages", "env_reward", "env_done")


def _nothing(completions) -> None:
    return None


@dataclass
class Conversations:
    """A run's conversations: the engine's `turns` (see the module docstring), `start` / `close` of what they
    run on (the tool workers), closed once at the end of the run, the reward `columns` they give, and for a kind
    that writes its prompts `prompts(questions, index=None) -> ids`; `finish(completions)` after each generate
    call."""

    kind: str
    turns: object
    start: Callable[[], None]
    close: Callable[[], None]
    columns: Tuple[str, ...] = CONVERSATION_COLUMNS
    prompts: Optional[Callable[..., List[List[int]]]] = None
    finish: Callable[[Sequence[Completion]], None] = _nothing

    @property
    def extra_positions(self) -> int:
        """KV-cache positions a sample may need beyond its prompt and max_tokens: its appended turns."""
        return appended_positions(self.turns)

    def generate_share(self, generate: Callable[[List[List[int]]], List[Completion]], stats: Callable[[], dict],
                       prompt_ids: Sequence[Sequence[int]], questions: Sequence[str], index: Sequence[int],
                       tokenizer) -> Tuple[List[Completion], Optional["ReplicaValue"]]:
        """The conversations of one share of a call's prompts (an inference replica's, a rollout rank's): those at
        `index` of the whole batch (they key the samples' random streams and an environment's resets). generate(ids):
        the engine's call of the share's prompts as written (an environment's resets of their `questions`), keyed by
        `index`; stats(): its figures. Returns the completions and what they give besides, None for a share of none."""
        self.turns.reset()
        ids = [[int(t) for t in prompt_ids[i]] for i in index]
        if self.prompts is not None and len(index):
            ids = self.prompts([questions[i] for i in index], index)
        local = generate(ids)
        if not local:
            return local, None
        self.finish(local)  # an environment steps the last turns the engine ended
        return local, ReplicaValue(ids, conversation_columns(self.turns, local, tokenizer),
                                   conversation_metrics(self.turns, local, stats()), len(local),
                                   sum(len(c.token_ids) for c in local))

    def generate(self, engine, prompt_ids: Sequence[Sequence[int]], questions: Sequence[str], params, tokenizer,
                 **engine_kwargs) -> tuple:
        """One generate call of the conversations (the trainer's and scripts/evaluate.py's): (the prompts as
        generated: an environment's resets of `questions`, else `prompt_ids`; the completions; their per-sample
        columns, `conversation_columns`; the call's metrics, `conversation_metrics`)."""
        self.turns.reset()
        if self.prompts is not None:
            prompt_ids = self.prompts(questions)
        completions = engine.generate(prompt_ids, params, turns=self.turns, **engine_kwargs)
        self.finish(completions)  # an environment steps the last turns the engine ended
        return (prompt_ids, completions, conversation_columns(self.turns, completions, tokenizer),
                conversation_metrics(self.turns, completions, engine.last_stats))


@dataclass
class RemoteConversations(Conversations):
    """A training rank's conversations under generate_config.placement separate: the rollout ranks run them, each
    its share (module docstring); `engine` is the samples meeting (`parallel/separate.RemoteRollout`) and `meeting`
    the ranks' `Meeting`, whose value meeting brings each rollout rank's `ReplicaValue` of each call, merged in
    prompt order (`merge_replicas`)."""

    meeting: object = None

    def generate(self, engine, prompt_ids: Sequence[Sequence[int]], questions: Sequence[str], params, tokenizer,
                 **engine_kwargs) -> tuple:
        completions = engine.generate(prompt_ids, params, turns=self.turns, **engine_kwargs)
        values = [v for v in self.meeting.values(None) if v is not None]  # a rank with no prompts gives none
        # the rollout ranks drew `prompt_ids` (the engine's prompt check); `ids`: those they generated (an
        # environment's resets)
        ids, columns, metrics = merge_replicas(values, len(prompt_ids))
        return ids, completions, columns, metrics


def remote_conversations(conv: Conversations, meeting) -> RemoteConversations:
    """`conv` on the training rank of a separate placement: the same turns (their sizes set the samples' rows; the
    warm start's teacher renders with them), no workers started."""
    own = {f.name: getattr(conv, f.name) for f in fields(Conversations)}
    return RemoteConversations(**dict(own, start=_idle), meeting=meeting)


def _idle() -> None:
    """Nothing to start: the rollout rank runs the workers."""


@dataclass
class ReplicaConversations(Conversations):
    """A colocated run's conversations on data-parallel inference replicas (module docstring): `engine` is the
    `DataParallelEngine`; each replica runs the conversations of its own share of the prompts (the engine's share:
    their indices in the whole batch key the samples' random streams and an environment's resets) on its own
    workers, then the completions meet in the engine's rows and the rest in its value meeting."""

    def generate(self, engine, prompt_ids: Sequence[Sequence[int]], questions: Sequence[str], params, tokenizer,
                 **engine_kwargs) -> tuple:
        mine = engine.share(len(prompt_ids))
        local, value = self.generate_share(  # a replica without prompts (fewer than replicas) gives no value
            lambda ids: engine.generate_share(ids, mine, params, turns=self.turns, **engine_kwargs),
            lambda: engine.replica_stats, prompt_ids, questions, mine, tokenizer)
        completions = engine.gather(local, len(prompt_ids), params, self.turns)
        values = [v for v in engine.gather_values(value) if v is not None]
        ids, columns, metrics = merge_replicas(values, len(prompt_ids))
        return ids, completions, columns, metrics


class ReplicaValue(NamedTuple):
    """What a replica's conversations give besides the tokens (`ReplicaConversations`)."""

    prompts: List[List[int]]  # its prompts as generated
    columns: Dict[str, list]  # conversation_columns, a value per sample
    metrics: Dict[str, float]  # conversation_metrics of its share
    samples: int
    tokens: int  # its samples' trajectory tokens


def replica_conversations(conv: Conversations) -> ReplicaConversations:
    """`conv` on a rank of data-parallel inference replicas: the same turns and workers (this rank's own)."""
    return ReplicaConversations(**{f.name: getattr(conv, f.name) for f in fields(Conversations)})


# how the replicas' metrics of their shares make the whole call's (`merge_replicas`), as one process computes them:
# "samples" a per-sample mean or fraction, weighted by the replica's samples; "tokens" a share of the trajectory tokens,
# weighted by the replica's; "sum" a count or seconds, summed
COMBINED = {"tool/calls_mean": "samples", "tool/samples_with_calls": "samples", "turns/mean": "samples",
            "env/reward_mean": "samples", "env/steps_mean": "samples", "env/done_fraction": "samples",
            "turns/masked_fraction": "tokens",
            "tool/errors": "sum", "tool/timeouts": "sum", "tool/seconds": "sum", "turns/cut": "sum",
            "env/errors": "sum", "env/timeouts": "sum", "env/seconds": "sum"}


def merge_replicas(values: Sequence[ReplicaValue], prompts: int
                   ) -> Tuple[List[List[int]], Dict[str, list], Dict[str, float]]:
    """The whole call's (prompts as generated, per-sample columns, metrics) from the replicas' values in replica order
    (= prompt order; `prompts` of them in all). One value's metrics are its own (bit for bit: m * w / w may round)."""
    ids = [p for v in values for p in v.prompts]
    if len(ids) != prompts:
        raise RuntimeError(f"conversations on inference replicas: {len(ids)} prompts came back of {prompts}")
    columns = {key: [x for v in values for x in v.columns.get(key, [None] * v.samples)]
               for key in dict.fromkeys(k for v in values for k in v.columns)}
    weights = {"samples": lambda v: v.samples, "tokens": lambda v: v.tokens, "sum": lambda v: 1}
    metrics: Dict[str, float] = {}
    for key in dict.fromkeys(k for v in values for k in v.metrics):
        if key not in COMBINED:
            raise KeyError(f"conversation metric {key!r} has no rule in conversations.COMBINED (how replicas combine)")
        weight = weights[COMBINED[key]]
        total = sum(v.metrics[key] * weight(v) for v in values)
        metrics[key] = float(total if COMBINED[key] == "sum" else values[0].metrics[key] if len(values) == 1
                             else total / max(sum(weight(v) for v in values), 1))
    return ids, columns, metrics


def conversation_kind(cfg: GRPOConfig) -> Optional[str]:
    """The kind of conversation the config asks for, or None (one answer per prompt)."""
    gen = cfg.generate_config
    return "tools" if gen.tools else "environment" if gen.environment is not None else None


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
    holds one answer of tool_response_max_tokens tokens (the template's text around it included); a turn over it has
    its answers cut further until it fits (`ToolTurns.fitted_turn`), and one that cannot fit even so ends its sample
    (finish_reason "length", counted in turns/cut)."""
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
    turns.max_turn_tokens = gen.turn_positions(around) // gen.max_turns
    logger.info("conversations: tools %s, at most %d tool turns of %d tokens a sample, calls in %d worker(s), "
                "%.0f s each", ", ".join(gen.tools), gen.max_turns, turns.max_turn_tokens, gen.tool_num_workers,
                gen.tool_timeout_s)
    return Conversations("tools", turns, pool.start, pool.close)


def load_environment(cfg: GRPOConfig) -> None:
    """generate_config.environment_plugin loaded, generate_config.environment registered and its settings known
    (ConfigError naming the key otherwise)."""
    gen = cfg.generate_config
    if gen.environment_plugin:
        try:
            load_environment_plugin(gen.environment_plugin)
        except Exception as error:  # the user's file: any error it raises while loading stops the start-up
            raise ConfigError("generate_config.environment_plugin",
                              f"{gen.environment_plugin}: {type(error).__name__}: {error}") from None
    check(gen.environment in ENVIRONMENTS, "generate_config.environment",
          f"names unknown environment {gen.environment!r}; registered: {', '.join(ENVIRONMENTS.names())} (more from "
          "generate_config.environment_plugin)")
    try:
        check_environment_settings(gen.environment, gen.environment_settings or {})
    except ValueError as error:
        raise ConfigError("generate_config.environment_settings", str(error)) from None


@CONVERSATIONS.register("environment")
def environment_conversations(cfg: GRPOConfig, tokenizer, chat_template: Optional[str]) -> Conversations:
    """generate_config.environment: each prompt is the environment's reset of the dataset row's `prompt` text (the
    chat template's first user turn), each model turn is stepped on a pool of tool_num_workers processes (each call
    bounded by tool_timeout_s) and its observation, cut to tool_response_max_tokens tokens, is the next user turn,
    up to max_turns of them; `env_reward` (the steps' rewards summed) and `env_done` go to the rewards."""
    gen = cfg.generate_config
    load_environment(cfg)
    check(chat_template is not None, "generate_config.chat_template",
          "the tokenizer has no tokenizer_config.json with a chat template, which writes the environment's turns: "
          "name one")
    plugins = [gen.environment_plugin] if gen.environment_plugin else []
    turns = EnvTurns(tokenizer, gen.environment, chat_template, settings=gen.environment_settings or {},
                     plugins=plugins, max_turns=gen.max_turns, observation_max_tokens=gen.tool_response_max_tokens,
                     num_workers=gen.tool_num_workers, timeout_s=gen.tool_timeout_s)
    try:
        around = len(tokenizer.encode(turns.observation_text("")))
    except ChatTemplateError as error:
        turns.close()
        raise ConfigError("generate_config.chat_template", str(error)) from None
    turns.max_turn_tokens = gen.turn_positions(around) // gen.max_turns

    def prompts(questions: Sequence[str], index: Optional[Sequence[int]] = None) -> List[List[int]]:
        ids = turns.prompts(questions, index)
        long = [len(p) for p in ids if len(p) > gen.max_prompt_length]
        if long:  # the environment's first user turn: the engine's slots hold max_prompt_length prompt tokens
            raise ValueError(f"generate_config.max_prompt_length: environment {gen.environment!r} wrote a prompt of "
                             f"{max(long)} tokens (its reset's observation in the chat template), over "
                             f"max_prompt_length {gen.max_prompt_length}: raise it or shorten the dataset's prompts")
        return ids

    logger.info("conversations: environment %s, at most %d user turns of %d tokens a sample, calls in %d worker(s), "
                "%.0f s each", gen.environment, gen.max_turns, turns.max_turn_tokens, gen.tool_num_workers,
                gen.tool_timeout_s)
    return Conversations("environment", turns, turns.pool.start, turns.close, ENVIRONMENT_COLUMNS, prompts,
                         turns.finish)


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
        if "messages" in columns:  # the kind's own (an environment's: its first user turn included)
            out["messages"].append(columns.pop("messages"))
            for key, value in columns.items():
                out.setdefault(key, [None] * request).append(value)
            continue
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


def conversation_metrics(turns, completions: Sequence[Completion], engine_stats: dict) -> Dict[str, float]:
    """The kind's own (`turns.stats`: tool/calls_mean, tool/errors, tool/timeouts, tool/seconds for tools; env/* for
    an environment), turns/mean (turns appended per sample), turns/cut (turns that did not fit their slot, each
    ending its sample: the engine's `turns_cut` of the call, `engine_stats`), with tools tool/samples_with_calls
    (the fraction of samples that called a tool) and turns/masked_fraction (the trajectory tokens that are not the
    model's own: context, not trained)."""
    out = {k: float(v) for k, v in turns.stats(len(completions)).items()}
    out["turns/mean"] = float(np.mean([c.turns for c in completions]))
    out["turns/cut"] = float(engine_stats["turns_cut"])
    if "tool/calls_mean" in out:
        out["tool/samples_with_calls"] = float(np.mean([c.turns > 0 for c in completions]))
    total = sum(len(c.token_ids) for c in completions)
    own = sum(int(np.sum(c.model_mask)) if c.model_mask is not None else len(c.token_ids) for c in completions)
    out["turns/masked_fraction"] = 1.0 - own / max(total, 1)
    return out


__all__ = ["COMBINED", "CONVERSATIONS", "CONVERSATION_COLUMNS", "ENVIRONMENT_COLUMNS", "Conversations",
           "RemoteConversations", "ReplicaConversations", "ReplicaValue", "assistant_message", "merge_replicas",
           "remote_conversations", "replica_conversations",
           "build_conversations", "conversation_columns", "conversation_kind", "conversation_metrics",
           "environment_conversations", "load_environment", "load_tools", "tool_chat_texts", "tool_conversations",
           "trajectory_runs"]
