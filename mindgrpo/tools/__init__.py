"""Tools the policy calls during its rollouts: a registry with JSON-schema parameters, built-ins, a worker pool.

    from mindgrpo.tools import ToolPool, parse_tool_calls, check_call, register_tool, tool_schema

Built-ins (mindgrpo/tools/builtin.py): calculator (an ast evaluator, no eval), python (a sandboxed interpreter,
mindgrpo/tools/sandbox.py). The manual: docs/tools.md.
"""

from mindgrpo.tools import builtin  # noqa: F401  (registers the built-ins)
from mindgrpo.tools.calls import ToolCall, ToolResult, check_call, parse_tool_calls, truncate_response
from mindgrpo.tools.pool import ToolPool, ToolPoolError
from mindgrpo.tools.registry import (
    TOOLS,
    ToolFailure,
    ToolTimeout,
    check_arguments,
    get_tool,
    load_tool_plugin,
    register_tool,
    tool_origin,
    tool_schema,
    tool_settings,
)

__all__ = [
    "TOOLS", "ToolCall", "ToolFailure", "ToolPool", "ToolPoolError", "ToolResult", "ToolTimeout", "check_arguments",
    "check_call", "get_tool", "load_tool_plugin", "parse_tool_calls", "register_tool", "tool_origin", "tool_schema",
    "tool_settings", "truncate_response",
]
