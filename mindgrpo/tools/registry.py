"""The tool registry: functions the policy may call in its rollouts, each with its JSON-schema parameters.

    @register_tool("weather", description="Today's temperature in a city, in degrees C",
                   parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    def weather(city: str) -> str: ...

A tool takes the model's arguments as keywords and returns text (anything else is written as JSON); an exception
is an error the model sees (ToolTimeout: a timeout of the tool's own). Its keyword-only parameters with defaults
are settings, bound from the config (`tool_settings`), never arguments the model may pass. `tool_schema(name)` is the definition the chat template renders into the system turn (the
OpenAI / transformers form {"type": "function", "function": {name, description, parameters}}); `check_arguments`
validates a call's arguments against `parameters` (jsonschema). Tools run in worker processes
(mindgrpo/tools/pool.py), which find them by name: a worker loads the plugin file that registered a name
(`load_tool_plugin`), or imports the module that defined it (`tool_origin`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Tuple

import jsonschema

from mindgrpo.utils.registry import Registry

TOOLS = Registry("tool")


class ToolFailure(RuntimeError):
    """A tool's error that the model should see as such (the message is the tool's response)."""


class ToolTimeout(ToolFailure):
    """A tool's own wall clock ran out (counted as a timeout, like a call that outlives the pool's)."""


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., object]
    description: str
    parameters: Mapping  # a JSON schema of type "object"

    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}


def register_tool(name: str, *, description: str, parameters: Mapping, overwrite: bool = False):
    """Decorator registering `fn(**arguments) -> str` as tool `name` (also the entry point for plugins)."""
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise ValueError(f"tool {name!r}: parameters must be a JSON schema of type 'object'")
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as error:
        raise ValueError(f"tool {name!r}: its parameters are no valid JSON schema: {error.message}") from None

    def add(fn: Callable) -> Callable:
        TOOLS.register(name, Tool(name, fn, description, parameters), overwrite=overwrite)
        return fn

    return add


def get_tool(name: str) -> Tool:
    return TOOLS.get(name)


def tool_schema(name: str) -> dict:
    return TOOLS.get(name).schema()


def tool_settings(name: str) -> Dict[str, object]:
    """The tool's settings: its keyword-only parameters and their defaults."""
    return {n: p.default for n, p in inspect.signature(TOOLS.get(name).fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_settings(name: str, settings: Mapping) -> None:
    unknown = sorted(set(settings) - set(tool_settings(name)))
    if unknown:
        raise ValueError(f"tool {name!r} has no setting(s) {unknown}; valid: {sorted(tool_settings(name)) or '(none)'}")


def check_arguments(tool: Tool, arguments) -> None:
    """Raise ValueError (one line) when `arguments` do not fit the tool's parameters."""
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {tool.name!r} must be a JSON object, got {type(arguments).__name__}")
    settings = sorted(set(arguments) & set(tool_settings(tool.name)))
    if settings:
        raise ValueError(f"{settings} of {tool.name!r} are settings, not arguments")
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(tool.parameters).iter_errors(arguments))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        raise ValueError(f"bad arguments for {tool.name!r}{' at ' + where if where else ''}: {error.message}")


_PLUGINS: Dict[str, List[str]] = {}  # real path -> names it registered


def load_tool_plugin(path: str) -> List[str]:
    """Import the Python file `path`, whose `@register_tool(...)` decorators add tools; returns the new names
    (loading the same file again returns the names of the first load)."""
    real = os.path.realpath(path)
    if real in _PLUGINS:
        return list(_PLUGINS[real])
    if not os.path.isfile(real):
        raise FileNotFoundError(f"tool plugin {path!r} does not exist")
    stem = os.path.splitext(os.path.basename(real))[0]
    module_name = f"mindgrpo_tool_plugin_{stem}_{hashlib.sha1(real.encode()).hexdigest()[:8]}"
    before = set(TOOLS.names())
    spec = importlib.util.spec_from_file_location(module_name, real)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    added = sorted(set(TOOLS.names()) - before)
    _PLUGINS[real] = added
    return list(added)


def tool_origin(name: str) -> Tuple[str, str]:
    """("plugin", file) when a plugin file registered tool `name`, else ("module", the defining module)."""
    for path, names in _PLUGINS.items():
        if name in names:
            return "plugin", path
    return "module", TOOLS.get(name).fn.__module__
