"""Built-in rewards: hand-computed cases, and parity with TRL's implementations of the same formulas."""

import inspect
import math
import random

import pytest

from mindgrpo.rewards import get_reward, reward_parameters


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        ("<think>x</think><answer>1</answer>", 1.0, 1.0),
        ("\n<think>\nstep\n</think>\n\n<answer> \\boxed{3} </answer>\n", 1.0, 1.0),
        ("<think></think><answer></answer>", 1.0, 1.0),
        ("intro <think>x</think><answer>1</answer>", 0.0, 1.0),  # text before
        ("<think>x</think><answer>1</answer> bye", 0.0, 1.0),  # text after
        ("<think>x</think> middle <answer>1</answer>", 0.0, 1.0),  # text between
        ("<think>a</think><think>b</think><answer>1</answer>", 0.0, 1.0),  # two thinks
        ("<think>x <answer>0</answer></think><answer>1</answer>", 0.0, 1.0),  # answer tag inside think
        ("<think>x</think><answer>1</answer><answer>2</answer>", 0.0, 1.0),
        ("<answer>1</answer><think>x</think>", 0.0, 0.0),  # wrong order
        ("<think>x</think>", 0.0, 0.0),
        ("<think>x<answer>1</answer>", 0.0, 0.0),  # unclosed think
        ("plain text 42", 0.0, 0.0),
    ],
)
def test_format(completion, strict, lenient):
    assert get_reward("format")([completion]) == [strict]
    assert get_reward("format_lenient")([completion]) == [lenient]


def test_accuracy_scores_and_none_for_missing_solution():
    accuracy = get_reward("accuracy")
    completions = ["\\boxed{5}", "\\boxed{6}", "\\boxed{5}", "#### 1,000"]
    assert accuracy(completions, solution=["5", "5", "", "1000"], prompt=["p"] * 4) == [1.0, 0.0, None, 1.0]


def test_cosine_hand_values():
    cosine = get_reward("cosine", cosine_max_len=100)
    right, wrong = "\\boxed{7}", "\\boxed{8}"
    completions = [right, right, right, right, wrong, wrong, wrong, wrong]
    lengths = [0, 50, 100, 250, 0, 50, 100, 250]
    got = cosine(completions, solution=["7"] * 8, completion_length=lengths)
    # correct: 1.0 at length 0 -> 0.5 at max; wrong: -0.5 at 0 -> 0.0 at max; halfway is the mean of both ends
    assert got == pytest.approx([1.0, 0.75, 0.5, 0.5, -0.5, -0.25, 0.0, 0.0])
    quarter = cosine([right], solution=["7"], completion_length=[25])[0]
    assert quarter == pytest.approx(0.5 + 0.25 * (1 + math.cos(math.pi / 4)))
    # without token counts the length is the number of whitespace-separated words
    words = "one two three four five " * 10 + "\\boxed{7}"  # 51 words
    assert cosine([words], solution=["7"]) == pytest.approx([0.5 + 0.25 * (1 + math.cos(math.pi * 51 / 100))])
    assert cosine([right], solution=[None], completion_length=[3]) == [None]


def test_cosine_defaults_follow_ms_swift():
    assert reward_parameters("cosine") == {
        "cosine_max_len": inspect.Parameter.empty,
        "cosine_min_len_value_wrong": -0.5,
        "cosine_max_len_value_wrong": 0.0,
        "cosine_min_len_value_correct": 1.0,
        "cosine_max_len_value_correct": 0.5,
        "accuracy_rel_tol": 1e-4,
    }
    with pytest.raises(TypeError, match="cosine_max_len"):
        get_reward("cosine")
    with pytest.raises(ValueError, match="positive"):
        get_reward("cosine", cosine_max_len=0)


def test_cosine_matches_trl():
    trl_rewards = pytest.importorskip("trl.rewards", reason="trl (dev dependency) is the reference")
    pytest.importorskip("math_verify")
    theirs = trl_rewards.get_cosine_scaled_reward(
        max_len=64, min_value_wrong=-0.5, max_value_wrong=0.0, min_value_correct=0.5, max_value_correct=1.0
    )
    ours = get_reward("cosine", cosine_max_len=64)
    rng = random.Random(0)
    completions, solutions, lengths = [], [], []
    for _ in range(60):
        answer = rng.randint(0, 99)
        completions.append(f"work... \\boxed{{{answer + rng.choice([0, 0, 1])}}}")
        solutions.append(str(answer))
        lengths.append(rng.randint(0, 90))
    conversations = [[{"role": "assistant", "content": c}] for c in completions]
    expected = theirs(conversations, solutions, [[1] * n for n in lengths])
    assert ours(completions, solution=solutions, completion_length=lengths) == pytest.approx(expected)


def test_repetition_hand_values():
    repetition = get_reward("repetition")
    got = repetition(["a b c a b c", "a b c d e", "a a a a a", "The cat the CAT the cat", "a b"])
    # 4 trigrams / 3 distinct; none repeated; 3 / 1; 4 / 2 (case-folded); shorter than a trigram
    assert got == pytest.approx([-0.25, 0.0, -2 / 3, -0.5, 0.0])
    bigram = get_reward("repetition", repetition_n_grams=2, repetition_max_penalty=-0.5)
    assert bigram(["x y x y"]) == pytest.approx([-0.5 * (1 - 2 / 3)])
    with pytest.raises(ValueError, match="<= 0"):
        get_reward("repetition", repetition_max_penalty=0.5)


def test_repetition_matches_trl_on_words():
    trl_rewards = pytest.importorskip("trl.rewards", reason="trl (dev dependency) is the reference")
    rng = random.Random(1)
    ids = [[rng.randint(0, 4) for _ in range(rng.randint(0, 30))] for _ in range(100)]
    for n, penalty in [(3, -1.0), (2, -0.7), (4, -1.0)]:
        theirs = trl_rewards.get_repetition_penalty_reward(ngram_size=n, max_penalty=penalty)(ids)
        ours = get_reward("repetition", repetition_n_grams=n, repetition_max_penalty=penalty)(
            [" ".join(f"w{i}" for i in row) for row in ids]
        )
        assert ours == pytest.approx(theirs)


def test_soft_overlong_hand_values():
    soft = get_reward("soft_overlong", max_completion_length=100, soft_max_cache_length=20)
    assert soft(["x"] * 6, completion_length=[0, 80, 81, 90, 100, 101]) == pytest.approx(
        [0.0, 0.0, -0.05, -0.5, -1.0, -1.0]
    )
    assert soft(["w " * 90]) == pytest.approx([-0.5])  # 90 whitespace words
    with pytest.raises(ValueError, match="soft_max_cache_length"):
        get_reward("soft_overlong", max_completion_length=10, soft_max_cache_length=20)
    with pytest.raises(TypeError, match="needs parameter"):
        get_reward("soft_overlong", max_completion_length=10)


def test_soft_overlong_matches_trl():
    trl_rewards = pytest.importorskip("trl.rewards", reason="trl (dev dependency) is the reference")
    lengths = list(range(0, 140, 3))
    theirs = trl_rewards.get_soft_overlong_punishment(max_completion_len=128, soft_punish_cache=32)
    ours = get_reward("soft_overlong", max_completion_length=128, soft_max_cache_length=32)
    expected = theirs([[0] * n for n in lengths])
    assert ours([""] * len(lengths), completion_length=lengths) == pytest.approx(expected)


def test_unknown_parameter_lists_valid_ones():
    with pytest.raises(TypeError, match="repetition_max_penalty, repetition_n_grams"):
        get_reward("repetition", ngram_size=3)
