"""The reward-function registry, parameter binding and user plugins.

A reward function has TRL's signature

    fn(completions: list[str], <required columns>, <optional columns>=None, *, <parameters>, **kwargs)
        -> list[float | None]

Dataset columns (`solution`, `answer`, `prompt`, `completion_length`, ...) arrive as keyword lists aligned with
`completions`; every function takes **kwargs so it ignores the columns it does not use. Tunable parameters are
keyword-only; `get_reward(name, **params)` binds them and rejects unknown or missing ones, and runs the
parameter check registered with the function (`register_reward(name, check=...)`). It never calls the function
itself: what can be checked before the first step is the signature and the parameter values (a call on zero
completions would reject valid functions that reduce over their input). None means "cannot score this
completion".

Reward functions also run in worker processes (mindgrpo/rewards/pool.py), which find them by name: a worker
loads the plugin file that registered a name (`load_reward_plugin`), or imports the module that defined it
(`reward_origin`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import sys
import traceback
from typing import Callable, Dict, List, Optional, Tuple

from mindgrpo.rewards.scoring import RewardError
from mindgrpo.utils.registry import Registry

REWARDS = Registry("reward function")
_CHECKS: Dict[str, Callable] = {}  # name -> check(**parameters), raising ValueError on a bad value

RewardFn = Callable[..., List]


def register_reward(name: str, *, overwrite: bool = False, check: Optional[Callable] = None):
    """Decorator registering a reward function under `name` (also the entry point for plugins).

    check: called by `get_reward` with every keyword-only parameter (defaults filled in); raises ValueError
    on a value the function cannot work with, so that bad settings fail at start-up."""
    register = REWARDS.register(name, overwrite=overwrite)

    def add(fn: Callable) -> Callable:
        register(fn)
        if check is not None:
            _CHECKS[name] = check
        else:
            _CHECKS.pop(name, None)
        return fn

    return add


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
    _check_signature(name, fn)
    if name in _CHECKS:
        values = {n: params.get(n, p.default) for n, p in accepted.items()}
        try:
            _CHECKS[name](**values)
        except ValueError as error:
            raise ValueError(f"reward {name!r}: {error}") from None
    return functools.partial(fn, **params) if params else fn


def _check_signature(name: str, fn: Callable) -> None:
    """A reward takes the completions first (positionally) and **kwargs (it is given every dataset column)."""
    params = list(inspect.signature(fn).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not params or params[0].kind not in positional:
        raise TypeError(f"reward {name!r} must take the completions as its first parameter: "
                        "fn(completions, <columns>, **kwargs)")
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        raise TypeError(f"reward {name!r} must accept **kwargs: it is given every dataset column "
                        "(solution, prompt, completion_length, ...)")


_PLUGINS: Dict[str, List[str]] = {}  # real path -> names it registered


def _plugin_error(path: str, real: str, e: Exception, source: str) -> RewardError:
    """`FILE:LINE: SyntaxError: ... (source)`: an error raised while a plugin file is imported, at its line in the
    file (a syntax error's own line; else the last frame of the traceback inside the file)."""
    if isinstance(e, SyntaxError) and e.filename and os.path.realpath(e.filename) == real:
        where, what = e.lineno, e.msg
    else:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.realpath(f.filename) == real]
        where, what = (frames[-1].lineno if frames else "?"), str(e)
    return RewardError(f"{path}:{where}: {type(e).__name__}: {what} ({source})")


def load_reward_plugin(path: str, source: str = "reward plugin") -> List[str]:
    """Import the Python file `path`, whose `@register_reward(...)` decorators add rewards; returns the new names.
    An error while importing it is a RewardError in one line naming the file's line and `source` (the flag or
    key that named the file).

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
    except Exception as e:  # noqa: BLE001  the user's code: any error is one line naming its line
        del sys.modules[module_name]
        raise _plugin_error(path, real, e, source) from None
    except BaseException:
        del sys.modules[module_name]
        raise
    added = sorted(set(REWARDS.names()) - before)
    _PLUGINS[real] = added
    return list(added)


def reward_origin(name: str) -> Tuple[str, str]:
    """Where a worker process finds reward `name`: ("plugin", file) when a plugin file registered it, else
    ("module", module name) of the module that defined it (the built-ins: mindgrpo.rewards.builtin)."""
    for path, names in _PLUGINS.items():
        if name in names:
            return "plugin", path
    return "module", REWARDS.get(name).__module__
