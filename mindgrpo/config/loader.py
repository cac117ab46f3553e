"""Frozen-dataclass configs: defaults in the dataclasses, then YAML, then dotted CLI overrides.

    cfg = load_config(GRPOConfig, "recipes/qwen2_5_0_5b_grpo.yaml",
                      ["rl_config.max_steps=1", "actor_config.lr=2e-6", "reward_config.verifier_weight=[1, 0.5]"])

Every key is checked when the config is built, so mistakes fail at start-up with one
`ConfigError` naming the full dotted key:
  * unknown keys, at any depth, listing the valid keys of their section;
  * wrong types, naming the expected type. YAML values keep their YAML type (ints widen to
    float; nothing else converts). CLI values are strings and are converted to the field's type:
    int, float, bool (true/false/True/False/1/0), str (taken verbatim), Optional[...] (null,
    None, ~ mean None), Literal[...] choices, and lists/tuples/dicts/sections written in YAML
    flow syntax (`[1, 2]`, `{data_parallel: 2}`; a section set whole replaces its YAML keys);
  * non-finite floats (nan, inf, -inf; YAML's .nan and .inf), from YAML or the command line;
  * cross-field rules in a dataclass's `__post_init__`, which raises `ConfigError(key, message)`
    with its own field name; the loader prefixes the section's path (a plain ValueError, from a
    dataclass outside this package, becomes a ConfigError naming the section).

YAML is read with PyYAML's safe loader plus the YAML 1.2 float rule, so `lr: 1e-6` is a float
(PyYAML alone reads it as the string "1e-6").
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Mapping
from typing import Any, Iterable, Optional, Union

import yaml

__all__ = ["ConfigError", "check", "from_dict", "load_config", "load_yaml", "parse_overrides", "to_dict",
           "to_yaml"]


class ConfigError(ValueError):
    """A bad config value; `key` is its full dotted path ('' for the whole config)."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"config key '{key}': {message}" if key else f"config: {message}")

    def under(self, prefix: str) -> "ConfigError":
        return ConfigError(_join(prefix, self.key), self.message)


class _BadValue(ConfigError):
    """The value has the field's type but is not allowed (a non-finite float)."""


def check(condition: bool, key: str, message: str) -> None:
    """For `__post_init__`: raise ConfigError(key, message) unless condition holds."""
    if not condition:
        raise ConfigError(key, message)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and key else prefix or key


# ---------------------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    pass


# YAML 1.2 floats: also 1e-6 and 1E5 without a dot (PyYAML copies the resolver table for the subclass)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_value(text: str, key: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise ConfigError(key, f"cannot parse {text!r} as YAML: {e}") from None


def load_yaml(path) -> dict:
    """A YAML file's top-level mapping ({} for an empty file)."""
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_Loader)
    except OSError as e:
        raise ConfigError("", f"cannot read config file {path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError("", f"cannot parse config file {path}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError("", f"config file {path} must hold a mapping, got {type(data).__name__}")
    return dict(data)


def to_yaml(cfg) -> str:
    """The config as YAML, every key spelled out; `load_config(type(cfg), path)` reads it back."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


# ---------------------------------------------------------------------------------------
# CLI overrides
# ---------------------------------------------------------------------------------------


class _CliValue(str):
    """A raw command-line string, converted to the field's type when the config is built."""


def parse_overrides(overrides: Iterable[str]) -> dict:
    """["a.b=1", "--a.c=x"] -> {"a": {"b": "1", "c": "x"}} with raw string leaves; later wins."""
    tree: dict = {}
    for arg in overrides:
        text = arg[2:] if arg.startswith("--") else arg
        key, sep, value = text.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError("", f"override {arg!r} must look like section.key=value")
        *sections, leaf = key.split(".")
        node, path = tree, ""
        for part in sections:
            path = _join(path, part)
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(path, f"set as a value by one override and as a section by {arg!r}")
        if isinstance(node.get(leaf), dict):
            raise ConfigError(key, f"set as a section by one override and as a value by {arg!r}")
        node[leaf] = _CliValue(value)
    return tree


def _merge(base: dict, top: dict) -> dict:
    """Recursive dict merge, `top` winning."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------------
# dict <-> dataclass
# ---------------------------------------------------------------------------------------

_NONE_WORDS = {"null", "Null", "NULL", "None", "none", "~", ""}
_TRUE_WORDS, _FALSE_WORDS = {"true", "True", "1"}, {"false", "False", "0"}
_INT_RE = re.compile(r"^[-+]?[0-9]+$")


def _type_name(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return f"a mapping (section {tp.__name__})"
    if origin is Union:
        return " or ".join("None" if a is type(None) else _type_name(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} ({', '.join(_type_name(a) for a in args)})"
        return f"a list of {_type_name(args[0]) if args else 'values'}"
    if origin is dict:
        return f"a mapping of {_type_name(args[1])}" if args else "a mapping"
    return getattr(tp, "__name__", str(tp))


def _mismatch(value, tp, key) -> ConfigError:
    if isinstance(value, Mapping) and value and all(isinstance(v, _CliValue) for v in value.values()):
        # from an override like `rl_config.max_steps.x=1`
        return ConfigError(_join(key, str(next(iter(value)))), f"'{key}' holds {_type_name(tp)}, not a section")
    if isinstance(value, _CliValue):
        return ConfigError(key, f"expected {_type_name(tp)}, got {str(value)!r} (command line)")
    return ConfigError(key, f"expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _convert(value, tp, key: str):
    """`value` (from YAML, Python, or a raw CLI string) as type `tp`, or ConfigError naming `key`."""
    cli = isinstance(value, _CliValue)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return _yaml_value(value, key) if cli else value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if cli:
            value = _yaml_value(value, key)
        if not isinstance(value, Mapping):
            raise _mismatch(value, tp, key)
        return from_dict(tp, value, key)
    if origin is Union:
        if type(None) in args and (value is None or (cli and value in _NONE_WORDS)):
            return None
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arm, key)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1 and (errors[0].key != key or isinstance(errors[0], _BadValue)):
            raise errors[0]  # the value has the right shape but something inside it is wrong
        raise _mismatch(value, tp, key)
    if origin is typing.Literal:
        for choice in args:
            if value == choice or (cli and not isinstance(choice, str) and value == str(choice)):
                return choice
        raise _mismatch(value, tp, key)
    if origin in (list, tuple):
        if cli:
            value = _yaml_value(value, key)
        if not isinstance(value, (list, tuple)):
            raise _mismatch(value, tp, key)
        if origin is tuple and args and args[-1] is not Ellipsis:  # fixed length
            if len(value) != len(args):
                raise _mismatch(value, tp, key)
            items = [_convert(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
        else:
            arm = args[0] if args else Any
            items = [_convert(v, arm, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if cli:
            value = _yaml_value(value, key)
        if not isinstance(value, Mapping):
            raise _mismatch(value, tp, key)
        k_tp, v_tp = args if args else (Any, Any)
        return {_convert(k, k_tp, key): _convert(v, v_tp, _join(key, str(k))) for k, v in value.items()}
    if tp is bool:
        if cli:
            if value in _TRUE_WORDS:
                return True
            if value in _FALSE_WORDS:
                return False
        elif isinstance(value, bool):
            return value
        raise _mismatch(value, tp, key)
    if tp is int:
        if cli and _INT_RE.match(value):
            return int(value)
        if not cli and isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _mismatch(value, tp, key)
    if tp is float:
        if cli:
            try:
                number = float(value)
            except ValueError:
                raise _mismatch(value, tp, key) from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            raise _mismatch(value, tp, key)
        if not math.isfinite(number):  # nan or inf anywhere silently ruins a run (temperature=inf: no gradient)
            raise _BadValue(key, f"must be a finite number, got {value}")
        return number
    if tp is str:
        if isinstance(value, str):
            return str(value)
        raise _mismatch(value, tp, key)
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _mismatch(value, tp, key)
    raise TypeError(f"config key '{key}': unsupported field type {tp!r}")


def from_dict(cls, data: Mapping, path: str = ""):
    """Build dataclass `cls` from a (nested) mapping, recursing into dataclass fields.

    Keys missing from `data` keep their defaults; unknown keys, wrong types and failed
    `__post_init__` checks raise ConfigError with the full dotted key (`path` prefixes it).
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected a mapping (section {cls.__name__}), got {type(data).__name__} {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [str(k) for k in data if k not in fields]
    if unknown:
        where = f"under '{path}'" if path else f"of {cls.__name__}"
        also = f" (also unknown: {', '.join(unknown[1:])})" if unknown[1:] else ""
        raise ConfigError(_join(path, unknown[0]), f"unknown key{also}; valid keys {where}: {', '.join(fields)}")
    missing = [name for name, f in fields.items() if name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(_join(path, missing[0]), "required key is missing")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _convert(value, hints[name], _join(path, name)) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise e.under(path) from None
    except ValueError as e:  # a dataclass's own check outside the config package (data.synthetic.ArithmeticTask)
        raise ConfigError(path, str(e)) from None


def to_dict(cfg) -> Any:
    """Dataclass -> nested dict of plain values (tuples become lists); from_dict inverts it."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, Mapping):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def config_data(yaml_path=None, overrides: Optional[Iterable[str]] = ()) -> dict:
    """The YAML file's mapping (if any) with the `key.sub=value` overrides merged in, its leaves not yet converted:
    what `load_config` builds the config from (`from_dict`)."""
    data = load_yaml(yaml_path) if yaml_path is not None else {}
    return _merge(data, parse_overrides(overrides or ()))


def data_value(data: Mapping, key: str) -> Any:
    """The value `data` (`config_data`'s) holds at the dotted `key`, unconverted: None when it is absent or null
    (in the YAML or on the command line)."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return None if node is None or (isinstance(node, _CliValue) and node in _NONE_WORDS) else node


def load_config(cls, yaml_path=None, overrides: Optional[Iterable[str]] = ()):
    """Defaults of `cls`, then the YAML file (if any), then `key.sub=value` overrides."""
    return from_dict(cls, config_data(yaml_path, overrides))
