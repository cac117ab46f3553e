"""How a generative judge's answer becomes a score (`reward_config.judges[i].parser`): pure functions of the
answer's text, each returning a float or None when the answer holds no score in its format.

    number     the last number in the answer ("7", "Score: 8/10" -> 10, "-2.5" -> -2.5); "8/10" reads as its
               last number, so a template that wants "N/10" should say "the number only"
    score_tag  the number inside the last <score>...</score> ("<score>7</score>" -> 7), anything else around it
    yes_no     the first word that is "yes" or "no", any case ("Yes, it is." -> 1.0, "no" -> 0.0)

    JUDGE_PARSERS.get("number")("I would say 7.")   # 7.0
"""

from __future__ import annotations

import math
import re
from typing import Optional

from mindgrpo.utils.registry import Registry

JUDGE_PARSERS = Registry("judge parser")

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)")
_SCORE_TAG = re.compile(r"<score>\s*([^<]*?)\s*</score>", re.IGNORECASE | re.DOTALL)
_WORD = re.compile(r"[A-Za-z]+")


def _finite(text: str) -> Optional[float]:
    value = float(text)
    return value if math.isfinite(value) else None


@JUDGE_PARSERS.register("number")
def last_number(answer: str) -> Optional[float]:
    found = _NUMBER.findall(answer)
    return _finite(found[-1]) if found else None


@JUDGE_PARSERS.register("score_tag")
def score_tag(answer: str) -> Optional[float]:
    tags = _SCORE_TAG.findall(answer)
    if not tags:
        return None
    inside = _NUMBER.fullmatch(tags[-1])
    return _finite(inside.group(0)) if inside else None


@JUDGE_PARSERS.register("yes_no")
def yes_no(answer: str) -> Optional[float]:
    for word in _WORD.findall(answer):
        if word.lower() in ("yes", "no"):
            return 1.0 if word.lower() == "yes" else 0.0
    return None


__all__ = ["JUDGE_PARSERS"]
