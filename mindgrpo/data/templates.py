"""Prompt templates: how a dataset question becomes the text the policy continues.

    render_prompt("qwen_r1", "What is 2 + 3?")   # -> chat-marked text ending in "<|im_start|>assistant\\n"

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


def chat_parts(system: Optional[str]) -> Tuple[str, str]:
    """Qwen (ChatML) markup for one user turn, ending with the open assistant turn (generation prompt),
    as the text before and after the user's message."""
    head = f"{IM_START}system\n{system}{IM_END}\n" if system is not None else ""
    return f"{head}{IM_START}user\n", f"{IM_END}\n{IM_START}assistant\n"


@dataclass(frozen=True)
class PromptTemplate:
    """`chat=False`: the question as is; `chat=True`: ChatML with `system` (None = no system turn)."""

    name: str
    system: Optional[str] = None
    chat: bool = True

    def parts(self) -> Tuple[str, str]:
        """(before, after): the prompt is before + question + after (truncation cuts only the question)."""
        return chat_parts(self.system) if self.chat else ("", "")

    def __call__(self, question: str) -> str:
        before, after = self.parts()
        return before + question + after


for _template in (
    PromptTemplate("qwen_chat", QWEN_SYSTEM),
    PromptTemplate("qwen_r1", R1_SYSTEM),
    PromptTemplate("raw", chat=False),
):
    TEMPLATES.register(_template.name, _template)


def get_template(name: str) -> PromptTemplate:
    return TEMPLATES.get(name)


def render_prompt(name: str, question: str) -> str:
    return TEMPLATES.get(name)(question)
