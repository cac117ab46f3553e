"""Arithmetic without eval: an expression parsed by `ast` and evaluated node by node over a closed set of
operations.

    calculate("123 + 456 * (7 - 2)")   # -> "2403"
    calculate("sqrt(2) / 3")           # -> "0.471404520791"

Numbers, + - * / // % **, unary + -, parentheses and the functions in FUNCTIONS; anything else (names,
attributes, calls of other functions, strings, comprehensions) is refused with CalculatorError. Powers and
results are bounded so that no expression can take long or eat memory (9 ** 9 ** 9 is refused, not computed).
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from typing import Callable, Dict, Union

Number = Union[int, float]

MAX_CHARS = 1000  # longest expression
MAX_BITS = 4096  # largest integer result (a 1,233-digit number)
MAX_EXPONENT = 1024


class CalculatorError(ValueError):
    pass


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT and abs(base) not in (0, 1):
        raise CalculatorError(f"exponent {exponent} is too large (at most {MAX_EXPONENT})")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 \
            and abs(base).bit_length() * exponent > 2 * MAX_BITS:
        raise CalculatorError("the result is too large")
    return base ** exponent


BINARY: Dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: _power,
}
UNARY: Dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
FUNCTIONS: Dict[str, Callable[..., Number]] = {
    "abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "floor": math.floor, "ceil": math.ceil,
    "log": math.log, "exp": math.exp,
}
CONSTANTS: Dict[str, float] = {"pi": math.pi, "e": math.e}


def _checked(value) -> Number:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError(f"not a number: {value!r}")
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalculatorError("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not finite")
    return value


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        return _checked(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        return _checked(BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return _checked(UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS \
            and not node.keywords:
        return _checked(FUNCTIONS[node.func.id](*(_evaluate(a) for a in node.args)))
    what = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
    raise CalculatorError(f"unsupported expression: {what}")


def format_number(value: Number) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.12g}" if isinstance(value, float) else str(value)


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text; CalculatorError for anything else."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("an expression is needed, e.g. 123 + 456")
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        with warnings.catch_warnings():  # Python's own SyntaxWarnings ("12if": invalid decimal literal) would go to
            warnings.simplefilter("ignore")  # the run's stderr: the error below is what the model reads
            tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalculatorError(f"cannot parse {expression!r}: {error.msg}") from None
    try:
        return format_number(_evaluate(tree))
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except (OverflowError, TypeError, ValueError) as error:
        if isinstance(error, CalculatorError):
            raise
        raise CalculatorError(str(error)) from None
