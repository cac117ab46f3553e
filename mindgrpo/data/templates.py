"""Prompt templates: how a dataset question becomes the text the policy continues.

    render_prompt("qwen_r1", "What is 2 + 3?")   # -> chat-marked text ending in "<|im_start|>assistant\\n"

Qwen3 models use the `qwen3_*` templates: the same ChatML without a default system message, and its
thinking switch (`enable_thinking` of Qwen3's chat template in tokenizer_config.json).

Templates live in one registry; `get_template` fails listing the valid names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

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
