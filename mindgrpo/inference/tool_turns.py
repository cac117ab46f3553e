"""Tool calling as the engine's conversation turns (`engine.Turns`): a model turn that ends with tool calls
gets a tool turn with their answers, run on the tool pool while the other samples decode.

    turns = ToolTurns(tokenizer, pool, tools=["calculator"], tokenizer_config=".../tokenizer_config.json",
                      max_turns=4, tool_response_max_tokens=256)
    engine.generate(prompts, params, turns=turns)   # turns.calls[request]: what each sample called

A turn "ends with a tool call" when its text, without the stop token, ends with `</tool_call>` (Qwen's format:
mindgrpo/tools/calls.py). Its calls are checked (bad JSON, unknown tool, wrong arguments: an error answer, not
run) and submitted; when all of a sample's calls have answered, each answer cut to tool_response_max_tokens
tokens, the tool turn is rendered by the model's own chat template (the text it writes after an assistant turn
for tool messages, up to the open assistant turn) and tokenized. A turn over max_turn_tokens ids has its answers cut
further, the longest first, until it fits: the budget is measured around an empty answer, and the tokenizer may
split the template's text differently next to an answer (an empty one lets "\n" + "\n" merge, for one); the model
then reads a truncated answer, as for any long output. Only a turn whose template text alone is over the budget
(many calls in one turn) stays over it: the engine ends that sample and counts it (`turns_cut`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence, Tuple

from mindgrpo.data.templates import ChatTemplateError, render_chat
from mindgrpo.data.tokenizer import QwenTokenizer
from mindgrpo.tools.calls import ToolCall, ToolResult, check_call, parse_tool_calls, truncate_response
from mindgrpo.tools.pool import ToolPool

_MODEL = "\x00model turn\x00"
_USER = "\x00question\x00"


def _answer(k: int) -> str:
    return f"\x00answer {k}\x00"


class ToolTurns:
    """The engine's Turns for tool calls (see the module docstring). After a generate call: `calls[request]`
    lists each call of that sample ({"name", "arguments", "status", "response", "seconds"}), `stats()` the
    counts behind tool/calls_mean, tool/errors, tool/timeouts, tool/seconds."""

    def __init__(self, tokenizer: QwenTokenizer, pool: ToolPool, tools: Sequence[str], tokenizer_config: str,
                 max_turns: int, tool_response_max_tokens: int, max_turn_tokens: int = None, **template_kwargs):
        self.tokenizer, self.pool, self.allowed = tokenizer, pool, frozenset(tools)
        self.tokenizer_config, self.template_kwargs = tokenizer_config, template_kwargs
        self.max_turns, self.response_tokens = max_turns, tool_response_max_tokens
        self.max_turn_tokens = max_turn_tokens or 64 + 4 * (tool_response_max_tokens + 32)
        self.calls: Dict[int, List[dict]] = defaultdict(list)
        self.answers: Dict[int, List[List[str]]] = defaultdict(list)  # request -> each tool turn's answers, as sent
        self._waiting: Dict[int, List] = {}  # request -> its calls' results so far (None: not yet)
        self._shapes: Dict[int, Tuple[str, List[str]]] = {}

    # ---------------------------------------------------------------- the tool turn's text
    def tool_turn_text(self, answers: Sequence[str]) -> str:
        """What the chat template writes after a model turn (its end-of-turn mark excluded) for these tool
        answers, up to the open assistant turn."""
        n = len(answers)
        if n not in self._shapes:
            base = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _MODEL}]
            text = render_chat(base + [{"role": "tool", "content": _answer(k)} for k in range(n)],
                               tokenizer_config=self.tokenizer_config, add_generation_prompt=True,
                               **self.template_kwargs)
            after = text.split(_MODEL, 1)[1]
            end = next((t for t in (self.tokenizer.decode([i]) for i in self._stop_ids()) if after.startswith(t)), None)
            if end is None or any(after.count(_answer(k)) != 1 for k in range(n)):
                raise ChatTemplateError(f"{self.tokenizer_config}: cannot find the tool turn in the chat template's "
                                        "text (an assistant turn that ends with a stop token, then tool messages)")
            self._shapes[n] = after[len(end):]
        text = self._shapes[n]
        for k, answer in enumerate(answers):
            text = text.replace(_answer(k), answer)
        return text

    def _stop_ids(self) -> List[int]:
        return list(self.tokenizer.stop_token_ids)

    # ---------------------------------------------------------------- engine.Turns
    def end_turn(self, request: int, prompt: int, turn_ids: List[int]) -> bool:
        text = self.tokenizer.decode(turn_ids[:-1])  # without its stop token
        if not text.rstrip().endswith("</tool_call>"):
            return False
        # a turn that ends with </tool_call> but holds no whole <tool_call>...</tool_call> gets an error answer (with
        # no call to wait for, its sample would stay parked for good)
        calls = [check_call(c, self.allowed) for c in parse_tool_calls(text)] or \
            [ToolCall("", error="no tool call found: a call is <tool_call>{\"name\": ..., \"arguments\": {...}}"
                                "</tool_call>")]
        self._waiting[request] = [None] * len(calls)
        for j, call in enumerate(calls):
            self.calls[request].append({"name": call.name, "arguments": call.arguments, "status": None,
                                        "response": None, "seconds": 0.0})
            self.pool.submit((request, j, len(self.calls[request]) - 1), call)
        return True

    def poll(self, block: bool) -> List[Tuple[int, List[int]]]:
        ready = []
        while True:
            for (request, j, k), result in self.pool.poll(None if block else 0.0):
                self._record(request, k, result)
                self._waiting[request][j] = result
                if all(r is not None for r in self._waiting[request]):
                    ready.append((request, self._turn_ids(request, self._waiting.pop(request))))
            if ready or not block or not self._waiting:
                return ready

    def _record(self, request: int, k: int, result: ToolResult) -> None:
        call = self.calls[request][k]
        call.update(status=result.status, response=result.response(), seconds=result.seconds)

    def _turn_ids(self, request: int, results: List[ToolResult]) -> List[int]:
        answers, ids = self.fitted_turn([r.response() for r in results])
        self.answers[request].append(answers)
        return ids

    def fitted_turn(self, responses: Sequence[str]) -> Tuple[List[str], List[int]]:
        """(the answers as the model reads them, the tool turn's ids): each response cut to tool_response_max_tokens
        tokens, then, while the rendered turn is over max_turn_tokens ids, the longest answers cut by the excess
        (shared among the answers of the longest length, down to the next length at most) and the turn rendered
        again; over the budget only when even empty answers do not fit (module docstring)."""
        enc, dec = self.tokenizer.encode, self.tokenizer.decode
        sizes = [min(len(enc(r)), self.response_tokens) for r in responses]
        while True:
            answers = [truncate_response(r, enc, dec, n) for r, n in zip(responses, sizes)]
            ids = enc(self.tool_turn_text(answers))
            excess = len(ids) - self.max_turn_tokens
            longest = max(sizes, default=0)
            if excess <= 0 or longest == 0:
                return answers, ids
            at_longest = sum(n == longest for n in sizes)
            next_longest = max((n for n in sizes if n < longest), default=0)
            cap = max(next_longest, longest - max(1, -(-excess // at_longest)))  # below longest: the loop ends
            sizes = [min(n, cap) for n in sizes]

    # ---------------------------------------------------------------- metrics
    def stats(self, samples: int) -> Dict[str, float]:
        calls = [c for per in self.calls.values() for c in per]
        return {"tool/calls_mean": len(calls) / max(samples, 1),
                "tool/errors": float(sum(c["status"] == "error" for c in calls)),
                "tool/timeouts": float(sum(c["status"] == "timeout" for c in calls)),
                "tool/seconds": float(sum(c["seconds"] for c in calls))}

    def columns(self, request: int) -> Dict[str, list]:
        """What the rewards see of request's conversation besides its tokens: `tool_calls`, each call's name,
        arguments, status and response (as the tool gave it), and `turn_messages`, each appended turn's chat
        messages (one tool message per call, its answer as the model read it, cut to tool_response_max_tokens)."""
        return {"tool_calls": [{k: c[k] for k in ("name", "arguments", "status", "response")}
                               for c in self.calls.get(request, ())],
                "turn_messages": [[{"role": "tool", "content": a} for a in answers]
                                  for answers in self.answers.get(request, ())]}

    def carry(self, request: int, prompt: int) -> dict:
        """request's conversation so far, as JSON (partial rollouts carry an unfinished one to a later call, which
        `restore`s it): its calls and the answers as the model read them. Its calls have all answered (a call that
        stops early waits for them: engine `min_groups`)."""
        return {"calls": [dict(c) for c in self.calls.get(request, ())],
                "answers": [list(a) for a in self.answers.get(request, ())]}

    def restore(self, request: int, state: dict) -> None:
        """After `reset`: request of the next call goes on with the conversation `carry` gave."""
        self.calls[request] = [dict(c) for c in state["calls"]]
        self.answers[request] = [list(a) for a in state["answers"]]

    def reset(self) -> None:
        """Before the next generate call."""
        self.calls.clear()
        self.answers.clear()
        self._waiting.clear()
