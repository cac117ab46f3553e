"""Final-answer extraction and comparison (mindgrpo/rewards/answer.py), against GSM8K answers and math_verify."""

import sys
from fractions import Fraction

import pytest

from mindgrpo.rewards import answer as answer_mod
from mindgrpo.rewards.answer import extract_answer, is_correct, last_boxed, normalize_answer, parse_number


def surface_forms(v: int) -> dict:
    """One completion per way a model may write the final answer v."""
    return {
        "boxed": f"First 2 + 3 = 5, then more steps. So the total is \\boxed{{{v}}}.",
        "boxed_commas": f"The result is \\boxed{{{v:,}}}",
        "hashes": f"She had 12 apples.\n#### {v}",
        "answer_is": f"Adding 3 and 4 gives 7. The answer is {v}.",
        "dollars": f"So he pays 4 times. The answer is ${v:,}.00",
        "last_number": f"Step 1: 10 - 2 = 8. So she has {v} apples left.",
        "dfrac": f"\\boxed{{\\dfrac{{{2 * v}}}{{2}}}}",
        "dot_zero": f"\\boxed{{{v}.0}}",
        "answer_tag": f"<think>3 * 4 = 12, 12 + 1 = 13</think> <answer>{v}</answer>",
        "answer_tag_words": f"<think>I add 3 and 4.</think><answer>The final total is {v} dollars</answer>",
        "text_units": f"\\boxed{{\\text{{{v}}} \\text{{ dollars}}}}",
        "percent": f"\\boxed{{{v}\\%}}",
        "frac_slash": f"\\boxed{{{3 * v}/3}}",
        "spaced_latex": f"\\boxed{{ {v:,} \\! }}".replace(",", "{,}") if abs(v) >= 1000 else f"\\boxed{{ {v} \\! }}",
    }


# math_verify handles these forms the same way; it misreads bare <answer> tags and unit words.
CLEAR_FORMS = ["boxed", "boxed_commas", "hashes", "answer_is", "dollars", "last_number", "dfrac", "dot_zero"]


def test_every_gsm8k_test_answer_in_every_form(gsm8k_test_answers):
    finals = [final for final, _ in gsm8k_test_answers]
    assert len(finals) == 1319 and any(f.startswith("-") for f in finals) and any("," in f for f in finals)
    wrong = []
    for final in finals:
        v = int(final.replace(",", ""))
        for name, text in surface_forms(v).items():
            if not is_correct(text, final):
                wrong.append((final, name, "rejected"))
        for off in (v - 1, v + 1):
            for name, text in surface_forms(off).items():
                if is_correct(text, final):
                    wrong.append((final, name, f"accepted {off}"))
    assert not wrong, f"{len(wrong)} wrong decisions, e.g. {wrong[:5]}"


def test_reference_solutions_score_themselves(gsm8k_test_answers):
    for final, solution in gsm8k_test_answers:
        assert is_correct(solution, final), solution


def test_agrees_with_math_verify_on_clear_forms(gsm8k_test_answers):
    math_verify = pytest.importorskip("math_verify", reason="math-verify (dev dependency) is the reference")
    disagreements = []
    for final, _ in gsm8k_test_answers[::10]:
        v = int(final.replace(",", ""))
        gold = math_verify.parse(f"${v}$")
        for candidate in (v, v + 1, -v if v else 3):
            forms = surface_forms(candidate)
            for name in CLEAR_FORMS:
                ours = is_correct(forms[name], final)
                theirs = math_verify.verify(gold, math_verify.parse(forms[name]))
                if ours != theirs:
                    disagreements.append((final, candidate, name, ours, theirs))
    assert not disagreements, disagreements[:5]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("a \\boxed{1} b \\boxed{\\frac{1}{\\sqrt{2}}} c", "\\frac{1}{\\sqrt{2}}"),  # last, nested braces
        ("\\boxed{12} then cut off \\boxed{13", "12"),  # unbalanced last box is skipped
        ("\\fbox{7}", "7"),
        ("so \\boxed 42 done", "42"),
        ("<answer> 5 </answer> and later #### 6", "5"),  # <answer> outranks ####
        ("#### 6\nThe answer is 7", "6"),  # #### outranks "the answer is"
        ("The answer is: 3,000 dollars\nok", "3,000 dollars"),
        ("we get 3 then 4.5 then -2", "-2"),
        ("no digits here", None),
        ("5-3 gives", "3"),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    "text, value",
    [
        ("1,234,567", Fraction(1234567)),
        ("$1,080.00", Fraction(1080)),
        ("\\$5", Fraction(5)),
        ("25\\%", Fraction(25)),
        ("-7", Fraction(-7)),
        ("\u22127", Fraction(-7)),  # U+2212 minus sign
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("\\dfrac{-6}{4}", Fraction(-3, 2)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("\\frac12", Fraction(1, 2)),
        ("3/4", Fraction(3, 4)),
        ("2\\frac{1}{2}", Fraction(5, 2)),
        ("1\\!000", Fraction(1000)),
        ("x = 12", Fraction(12)),
        ("12 apples.", Fraction(12)),
        ("\\text{12 }\\text{cm}", Fraction(12)),
        ("90^\\circ", Fraction(90)),
        ("0.50", Fraction(1, 2)),
        ("(8)", Fraction(8)),
        ("1/0", None),
        ("\\sqrt{2}", None),
        ("3 hours 20 minutes", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_normalize_answer_strips_surface_form():
    assert normalize_answer(" \\$1{,}000 . ") == "1000"
    assert normalize_answer("$1,000.") == "1000"
    assert normalize_answer("\\left( 5 \\right)") == "( 5 )"


def test_numeric_comparison_rules():
    assert is_correct("\\boxed{0.5}", "1/2")
    assert is_correct("\\boxed{0.33333}", "\\frac{1}{3}")  # rounded decimal within the relative tolerance
    assert not is_correct("\\boxed{0.33}", "\\frac{1}{3}")
    assert not is_correct("\\boxed{1000001}", "1000000")  # integers compare exactly
    assert not is_correct("\\boxed{18.0001}", "18")
    assert not is_correct("no number at all", "18")
    assert not is_correct("", "0")
    assert is_correct("\\boxed{0}", "0")


def test_symbolic_answers_use_math_verify():
    pytest.importorskip("math_verify")
    assert is_correct("so \\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}")
    assert is_correct("\\boxed{\\pi/2}", "\\frac{\\pi}{2}")
    assert not is_correct("\\boxed{\\sqrt{2}}", "\\sqrt{3}")


def test_symbolic_fallback_without_math_verify(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    assert answer_mod._math_verify_equal("1", "1") is None
    assert is_correct("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}")
    assert is_correct("\\boxed{ (1, 2) }", "(1,2)")
    assert not is_correct("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}")  # no symbolic engine: text differs
    assert is_correct("\\boxed{18}", "18")  # numbers never need it


def test_last_boxed_none_without_box():
    assert last_boxed("no box") is None


def test_answer_key_is_the_exact_number_else_the_normalised_text():
    from mindgrpo.rewards.answer import answer_key

    assert answer_key("so the total is #### 3.50") == answer_key("The answer is $\\frac{7}{2}$") == "7/2"
    assert answer_key("<answer>1,200</answer>") == answer_key("\\boxed{1200}") == "1200"
    assert answer_key("\\boxed{x + \\sqrt{2}}") == "x+\\sqrt{2}"
    assert answer_key("I do not know") is None
