"""The built-in tools: `calculator` (mindgrpo/tools/calculator.py) and `python` (mindgrpo/tools/sandbox.py).

The python tool's keyword-only parameters are its settings (generate_config.tool_settings.python), not
arguments the model passes."""

from __future__ import annotations

from mindgrpo.tools.calculator import calculate
from mindgrpo.tools.registry import ToolFailure, ToolTimeout, register_tool
from mindgrpo.tools.sandbox import SandboxLimits, run_python


@register_tool("calculator", description="Evaluate an arithmetic expression (numbers, + - * / // % **, "
               "parentheses, abs round min max sqrt floor ceil log exp) and return its value.",
               parameters={"type": "object", "properties": {"expression": {
                   "type": "string", "description": "the expression, e.g. 123 + 456 + 789"}},
                   "required": ["expression"], "additionalProperties": False})
def calculator(expression: str) -> str:
    return calculate(expression)


@register_tool("python", description="Run a Python program and return what it prints (stdout and stderr). No "
               "network, no files outside its own scratch directory, limited time and memory.",
               parameters={"type": "object", "properties": {"code": {
                   "type": "string", "description": "the program; print the result"}},
                   "required": ["code"], "additionalProperties": False})
def python(code: str, *, cpu_s: int = SandboxLimits.cpu_s, wall_s: float = SandboxLimits.wall_s,
           memory_mb: int = SandboxLimits.memory_mb, output_bytes: int = SandboxLimits.output_bytes) -> str:
    limits = SandboxLimits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb, output_bytes=output_bytes)
    result = run_python(code, limits)
    if result.status == "timeout":
        raise ToolTimeout(result.output.strip())
    if result.status != "ok":
        raise ToolFailure(result.output.strip())
    return result.output
