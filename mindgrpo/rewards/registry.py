"""The reward-function registry, parameter binding and user plugins.

A reward function has TRL's signature

    fn(completions: list[str], <required columns>, <optional columns>=None, *, <parameters>, **kwargs)
        -> list[float | None]

Dataset columns (`solution`, `answer`, `prompt`, `completion_length`, ...) arrive as keyword lists aligned with
`completions`; every function takes **kwargs so it ignores the columns it does not use. Tunable parameters are
keyword-only; `get_reward(name, **params)` binds them and rejects unknown or missing ones. None means "cannot
score this completion".
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import sys
from typing import Callable, Dict, List

from mindgrpo.utils.registry import Registry

REWARDS = Registry("reward function")

RewardFn = Callable[..., List]


def register_reward(name: str, *, overwrite: bool = False):
    """Decorator registering a reward function under `name` (also the entry point for plugins)."""
    return REWARDS.register(name, overwrite=overwrite)


def _parameters(fn: Callable) -> Dict[str, inspect.Parameter]:
    return {
        n: p for n, p in inspect.signature(fn).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def reward_parameters(name: str) -> Dict[str, object]:
    """Keyword-only parameters of a registered reward and their defaults (`inspect.Parameter.empty`: required)."""
    return {n: p.default for n, p in _parameters(REWARDS.get(name)).items()}


def required_columns(fn: Callable) -> List[str]:
    """Columns the function cannot run without: its positional parameters after `completions` with no default."""
    fn = fn.func if isinstance(fn, functools.partial) else fn
    params = list(inspect.signature(fn).parameters.values())[1:]
    return [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)
        and p.default is inspect.Parameter.empty
    ]


def get_reward(name: str, **params) -> RewardFn:
    """The reward function `name` with `params` bound; unknown names, unknown or missing parameters and values
    the function rejects fail here."""
    fn = REWARDS.get(name)
    accepted = _parameters(fn)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        valid = ", ".join(sorted(accepted)) or "(none)"
        raise TypeError(f"reward {name!r} got unknown parameter(s) {unknown}; valid: {valid}")
    missing = [n for n, p in accepted.items() if p.default is inspect.Parameter.empty and n not in params]
    if missing:
        raise TypeError(f"reward {name!r} needs parameter(s) {missing}")
    bound = functools.partial(fn, **params) if params else fn
    # A call on zero completions runs the function's own parameter checks now, not inside a training step
    # (where the combiner would turn the error into None scores).
    bound([], **{column: [] for column in required_columns(fn)})
    return bound


_PLUGINS: Dict[str, List[str]] = {}


def load_reward_plugin(path: str) -> List[str]:
    """Import the Python file `path`, whose `@register_reward(...)` decorators add rewards; returns the new names.

    Loading the same file again is a no-op returning the names of the first load.
    """
    real = os.path.realpath(path)
    if real in _PLUGINS:
        return list(_PLUGINS[real])
    if not os.path.isfile(real):
        raise FileNotFoundError(f"reward plugin {path!r} does not exist")
    stem = os.path.splitext(os.path.basename(real))[0]
    module_name = f"mindgrpo_reward_plugin_{stem}_{hashlib.sha1(real.encode()).hexdigest()[:8]}"
    before = set(REWARDS.names())
    spec = importlib.util.spec_from_file_location(module_name, real)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    added = sorted(set(REWARDS.names()) - before)
    _PLUGINS[real] = added
    return list(added)
