"""Final-answer extraction and comparison for math rewards.

    extract_answer(completion)  -> the candidate text (last \\boxed{}, <answer>, ####, "the answer is", last number)
    parse_number(text)          -> Fraction or None, after normalize_answer (units, $, %, separators, \\frac, ...)
    is_correct(completion, solution) -> bool
    answer_key(completion)      -> what a majority vote counts (the exact number, else the normalised text)

Numbers compare exactly as fractions; when neither side is an integer a relative tolerance absorbs rounded
decimals (0.3333 vs 1/3). Answers that are not plain numbers (MATH-style \\sqrt, intervals, ...) go to
`math_verify` when it is installed (an optional dependency), else to a whitespace-insensitive string match.
"""

from __future__ import annotations

import math
import re
import threading
from fractions import Fraction
from typing import Optional, Union

# ----------------------------------------------------------------------------------------------- extraction

_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed\s+([^\s$\\{}]+)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*([^\n]*)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])[-−]?\.\d+")


def _balanced(text: str, start: int) -> Optional[str]:
    """Content of the brace group whose `{` is at text[start - 1], or None if it never closes."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def last_boxed(text: str) -> Optional[str]:
    """Content of the last complete `\\boxed{...}` (balanced braces; `\\fbox{}` and `\\boxed 5` too)."""
    for match in reversed(list(_BOXED_OPEN.finditer(text))):
        content = _balanced(text, match.end())
        if content is not None:
            bare = list(_BOXED_BARE.finditer(text, match.end()))
            return bare[-1].group(1) if bare else content
    bare = list(_BOXED_BARE.finditer(text))
    return bare[-1].group(1) if bare else None


def last_number(text: str) -> Optional[str]:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def extract_answer(completion: str) -> Optional[str]:
    """The candidate final answer of a completion, by the first rule that finds one:
    last \\boxed{...}, last <answer>...</answer>, last `#### x`, last "the answer is x", last number."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.strip()
    for pattern in (_ANSWER_TAG, _HASHES, _ANSWER_IS):
        found = pattern.findall(completion)
        if found and found[-1].strip():
            return found[-1].strip()
    return last_number(completion)


# ----------------------------------------------------------------------------------------------- normalization

_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([-−]?[\d.]+)\s*\}\s*\{\s*([-−]?[\d.]+)\s*\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_SPACING = re.compile(r"\\[!,;:> ]|\\quad|\\qquad|\\left|\\right|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_UNIT_TAIL = re.compile(r"^([-+]?[\d./ ]*\d)\s*[A-Za-z][A-Za-z .']*$")
_UNIT_HEAD = re.compile(r"^(?:rs|usd|inr|eur|gbp)\.?\s*(?=[-+]?[\d.])", re.IGNORECASE)

_PLAIN = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?", re.IGNORECASE)
_RATIO = re.compile(r"([-+]?(?:\d+(?:\.\d*)?|\.\d+))\s*/\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))")
_MIXED = re.compile(r"([-+]?)(\d+)\s+(\d+)\s*/\s*(\d+)")


def answer_key(completion: str) -> Optional[str]:
    """What a majority vote (maj@k) counts: the completion's final answer as an exact number ("7/2",
    "12") when it states one, else its normalised text without spaces; None when it gives no answer."""
    text = extract_answer(completion)
    if text is None:
        return None
    number = parse_number(text)
    if number is not None:
        return str(number)
    squashed = "".join(normalize_answer(text).split())
    return squashed or None


def normalize_answer(text: str) -> str:
    """Strip the surface form of a numeric answer: `$`, `%`, degrees, LaTeX spacing, \\text{}, thousands
    separators (`1,000`, `1{,}000`), `x = `, trailing units and full stops. `\\frac{a}{b}`, `\\dfrac`,
    `\\frac12` become `a/b`; `N\\frac{a}{b}` becomes the mixed number `N a/b`."""
    s = text.strip().replace("−", "-").replace("{,}", ",")  # 1{,}000 is LaTeX for 1,000
    for _ in range(3):  # nested \text{\textbf{...}}
        s = _TEXT_MACRO.sub(r"\1", s)
    s = _SPACING.sub("", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = re.sub(r"(\d)\s*\\[dt]?frac", r"\1 \\frac", s)  # mixed number keeps a separating space
    s = _FRAC.sub(r"\1/\2", s)
    s = _THOUSANDS.sub("", s)
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    s = s.strip().rstrip(".").strip()
    s = _UNIT_HEAD.sub("", s)
    unit = _UNIT_TAIL.match(s)
    if unit:
        s = unit.group(1).strip()
    return s


def parse_number(text: Union[str, int, float]) -> Optional[Fraction]:
    """The exact value of a numeric answer (integer, decimal, a/b, mixed N a/b), else None."""
    s = normalize_answer(str(text))
    if s.startswith("(") and s.endswith(")") and s.count("(") == 1:
        s = s[1:-1].strip()
    try:
        if _PLAIN.fullmatch(s):
            return Fraction(s)
        ratio = _RATIO.fullmatch(s)
        if ratio:
            den = Fraction(ratio.group(2))
            return Fraction(ratio.group(1)) / den if den != 0 else None
        mixed = _MIXED.fullmatch(s)
        if mixed and int(mixed.group(4)) != 0:
            value = int(mixed.group(2)) + Fraction(int(mixed.group(3)), int(mixed.group(4)))
            return -value if mixed.group(1) == "-" else value
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def numbers_match(a: Fraction, b: Fraction, rel_tol: float = 1e-4) -> bool:
    """Exact equality; a relative tolerance only when neither side is an integer (rounded decimals)."""
    if a == b:
        return True
    if a.denominator == 1 or b.denominator == 1:
        return False
    return math.isclose(float(a), float(b), rel_tol=rel_tol)


# ----------------------------------------------------------------------------------------------- comparison


def _math_verify_equal(candidate: str, solution: str) -> Optional[bool]:
    """Symbolic comparison by math_verify, or None when it is not installed."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    # math_verify's timeouts use SIGALRM, which only works on the main thread.
    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None
    gold = parse(f"\\boxed{{{solution}}}", parsing_timeout=timeout)
    pred = parse(f"\\boxed{{{candidate}}}", parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", normalize_answer(text))


def is_correct(completion: str, solution: Union[str, int, float], rel_tol: float = 1e-4) -> bool:
    """Whether the completion's final answer equals `solution` (the reference final answer)."""
    candidate = extract_answer(completion)
    if candidate is None:
        return False
    solution = str(solution)
    gold = parse_number(solution)
    if gold is not None:
        value = parse_number(candidate)
        if value is None:  # "<answer>She pays 18 dollars in total</answer>"
            number = last_number(candidate)
            value = parse_number(number) if number is not None else None
        if value is not None:
            return numbers_match(value, gold, rel_tol)
    symbolic = _math_verify_equal(candidate, solution)
    if symbolic is not None:
        return symbolic
    return _squash(candidate) == _squash(solution)
