"""The environment registry: multi-turn tasks that answer the model's turns (a user, a game, a grader).

    @register_environment("guess_number")
    class GuessNumber(Environment):
        def __init__(self, *, low: int = 1, high: int = 100): ...   # keyword-only: settings from the config
        def reset(self, prompt: str) -> str: ...                      # the first user message
        def step(self, model_turn: str) -> Tuple[str, float, bool]: ...  # observation, reward, done

One instance serves one conversation: `reset(prompt)` starts it and gives the first observation (the user's
first message), `step(model_turn)` takes the text of a model turn and gives the next observation (the next
user message), that turn's reward and whether the conversation is over. Environments are user code: they run
in worker processes (mindgrpo/envs/driver.py) with a timeout per call, and their state travels between the
workers with each step, pickled, so an environment's attributes must pickle. Plugins: a Python file whose
`@register_environment` decorators add environments (`load_environment_plugin(path)`); a file may register
tools and environments alike.
"""

from __future__ import annotations

import inspect
import os
from typing import Callable, Dict, List, Mapping, Tuple

from mindgrpo.tools.registry import load_tool_plugin
from mindgrpo.utils.registry import Registry

ENVIRONMENTS = Registry("environment")


class Environment:
    """The interface (see the module docstring); subclassing it is optional, the two methods are not."""

    def reset(self, prompt: str) -> str:
        raise NotImplementedError

    def step(self, model_turn: str) -> Tuple[str, float, bool]:
        raise NotImplementedError


def register_environment(name: str, *, overwrite: bool = False) -> Callable:
    """Decorator registering a class (or a factory taking keyword-only settings) as environment `name`."""

    def add(factory: Callable) -> Callable:
        if not callable(factory):
            raise TypeError(f"environment {name!r}: register a class or a factory, got {type(factory).__name__}")
        ENVIRONMENTS.register(name, factory, overwrite=overwrite)
        return factory

    return add


def environment_settings(name: str) -> Dict[str, object]:
    """The environment's settings: its constructor's keyword-only parameters and their defaults."""
    return {n: p.default for n, p in inspect.signature(ENVIRONMENTS.get(name)).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_environment_settings(name: str, settings: Mapping) -> None:
    valid = environment_settings(name)
    unknown = sorted(set(settings) - set(valid))
    if unknown:
        raise ValueError(f"environment {name!r} has no setting(s) {unknown}; valid: {sorted(valid) or '(none)'}")


def make_environment(name: str, settings: Mapping):
    check_environment_settings(name, settings)
    return ENVIRONMENTS.get(name)(**settings)


_PLUGINS: Dict[str, List[str]] = {}  # real path -> environment names it registered


def load_environment_plugin(path: str) -> List[str]:
    """Import the Python file `path` (as load_tool_plugin does: one module per file, loaded once); returns the
    environments it registered."""
    real = os.path.realpath(path)
    if real not in _PLUGINS:
        before = set(ENVIRONMENTS.names())
        load_tool_plugin(real)
        _PLUGINS[real] = sorted(set(ENVIRONMENTS.names()) - before)
    return list(_PLUGINS[real])
