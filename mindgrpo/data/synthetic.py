"""The built-in tiny task: small-number arithmetic with a tiny byte-level BPE tokenizer, no files from outside.

    train, val = arithmetic_rows(ArithmeticTask(seed=0))
    tokenizer = ensure_tiny_tokenizer("runs/tiny_tokenizer")        # trained once, then loaded from the cache
    write_arithmetic_dataset("runs/tiny_data", tokenizer)           # train.mindrecord, val.mindrecord

Questions read "What is 23 + 45?" (or one of a few other phrasings); the reference solution is the
equation "23 + 45 = 68" and the final answer is "68" (the warm start wraps them in the R1 format).
The tokenizer uses Qwen2's pipeline and ChatML special tokens, so templates, rewards and QwenTokenizer.from_dir
work on it exactly as on the real Qwen2.5 files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from typing import Dict, List, Tuple

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers, trainers
from tokenizers.models import BPE

from mindgrpo.data.mindrecord import PromptRow, WriteSummary, write_prompt_dataset
from mindgrpo.data.templates import TEMPLATES
from mindgrpo.data.tokenizer import (
    DEFAULT_SPECIAL_TOKENS,
    AddedTokenSpec,
    QwenTokenizer,
    apply_qwen2_pipeline,
)

OPERATORS = ("+", "-", "*")


@dataclass(frozen=True)
class ArithmeticTask:
    """Problem space and split. A problem chains `num_operands` operands left to right; + and - use
    operands 0..max_operand and keep every intermediate result >= 0; * (two operands only) uses
    0..max_mul_operand. Train and val are disjoint draws from the shuffled space."""

    seed: int = 0
    num_train: int = 2000
    num_val: int = 200
    max_operand: int = 50
    max_mul_operand: int = 12
    operators: Tuple[str, ...] = OPERATORS
    num_operands: int = 2

    def __post_init__(self):
        for op in self.operators:
            if op not in OPERATORS:
                raise ValueError(f"unknown operator {op!r}; valid: {OPERATORS}")
        if self.num_operands < 2:
            raise ValueError(f"num_operands must be >= 2, got {self.num_operands}")
        if self.num_operands > 2 and "*" in self.operators:
            raise ValueError("operator '*' is only supported with num_operands 2")


@dataclass(frozen=True)
class TinyTokenizerSpec:
    """What the cached tiny tokenizer is trained from; a different spec retrains it."""

    vocab_size: int = 512  # BPE vocabulary + the 3 special tokens
    task: ArithmeticTask = ArithmeticTask()
    version: int = 2  # bump when the corpus recipe changes
    chat_texts: Tuple[str, ...] = ()  # more training text: conversations in a chat template (the tiny tool recipe)


Problem = Tuple[Tuple[int, ...], Tuple[str, ...]]  # (operands, operators between them)


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _problem_space(task: ArithmeticTask) -> List[Problem]:
    """Every problem of the task in a fixed order."""
    top = task.max_mul_operand
    products = [((a, b), ("*",)) for a in range(top + 1) for b in range(top + 1)] if "*" in task.operators else []
    chain_ops = tuple(op for op in task.operators if op != "*")
    partial = [((a,), (), a) for a in range(task.max_operand + 1)]  # (operands, operators, value so far)
    for _ in range(task.num_operands - 1):
        partial = [(nums + (b,), ops + (op,), _apply(v, op, b))
                   for nums, ops, v in partial for op in chain_ops for b in range(task.max_operand + 1)
                   if _apply(v, op, b) >= 0]
    chains = sorted(((nums, ops) for nums, ops, _ in partial), key=lambda p: (p[1], p[0])) if chain_ops else []
    return chains + products


QUESTION_FORMS = (
    "What is {expr}?",
    "Compute {expr}.",
    "Calculate {expr}.",
    "How much is {expr}?",
    "Find the value of {expr}.",
    "Work out {expr}.",
)


def _row(problem: Problem, form: int) -> PromptRow:
    """The question, the worked solution (one equation per operator, "3 + 5 = 8, 8 + 4 = 12") and the value."""
    nums, ops = problem
    expr = " ".join([str(nums[0])] + [f"{op} {b}" for op, b in zip(ops, nums[1:])])
    value, steps = nums[0], []
    for op, b in zip(ops, nums[1:]):
        new = _apply(value, op, b)
        steps.append(f"{value} {op} {b} = {new}")
        value = new
    return PromptRow(question=QUESTION_FORMS[form].format(expr=expr), answer=", ".join(steps), solution=str(value))


SPACE_LIMIT = 200_000  # a larger problem space is sampled, not enumerated (sums of 3-digit numbers: 10^9)


def _space_size(task: ArithmeticTask) -> int:
    """An upper bound of the problems of a task (every chain of operands, whatever its sign)."""
    chain_ops = len([op for op in task.operators if op != "*"])
    products = (task.max_mul_operand + 1) ** 2 if "*" in task.operators else 0
    return chain_ops ** (task.num_operands - 1) * (task.max_operand + 1) ** task.num_operands + products


def _sampled_problems(task: ArithmeticTask, count: int, rng: np.random.Generator) -> List[Problem]:
    """`count` distinct chains drawn at random (operands uniform in 0..max_operand, operators among the task's + and
    -, every intermediate result >= 0): a space too large to enumerate (`SPACE_LIMIT`)."""
    chain_ops = [op for op in task.operators if op != "*"]
    if not chain_ops:
        raise ValueError(f"a problem space of more than {SPACE_LIMIT} problems needs + or - among the operators")
    seen, out = set(), []
    while len(out) < count:
        nums = tuple(int(x) for x in rng.integers(0, task.max_operand + 1, size=task.num_operands))
        ops = tuple(chain_ops[int(i)] for i in rng.integers(0, len(chain_ops), size=task.num_operands - 1))
        value, ok = nums[0], True
        for op, b in zip(ops, nums[1:]):
            value = _apply(value, op, b)
            ok = ok and value >= 0
        if ok and (nums, ops) not in seen:
            seen.add((nums, ops))
            out.append((nums, ops))
    return out


def arithmetic_rows(task: ArithmeticTask = ArithmeticTask()) -> Tuple[List[PromptRow], List[PromptRow]]:
    """(train, val) rows; deterministic in task.seed, no problem in both splits."""
    if _space_size(task) > SPACE_LIMIT:
        rng = np.random.default_rng(task.seed)
        problems = _sampled_problems(task, task.num_train + task.num_val, rng)
        forms = rng.integers(0, len(QUESTION_FORMS), size=len(problems))
        rows = [_row(p, form=int(f)) for p, f in zip(problems, forms)]
        return rows[: task.num_train], rows[task.num_train :]
    space = _problem_space(task)
    if task.num_train + task.num_val > len(space):
        raise ValueError(f"asked for {task.num_train} + {task.num_val} problems, the space holds {len(space)}")
    rng = np.random.default_rng(task.seed)
    order = rng.permutation(len(space))[: task.num_train + task.num_val]
    forms = rng.integers(0, len(QUESTION_FORMS), size=len(order))
    rows = [_row(space[i], form=int(f)) for i, f in zip(order, forms)]
    return rows[: task.num_train], rows[task.num_train :]


_STEP = re.compile(r"^(\d+) ([-+*]) (\d+) = (-?\d+)$")


def forgets_carry(a: int, b: int) -> bool:
    """Whether a + b carries out of the ones column (8 + 5 does, 12 + 5 does not)."""
    return a % 10 + b % 10 >= 10


def flawed_solution(answer: str, rng: np.random.Generator, carry_error: float) -> Tuple[str, str]:
    """A flawed teacher's version of a worked solution ("3 + 8 = 11, 11 + 5 = 16"): each addition that
    carries out of the ones column forgets the carry with probability `carry_error` (3 + 8 = 1), and later
    steps go on from the wrong value, as a student with that habit would. Returns (worked solution, final
    value). Raises ValueError on a solution that is not such a chain."""
    steps = answer.split(", ")
    value, out = None, []
    for text in steps:
        m = _STEP.match(text)
        if m is None:
            raise ValueError(f"not a worked arithmetic step: {text!r} in {answer!r}")
        a, op, b = int(m.group(1)) if value is None else value, m.group(2), int(m.group(3))
        new = _apply(a, op, b)
        if op == "+" and forgets_carry(a, b) and rng.random() < carry_error:
            new -= 10
        out.append(f"{a} {op} {b} = {new}")
        value = new
    return ", ".join(out), str(value)


# ----------------------------------------------------------------------------------------------- tokenizer


# Words a small policy may use while reasoning, so they get their own tokens.
REASONING_PHRASES = (
    "Let me think step by step. First, I read the question carefully. Next, I write down the numbers.",
    "The sum of two numbers is their total; the difference is what remains; the product is repeated addition.",
    "Then I carry the tens. Now I double check the result. Therefore, the result is correct.",
    "Wait, that is wrong, so I try again. Hence the final answer follows. I am sure about this value.",
    "To add, subtract or multiply, I combine the ones, then the tens, then the hundreds.",
)


def tokenizer_corpus(task: ArithmeticTask, chat_texts: Tuple[str, ...] = ()) -> List[str]:
    """Training text: every templated prompt (special tokens cut out), answers in R1 and plain form, a few
    fixed reasoning phrases, and `chat_texts` (special tokens cut out)."""
    train, val = arithmetic_rows(task)
    texts = list(REASONING_PHRASES) * 20
    for text in chat_texts:
        for special in DEFAULT_SPECIAL_TOKENS:
            text = text.replace(special, "\n")
        texts.append(text)
    for row in train + val:
        for name in TEMPLATES.names():
            prompt = TEMPLATES.get(name)(row.question)
            for special in DEFAULT_SPECIAL_TOKENS:
                prompt = prompt.replace(special, "\n")
            texts.append(prompt)
        texts.append(f"<think>\n{row.answer}\n</think>\n<answer>\n\\boxed{{{row.solution}}}\n</answer>")
    return texts


def train_tiny_tokenizer(spec: TinyTokenizerSpec = TinyTokenizerSpec()) -> QwenTokenizer:
    """Train a byte-level BPE with Qwen2's pipeline on `tokenizer_corpus`; specials follow the vocabulary."""
    bpe_size = spec.vocab_size - len(DEFAULT_SPECIAL_TOKENS)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if bpe_size <= len(alphabet):
        least = len(alphabet) + len(DEFAULT_SPECIAL_TOKENS)
        raise ValueError(f"vocab_size must exceed {least}, got {spec.vocab_size}")
    tok = apply_qwen2_pipeline(Tokenizer(BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size, initial_alphabet=alphabet, special_tokens=[], min_frequency=1, show_progress=False
    )
    tok.train_from_iterator(tokenizer_corpus(spec.task, spec.chat_texts), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: Dict[str, int] = model["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    added = [AddedTokenSpec(len(vocab) + i, t) for i, t in enumerate(DEFAULT_SPECIAL_TOKENS)]
    return QwenTokenizer(vocab, merges, added)


_STAMP = "mindgrpo_tiny_tokenizer.json"


def _is_cached(path: str, stamp: str) -> bool:
    stamp_path = os.path.join(path, _STAMP)
    if not os.path.isfile(stamp_path):
        return False
    with open(stamp_path, encoding="utf-8") as f:
        return f.read() == stamp


def ensure_tiny_tokenizer(path: str, spec: TinyTokenizerSpec = TinyTokenizerSpec()) -> QwenTokenizer:
    """Load the tiny tokenizer cached at `path`, training and saving it first when absent or stale.

    The folder holds vocab.json, merges.txt, tokenizer_config.json (QwenTokenizer.from_dir / transformers
    format) and a stamp of the spec; it is written in a temporary folder and renamed into place.
    """
    fields = asdict(spec)
    texts = fields.pop("chat_texts")
    if texts:  # (absent from the stamp when empty: the default's stamp as before the field)
        fields["chat_texts"] = hashlib.sha1("\x00".join(texts).encode()).hexdigest()
    stamp = json.dumps(fields, sort_keys=True)
    if _is_cached(path, stamp):
        return QwenTokenizer.from_dir(path)
    tokenizer = train_tiny_tokenizer(spec)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        tokenizer.save(tmp)
        with open(os.path.join(tmp, _STAMP), "w", encoding="utf-8") as f:
            f.write(stamp)
        if _is_cached(path, stamp):  # another process (an msrun rank) wrote the same meanwhile: others may read it
            return QwenTokenizer.from_dir(path)
        if os.path.isdir(path):
            shutil.rmtree(path)  # stale cache
        os.rename(tmp, path)
    except OSError:
        if not _is_cached(path, stamp):  # unless another process just wrote the same tokenizer
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return QwenTokenizer.from_dir(path)


def write_arithmetic_dataset(
    out_dir: str,
    tokenizer: QwenTokenizer,
    task: ArithmeticTask = ArithmeticTask(),
    *,
    template: str = "qwen_r1",
    max_prompt_length: int = 128,
    overwrite: bool = False,
) -> Dict[str, WriteSummary]:
    """Write the task as `out_dir`/train.mindrecord and `out_dir`/val.mindrecord with the rlhf_data.py writer."""
    train, val = arithmetic_rows(task)
    return {
        split: write_prompt_dataset(
            os.path.join(out_dir, f"{split}.mindrecord"),
            rows,
            tokenizer,
            template=template,
            max_prompt_length=max_prompt_length,
            overwrite=overwrite,
        )
        for split, rows in (("train", train), ("val", val))
    }
