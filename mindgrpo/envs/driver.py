"""Environment calls in the tool workers: `reset` and `step` of one conversation, run as calls of the internal
tool `_environment` on a ToolPool (mindgrpo/tools/pool.py), with its timeouts, crash handling and worker
replacement.

    pool = environment_pool(plugins=["my_envs.py"], num_workers=2, timeout_s=10.0)
    pool.submit(key, reset_call("guess_number", {"high": 50}, prompt))   # result.text: reset_result(...)
    pool.submit(key, step_call("guess_number", {"high": 50}, state, turn_text))

The conversation's state is its environment object, pickled after each call and sent with the next (any worker
can run any step; a worker killed by a timeout loses no other conversation). `_environment`'s parameter schema
accepts no arguments at all, so a model that names it in a tool call gets an error and never runs it.
"""

from __future__ import annotations

import base64
import json
import math
import pickle
from typing import Mapping, Optional, Sequence, Tuple

from mindgrpo.envs.registry import check_environment_settings, load_environment_plugin, make_environment
from mindgrpo.tools.calls import ToolCall
from mindgrpo.tools.pool import ToolPool
from mindgrpo.tools.registry import register_tool

DRIVER = "_environment"


@register_tool(DRIVER, description="internal: one call of an environment (never offered to a model)",
               parameters={"type": "object", "not": {}})
def environment_call(op: str, env: str, settings: dict, payload: str, state: Optional[str] = None, *,
                     plugins: Sequence[str] = ()) -> str:
    """op "reset": a new `env`(**settings), reset with the prompt `payload`; "step": the pickled `state`
    stepped with the model turn `payload`. Returns JSON: the observation, (step) reward and done, the new state."""
    for path in plugins:
        load_environment_plugin(path)
    if op == "reset":
        environment = make_environment(env, settings)
        observation = environment.reset(payload)
        out = {}
    else:
        environment = pickle.loads(base64.b64decode(state))
        result = environment.step(payload)
        if not (isinstance(result, tuple) and len(result) == 3):
            raise TypeError(f"{env}.step must return (observation, reward, done), got {type(result).__name__}")
        observation, reward, done = result
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise TypeError(f"{env}.step: the reward must be a finite number, got {reward!r}")
        if not isinstance(done, bool):
            raise TypeError(f"{env}.step: done must be a bool, got {type(done).__name__}")
        out = {"reward": float(reward), "done": done}
    if not isinstance(observation, str):
        raise TypeError(f"{env}.{op}: the observation must be text, got {type(observation).__name__}")
    out.update(observation=observation, state=base64.b64encode(pickle.dumps(environment)).decode("ascii"))
    return json.dumps(out)


def environment_pool(plugins: Sequence[str] = (), num_workers: int = 2, timeout_s: float = 10.0,
                     max_chars: int = 1 << 22) -> ToolPool:
    """A tool pool whose workers run environment calls (loading the plugin files first)."""
    return ToolPool({DRIVER: {"plugins": tuple(plugins)}}, num_workers, timeout_s, max_chars)


def reset_call(env: str, settings: Mapping, prompt: str) -> ToolCall:
    check_environment_settings(env, settings)
    return ToolCall(DRIVER, {"op": "reset", "env": env, "settings": dict(settings), "payload": prompt})


def step_call(env: str, settings: Mapping, state: str, model_turn: str) -> ToolCall:
    return ToolCall(DRIVER, {"op": "step", "env": env, "settings": dict(settings), "payload": model_turn,
                             "state": state})


def reset_result(text: str) -> Tuple[str, str]:
    """(observation, state) of a reset call's answer."""
    out = json.loads(text)
    return out["observation"], out["state"]


def step_result(text: str) -> Tuple[str, float, bool, str]:
    """(observation, reward, done, state) of a step call's answer."""
    out = json.loads(text)
    return out["observation"], out["reward"], out["done"], out["state"]
