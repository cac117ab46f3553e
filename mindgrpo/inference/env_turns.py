"""Multi-turn environments as the engine's conversation turns (`engine.Turns`): each sample is a conversation
with its own environment (mindgrpo/envs), whose observations are appended to the sample's KV cache as user
turns, run in the tool workers while the other samples decode.

    turns = EnvTurns(tokenizer, "guess_number", tokenizer_config=".../tokenizer_config.json",
                     settings={"high": 50}, max_turns=4, observation_max_tokens=128)
    turns.reset()
    prompt_ids = turns.prompts(questions)               # each question's env.reset: its first user message
    out = engine.generate(prompt_ids, params, turns=turns)
    turns.finish(out)                                   # steps the turns the engine ended; fixes finish_reason
    turns.columns(r)   # {"env_reward": the summed rewards, "env_done": bool, "messages": the conversation}
    turns.stats(len(out))                               # env/* metrics

A model turn that ends with a stop token is stepped (`step(text)`, the stop token left out) on the worker pool;
its sample stays parked until the answer comes. Not done: the observation, cut to observation_max_tokens
tokens, is the next user turn as the model's chat template writes it (up to the open assistant turn). Done: the
conversation ends ("stop"). The model's last turn (the engine ends a sample at max_turns, max_tokens or a turn
too long to append without asking) is stepped by `finish`, so its reward counts too. An environment that raises,
crashes, returns the wrong types or outlives timeout_s ends its conversation (finish_reason "length", as a cut
sample), is counted in env/errors or env/timeouts, and never stops generate.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.data.templates import ChatTemplateError, render_chat
from mindgrpo.data.tokenizer import QwenTokenizer
from mindgrpo.envs import environment_pool, load_environment_plugin, reset_call, reset_result, step_call, step_result
from mindgrpo.tools.calls import ToolResult, truncate_response
from mindgrpo.tools.pool import ToolPool

_MODEL = "\x00model turn\x00"
_USER = "\x00question\x00"
_OBSERVATION = "\x00observation\x00"


class EnvTurns:
    """The engine's Turns for an environment (see the module docstring). pool: a shared `envs.environment_pool`
    (default: one of num_workers workers with timeout_s per call, closed by close())."""

    def __init__(self, tokenizer: QwenTokenizer, environment: str, tokenizer_config: str, *,
                 settings: Optional[Mapping] = None, plugins: Sequence[str] = (), max_turns: int = 4,
                 observation_max_tokens: int = 256, max_turn_tokens: Optional[int] = None,
                 system: Optional[str] = None, pool: Optional[ToolPool] = None, num_workers: int = 2,
                 timeout_s: float = 10.0, **template_kwargs):
        self.tokenizer, self.environment, self.settings = tokenizer, environment, dict(settings or {})
        for path in plugins:  # the workers load them too
            load_environment_plugin(path)
        reset_call(environment, self.settings, "")  # an unknown environment or setting fails here, in one line
        self.tokenizer_config, self.system, self.template_kwargs = tokenizer_config, system, template_kwargs
        self.max_turns, self.observation_tokens = max_turns, observation_max_tokens
        self.max_turn_tokens = max_turn_tokens or observation_max_tokens + 32
        self._own_pool = pool is None
        self.pool = environment_pool(plugins, num_workers, timeout_s) if pool is None else pool
        self._shape: Optional[str] = None
        self.reset()

    def reset(self) -> None:
        """Before the next batch: forget the conversations of the last."""
        self._start: Dict[int, Tuple[str, Optional[str], Optional[ToolResult]]] = {}  # key -> (obs, state, failure)
        self._state: Dict[int, str] = {}  # request -> its environment, pickled, after its last step
        self.steps: Dict[int, List[dict]] = defaultdict(list)  # request -> {reward, status, seconds, error}
        self._observations: Dict[int, List[str]] = defaultdict(list)  # handed to the engine, in order
        self._ended: Dict[int, str] = {}  # request -> "done" (the environment's) | "error" | "timeout"
        self._pending: set = set()
        self._texts: Dict[int, List[str]] = defaultdict(list)  # the model turns stepped, as the environment saw them
        self._ended_by_env: set = set()  # conversations the engine ended because the environment was done
        self._messages: Dict[int, List[dict]] = {}
        self._firsts: Dict[int, List[dict]] = {}  # request -> its first messages (a conversation `restore`d)
        self._keys: List[int] = []  # the engine's prompt_index of each prompt of the batch
        self.reset_failures: List[ToolResult] = []

    # ---------------------------------------------------------------- the first user turn
    def prompts(self, questions: Sequence[str], index: Optional[Sequence[int]] = None) -> List[List[int]]:
        """Each question's environment reset (in parallel on the pool), its observation rendered as the first
        user turn (after `system`) with the open assistant turn: the prompts' token ids. index: the engine's
        prompt_index of each (default 0, 1, ...). A reset that fails leaves the question as the prompt and
        the conversation single-turn (counted once in env/errors or env/timeouts)."""
        keys = list(range(len(questions))) if index is None else [int(k) for k in index]
        if len(set(keys)) != len(keys) or len(keys) != len(questions):
            raise ValueError(f"prompts: index must give one distinct prompt_index per question, got {keys}")
        self._keys = keys
        for k, q in zip(keys, questions):
            self.pool.submit(("reset", k), reset_call(self.environment, self.settings, q))
        results: Dict[int, ToolResult] = {}
        while len(results) < len(keys):
            results.update({key[1]: r for key, r in self.pool.poll(None)})
        out = []
        for k, q in zip(keys, questions):
            r = results[k]
            if r.status == "ok":
                observation, state = reset_result(r.text)
                self._start[k] = (observation, state, None)
            else:
                self.reset_failures.append(r)
                self._start[k] = (q, None, r)
            out.append(self.tokenizer.encode(render_chat(self._first(k), tokenizer_config=self.tokenizer_config,
                                                         add_generation_prompt=True, **self.template_kwargs)))
        return out

    def _first(self, key: int) -> List[dict]:
        return ([{"role": "system", "content": self.system}] if self.system is not None else []) + [
            {"role": "user", "content": self._start[key][0]}]

    # ---------------------------------------------------------------- the next user turn
    def observation_text(self, observation: str) -> str:
        """What the chat template writes after a model turn (its end-of-turn mark excluded) for a user message,
        up to the open assistant turn."""
        if self._shape is None:
            text = render_chat([{"role": "user", "content": _USER}, {"role": "assistant", "content": _MODEL},
                                {"role": "user", "content": _OBSERVATION}], tokenizer_config=self.tokenizer_config,
                               add_generation_prompt=True, **self.template_kwargs)
            after = text.split(_MODEL, 1)[1]
            ends = [self.tokenizer.decode([i]) for i in self.tokenizer.stop_token_ids]
            end = next((t for t in ends if after.startswith(t)), None)
            if end is None or after.count(_OBSERVATION) != 1:
                raise ChatTemplateError(f"{self.tokenizer_config}: cannot find the user turn in the chat template's "
                                        "text (an assistant turn that ends with a stop token, then a user message)")
            self._shape = after[len(end):]
        return self._shape.replace(_OBSERVATION, observation)

    # ---------------------------------------------------------------- engine.Turns
    def end_turn(self, request: int, prompt: int, turn_ids: List[int]) -> bool:
        if not self._begin(request, prompt):
            return False
        self._submit(request, self.tokenizer.decode(turn_ids[:-1]))  # without its stop token
        return True

    def _begin(self, request: int, prompt: Optional[int]) -> bool:
        """The conversation's state set up from its prompt's reset; False when that reset failed."""
        if request not in self._state and request not in self._ended:
            if prompt not in self._start:
                raise KeyError(f"EnvTurns: no environment was reset for prompt_index {prompt}: make the prompts "
                               "with EnvTurns.prompts(questions, index) and pass the same index to generate")
            _, state, failure = self._start[prompt]
            if failure is not None:
                self._ended[request] = "reset " + failure.status
            else:
                self._state[request] = state
        return request not in self._ended

    def _submit(self, request: int, text: str) -> None:
        self._pending.add(request)
        self._texts[request].append(text)
        self.pool.submit(("step", request), step_call(self.environment, self.settings, self._state[request], text))

    def poll(self, block: bool) -> List[Tuple[int, List[int]]]:
        ready = []
        while True:
            for (_, request), result in self.pool.poll(None if block and self._pending else 0.0):
                observation = self._record(request, result)
                if observation is None:  # done, or failed: the conversation ends (an empty turn)
                    if self._ended[request] == "done":
                        self._ended_by_env.add(request)
                    ready.append((request, []))
                else:
                    enc, dec = self.tokenizer.encode, self.tokenizer.decode
                    observation = truncate_response(observation, enc, dec, self.observation_tokens)
                    self._observations[request].append(observation)
                    ready.append((request, enc(self.observation_text(observation))))
            if ready or not block or not self._pending:
                return ready

    def _record(self, request: int, result: ToolResult) -> Optional[str]:
        """Book a step's answer; its observation when the conversation goes on."""
        self._pending.discard(request)
        step = {"status": result.status, "seconds": result.seconds, "reward": 0.0, "error": None}
        self.steps[request].append(step)
        if result.status != "ok":
            step["error"] = result.response()
            self._ended[request] = result.status
            return None
        observation, step["reward"], done, self._state[request] = step_result(result.text)
        if done:
            self._ended[request] = "done"
            return None
        return observation

    # ---------------------------------------------------------------- after generate
    def finish(self, completions: Sequence) -> None:
        """Steps each conversation's last model turn that the environment has not seen (the engine ended the
        sample without asking: max_turns, max_tokens, a turn too long), waits for them, marks the
        conversations the environment ended as stopped, and builds each one's messages."""
        for r, c in enumerate(completions):
            runs = _model_runs(c.model_mask)
            if c.finish_reason == "partial":  # partial rollouts: not finished, its turn goes on in a later call
                continue
            if runs and len(self.steps[r]) < len(runs) and self._begin(r, self._key(c)):
                a, b = runs[-1]
                ids = c.token_ids[a:b]
                self._submit(r, self.tokenizer.decode(ids[:-1] if c.finish_reason == "stop" else ids))
        while self._pending:
            for (_, request), result in self.pool.poll(None):
                self._record(request, result)
        for r, c in enumerate(completions):
            if c.finish_reason == "partial":
                continue
            if r in self._ended_by_env:
                c.finish_reason = "stop"
            turns = []
            for k, (a, b) in enumerate(_model_runs(c.model_mask)):
                ids = c.token_ids[a:b]
                text = self._texts[r][k] if k < len(self._texts[r]) else self.tokenizer.decode(
                    ids[:-1] if c.finish_reason == "stop" else ids)  # a conversation whose reset failed
                turns.append({"role": "assistant", "content": text})
                if k < c.turns:
                    turns.append({"role": "user", "content": self._observations[r][k]})
            self._messages[r] = self._first_messages(r, self._key(c)) + turns

    def _key(self, c) -> Optional[int]:
        """The engine's prompt_index of c's prompt in the last `prompts` call (None: a restored conversation's)."""
        return self._keys[c.prompt_index] if c.prompt_index < len(self._keys) else None

    def _first_messages(self, request: int, prompt: Optional[int]) -> List[dict]:
        return self._firsts[request] if request in self._firsts else self._first(prompt)

    # ---------------------------------------------------------------- partial rollouts
    def carry(self, request: int, prompt: int) -> dict:
        """request's conversation so far as JSON (partial rollouts carry an unfinished one to a later call, which
        `restore`s it): its environment (pickled and base64-encoded by the workers after each step, as they send it;
        a sample not started: its reset's), its steps, observations and model turns as stepped, how it ended, and its
        first messages. No step is pending (a call that stops early waits for them: engine `min_groups`)."""
        self._begin(request, prompt)
        return {"state": self._state.get(request), "ended": self._ended.get(request),
                "by_env": request in self._ended_by_env, "steps": [dict(s) for s in self.steps.get(request, ())],
                "observations": list(self._observations.get(request, ())),
                "texts": list(self._texts.get(request, ())), "first": self._first_messages(request, prompt)}

    def restore(self, request: int, state: dict) -> None:
        """After `reset`: request of the next call goes on with the conversation `carry` gave."""
        if state["state"] is not None:
            self._state[request] = state["state"]
        if state["ended"] is not None:
            self._ended[request] = state["ended"]
        if state["by_env"]:
            self._ended_by_env.add(request)
        self.steps[request] = [dict(s) for s in state["steps"]]
        self._observations[request] = list(state["observations"])
        self._texts[request] = list(state["texts"])
        self._firsts[request] = [dict(m) for m in state["first"]]

    def columns(self, request: int) -> Dict[str, object]:
        """Extra reward columns of one sample (after finish): env_reward (its steps' rewards summed), env_done
        (the environment ended it), messages (the conversation as the model saw it)."""
        return {"env_reward": float(sum(s["reward"] for s in self.steps.get(request, ()))),
                "env_done": self._ended.get(request) == "done", "messages": self._messages[request]}

    def stats(self, samples: int) -> Dict[str, float]:
        steps = [s for per in self.steps.values() for s in per]
        n = max(samples, 1)
        return {"env/reward_mean": sum(s["reward"] for s in steps) / n,
                "env/steps_mean": len(steps) / n,
                "env/done_fraction": sum(v == "done" for v in self._ended.values()) / n,
                "env/errors": float(sum(s["status"] == "error" for s in steps)
                                    + sum(f.status == "error" for f in self.reset_failures)),
                "env/timeouts": float(sum(s["status"] == "timeout" for s in steps)
                                      + sum(f.status == "timeout" for f in self.reset_failures)),
                "env/seconds": float(sum(s["seconds"] for s in steps))}

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> "EnvTurns":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _model_runs(mask: np.ndarray) -> List[Tuple[int, int]]:
    """(start, end) of each run of the model's own tokens in a trajectory."""
    if mask is None or not len(mask):
        return []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(mask, np.int64), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]
