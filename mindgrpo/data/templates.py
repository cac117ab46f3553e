"""Prompt templates: how a dataset question becomes the text the policy continues.

    render_prompt("qwen_r1", "What is 2 + 3?")   # -> chat-marked text ending in "<|im_start|>assistant\\n"

Qwen3 models use the `qwen3_*` templates: the same ChatML without a default system message, and its
thinking switch (`enable_thinking` of Qwen3's chat template in tokenizer_config.json).

Templates live in one registry; `get_template` fails listing the valid names.

Whole conversations (tool definitions, tool calls, tool responses, Qwen3's thinking) are rendered with the
model's own Jinja chat template from its tokenizer_config.json, in Jinja2's sandbox with the globals and
filters transformers gives templates (so the text is what `apply_chat_template` gives):

    render_chat(messages, tools=[schema, ...], tokenizer_config="qwen/tokenizer_config.json")
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jinja2
import jinja2.ext
import jinja2.sandbox

from mindgrpo.data.tokenizer import IM_END, IM_START
from mindgrpo.utils.registry import Registry

TEMPLATES = Registry("prompt template")

# Qwen2.5-Instruct's default system message.
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

R1_SYSTEM = (
    "You are a careful math assistant. For every question, first reason step by step inside "
    "<think> </think> tags. After the closing </think> tag, state the answer inside <answer> </answer> tags "
    "and write the final result as \\boxed{...} there, e.g. <think> ... </think> <answer> \\boxed{42} </answer>."
)


# What Qwen3's chat template puts after the open assistant turn with enable_thinking=False: an
# empty thought, so the model answers directly. With thinking on (its default) it adds nothing and
# the model opens <think> itself.
EMPTY_THOUGHT = "<think>\n\n</think>\n\n"


def chat_parts(system: Optional[str], thinking: bool = True) -> Tuple[str, str]:
    """Qwen (ChatML) markup for one user turn, ending with the open assistant turn (generation prompt),
    as the text before and after the user's message; thinking=False closes an empty thought (Qwen3)."""
    head = f"{IM_START}system\n{system}{IM_END}\n" if system is not None else ""
    return f"{head}{IM_START}user\n", f"{IM_END}\n{IM_START}assistant\n" + ("" if thinking else EMPTY_THOUGHT)


@dataclass(frozen=True)
class PromptTemplate:
    """`chat=False`: the question as is; `chat=True`: ChatML with `system` (None = no system turn);
    `thinking=False`: Qwen3's enable_thinking=False (an empty thought after the assistant's turn)."""

    name: str
    system: Optional[str] = None
    chat: bool = True
    thinking: bool = True

    def parts(self) -> Tuple[str, str]:
        """(before, after): the prompt is before + question + after (truncation cuts only the question)."""
        return chat_parts(self.system, self.thinking) if self.chat else ("", "")

    def __call__(self, question: str) -> str:
        before, after = self.parts()
        return before + question + after


for _template in (
    PromptTemplate("qwen_chat", QWEN_SYSTEM),  # Qwen2.5-Instruct: its default system message
    PromptTemplate("qwen_r1", R1_SYSTEM),
    PromptTemplate("qwen3_chat", None),  # Qwen3: no default system message, thinking on
    PromptTemplate("qwen3_chat_no_think", None, thinking=False),
    PromptTemplate("qwen3_r1", R1_SYSTEM),  # thinking on: the R1 system turn, the model opens <think>
    PromptTemplate("raw", chat=False),
):
    TEMPLATES.register(_template.name, _template)


def get_template(name: str) -> PromptTemplate:
    return TEMPLATES.get(name)


def render_prompt(name: str, question: str) -> str:
    return TEMPLATES.get(name)(question)


# --- the model's own chat template (Jinja) ---------------------------------------------------------------

class ChatTemplateError(ValueError):
    """A tokenizer_config.json without a usable chat template, or a template that raised."""


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters ('<' -> \u003c); chat templates expect plain json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names (no way to reach Python internals through it)."""

    def __init__(*args, **kwargs):  # noqa: N805 - Jinja's Namespace takes self inside *args
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r} on a namespace")


@functools.lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    """The template compiled in an immutable sandbox, with transformers' environment: trim_blocks,
    lstrip_blocks, loop controls, and the globals raise_exception, strftime_now, namespace, and tojson."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace)
    return env.from_string(source)


_SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


@functools.lru_cache(maxsize=16)
def _read_tokenizer_config(path: str, mtime: float) -> Tuple[str, Tuple[Tuple[str, str], ...]]:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as error:
        raise ChatTemplateError(f"{path}: cannot read the tokenizer config: {error}") from None
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise ChatTemplateError(f"{path}: no 'chat_template' string (the model's Jinja chat template)")
    special = []
    for key in _SPECIAL_TOKENS:  # a token is a string or an AddedToken-shaped {"content": ...}
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            special.append((key, value))
    return template, tuple(special)


def chat_template_of(tokenizer_config: str) -> Tuple[str, Dict[str, str]]:
    """(the Jinja source, its special tokens {bos_token: ..., eos_token: ...}) from a tokenizer_config.json."""
    path = os.path.abspath(tokenizer_config)
    try:
        mtime = os.path.getmtime(path)
    except OSError as error:
        raise ChatTemplateError(f"{tokenizer_config}: {error.strerror}") from None
    template, special = _read_tokenizer_config(path, mtime)
    return template, dict(special)


def plain_data(value: Any, other: Optional[Callable[[Any], Any]] = None) -> Any:
    """JSON-shaped data only (str, int, float, bool, None, lists, dicts): nothing with methods reaches the sandbox.
    Anything else is `other(value)` when given (e.g. str), else a TypeError."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {plain_data(k, other): plain_data(v, other) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v, other) for v in value]
    if callable(getattr(value, "item", None)):  # numpy scalars
        return plain_data(value.item(), other)
    for kind in (bool, int, float, str):  # subclasses (enums, ...) as their base type
        if isinstance(value, kind):
            return kind.__str__(value) if kind is str else kind(value)
    if other is not None:
        return other(value)
    raise TypeError(f"chat messages and tools hold JSON data only, got {type(value).__name__}")


def render_chat(messages: Sequence[Mapping], tools: Optional[Sequence[Mapping]] = None, *, tokenizer_config: str,
                add_generation_prompt: bool = True, **template_kwargs) -> str:
    """The conversation as the model's chat template writes it (transformers' `apply_chat_template(...,
    tokenize=False)`): messages are {"role", "content", "tool_calls"?, "reasoning_content"?} dicts, tools
    JSON schemas ({"type": "function", "function": {"name", "description", "parameters"}}); template_kwargs
    reach the template as variables (Qwen3's `enable_thinking=False`)."""
    source, special = chat_template_of(tokenizer_config)
    chat: List[dict] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ChatTemplateError(f"message {i} is not a dict with a 'role': {message!r}")
        chat.append({k: plain_data(v) for k, v in message.items() if v is not None})  # a None key = an absent key
    variables = dict(special)
    variables.update({k: plain_data(v) for k, v in template_kwargs.items()})
    try:
        return compile_chat_template(source).render(messages=chat, tools=None if tools is None else plain_data(tools),
                                                    documents=None, add_generation_prompt=add_generation_prompt,
                                                    **variables)
    except jinja2.exceptions.TemplateError as error:
        raise ChatTemplateError(f"{tokenizer_config}: the chat template failed: {error}") from None


@dataclass(frozen=True)
class ChatTemplatePrompt:
    """A one-question prompt as the model's chat template writes it (a system turn, tool definitions, the
    user's turn, the open assistant turn): the text before and after the question, like PromptTemplate."""

    name: str
    before: str
    after: str

    def parts(self) -> Tuple[str, str]:
        return self.before, self.after

    def __call__(self, question: str) -> str:
        return self.before + question + self.after


_QUESTION = "\x00question\x00"  # no template writes it, so it splits the rendered text in two


def chat_prompt_template(tokenizer_config: str, system: Optional[str] = None,
                         tools: Optional[Sequence[Mapping]] = None, **template_kwargs) -> ChatTemplatePrompt:
    """The prompt template that renders one user question with `tokenizer_config`'s chat template, the system
    turn `system` (None: the template's default) and the tool definitions `tools` (JSON schemas)."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": _QUESTION}]
    text = render_chat(messages, tools, tokenizer_config=tokenizer_config, **template_kwargs)
    if text.count(_QUESTION) != 1:
        raise ChatTemplateError(f"{tokenizer_config}: the chat template does not write the user's message once "
                                "and unchanged, so it cannot make one-question prompts")
    before, after = text.split(_QUESTION)
    names = ",".join(t.get("function", t).get("name", "?") for t in tools or ())
    return ChatTemplatePrompt(f"chat_template({os.path.basename(os.path.dirname(os.path.abspath(tokenizer_config)))}"
                              + (f"; tools {names}" if names else "") + ")", before, after)
