"""Tool calls in a model's turn, and what a call gives back.

    calls = parse_tool_calls(turn_text)                 # Qwen's <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    call = check_call(calls[0], allowed={"calculator"})  # a malformed call keeps its error and is never run
    result.response()                                    # the text of the tool turn: the output or "error: ..."

A malformed call (bad JSON, no name, unknown tool, arguments that do not fit the schema), a tool that raises,
crashes, outlives its timeout or prints too much all end as a ToolResult whose status is not "ok": the model
sees the error, the rollout counts it, the step goes on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, List, Optional, Sequence

from mindgrpo.tools.registry import TOOLS, check_arguments, get_tool

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
STATUSES = ("ok", "error", "timeout")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)
    error: Optional[str] = None  # set: malformed, not run


@dataclass(frozen=True)
class ToolResult:
    status: str  # "ok" | "error" | "timeout"
    text: str
    seconds: float = 0.0

    def response(self) -> str:
        """The tool turn's content as the model sees it."""
        return self.text if self.status == "ok" else f"error: {self.text}"


def parse_tool_calls(text: str) -> List[ToolCall]:
    """Every <tool_call>...</tool_call> of a model's turn, in order (an unclosed one is no call)."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            payload = json.loads(body)
        except ValueError as error:
            calls.append(ToolCall("", error=f"the tool call is not valid JSON ({error.msg} at {error.pos})"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(ToolCall("", error='a tool call is {"name": <tool name>, "arguments": {...}}'))
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        calls.append(ToolCall(payload["name"], arguments if isinstance(arguments, dict) else {},
                              None if isinstance(arguments, dict) else "the arguments must be a JSON object"))
    return calls


def check_call(call: ToolCall, allowed: Collection[str]) -> ToolCall:
    """The call, with its error set when it names no tool of `allowed` or its arguments do not fit."""
    if call.error is not None:
        return call
    if call.name not in allowed or call.name not in TOOLS:
        return replace(call, error=f"unknown tool {call.name!r}; the tools are {', '.join(sorted(allowed))}")
    try:
        check_arguments(get_tool(call.name), call.arguments)
    except ValueError as error:
        return replace(call, error=str(error))
    return call


def truncate_response(text: str, encode: Callable[[str], Sequence[int]], decode: Callable[[Sequence[int]], str],
                      max_tokens: int) -> str:
    """`text` cut to its first max_tokens tokens, with a note that it was cut when the budget has room for one
    (the note's tokens included)."""
    ids = list(encode(text))
    if len(ids) <= max_tokens:
        return text
    for note in (f"\n[truncated: {len(ids)} tokens, the first shown]", "\n[truncated]", ""):
        room = max_tokens - len(encode(note))
        if room >= 0:
            return decode(ids[:room]) + note
    return decode(ids[:max_tokens])
