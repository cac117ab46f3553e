"""Generative judges (`reward_config.judges`): a causal LM asked to judge each rollout, in the phase "reward_model".

    judge = build_judge(entry, name, tokenizer)
    final, raw = judge(prompt_ids, completion_ids, columns)   # (B,) each, NaN where no score
    judge.last_answers                                         # the judge's B answers, logged with the completions

Each rollout is shown to the judge as `entry.template` (sandboxed Jinja, `data/templates.compile_chat_template`)
rendered over `prompt` (the policy's prompt as text), `completion` (its completion as text) and the rollout's data
columns (e.g. `solution`), optionally wrapped as the user's turn of a chat template (`entry.chat_template`, a
tokenizer_config.json), and tokenized with the run's tokenizer. The judge answers through its own `RolloutEngine`
(greedy at temperature 0, else sampled with the entry's seed and the call's count; under msrun every rank holds the
judge whole and answers its share of the questions, every rank getting every answer: `placement.judge_engine`, a
`parallel/data_parallel.DataParallelEngine`, whose random streams are keyed by a question's index in the whole
batch, so the answers are one process's), up to `max_tokens` tokens; its
answer's text is parsed by `entry.parser` (`rewards/judge_parsers.py`). No score (None, NaN here) when the answer
holds none, the score lies outside `score_range`, or the question does not fit the judge's context; counted in
reward/<name>/none, reward/<name>/too_long. With `normalize` the scores are standardised by their running mean and
std before weighting, as a reward model's (`rewards/running_norm.py`).

The judge's parameters, its engine's fused copies and its KV cache are in the swap ledger's group "reward_model"
(`grpo/reward_models.py`): on the device only in that phase.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import jinja2
import numpy as np

from mindgrpo.config.sections import JudgeConfig
from mindgrpo.data.templates import ChatTemplateError, compile_chat_template, plain_data, render_chat
from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.models.checkpoint import load_model
from mindgrpo.rewards.judge_parsers import JUDGE_PARSERS
from mindgrpo.rewards.running_norm import RunningNorm

logger = logging.getLogger(__name__)


class Judge:
    """One generative judge of the run (module docstring): name, weight, norm, and a call per batch."""

    def __init__(self, entry: JudgeConfig, name: str, tokenizer, engine: RolloutEngine, key: str, generator=None):
        """generator: what answers the questions (None: `engine`; under msrun its data-parallel replicas)."""
        self.name, self.weight, self.entry, self.key = name, entry.weight, entry, key
        self.tokenizer, self.engine = tokenizer, engine
        self.generator = engine if generator is None else generator
        self.parse = JUDGE_PARSERS.get(entry.parser)
        self.template = compile_chat_template(entry.template)
        self.norm = RunningNorm() if entry.normalize else None
        self.calls = 0
        self.last_answers: List[str] = []
        self.last_counts: Dict[str, int] = {"none": 0, "too_long": 0}

    def question(self, prompt: str, completion: str, columns: Mapping) -> str:
        """The text put to the judge for one rollout."""
        variables = {k: plain_data(v, other=str) for k, v in columns.items()}  # a column's other values as text
        variables.update(prompt=prompt, completion=completion)
        try:
            text = self.template.render(**variables)
        except jinja2.exceptions.TemplateError as error:
            raise ValueError(f"{self.key}.template: {error}") from None
        if self.entry.chat_template is None:
            return text
        try:
            return render_chat([{"role": "user", "content": text}], tokenizer_config=self.entry.chat_template)
        except ChatTemplateError as error:
            raise ValueError(f"{self.key}.chat_template: {error}") from None

    def score(self, answer: str) -> Optional[float]:
        """The answer's score, or None (no score in the parser's format, or outside score_range)."""
        value = self.parse(answer)
        lo_hi = self.entry.score_range
        if value is None or (lo_hi is not None and not lo_hi[0] <= value <= lo_hi[1]):
            return None
        return value

    def parameters(self) -> list:
        return list(self.engine.lm.get_parameters()) + list(self.engine.resident_parameters())

    def __call__(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                 columns: Optional[Mapping[str, Sequence]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(the scores it enters the total with (B,), its raw scores (B,)); NaN where none."""
        columns = columns or {}
        prompts = self.tokenizer.decode_batch([list(p) for p in prompt_ids], skip_special_tokens=True)
        completions = self.tokenizer.decode_batch([list(c) for c in completion_ids], skip_special_tokens=True)
        texts = [self.question(p, c, {k: v[i] for k, v in columns.items()})
                 for i, (p, c) in enumerate(zip(prompts, completions))]
        ids = self.tokenizer.encode_batch(texts)
        room = (self.engine.fixed_capacity or self.engine.max_positions) - self.entry.max_tokens
        fits = [i for i, q in enumerate(ids) if len(q) <= room]
        answers = [""] * len(ids)
        self.calls += 1
        if fits:
            params = SamplingParams(max_tokens=self.entry.max_tokens, temperature=self.entry.temperature,
                                    stop_token_ids=tuple(self.tokenizer.stop_token_ids),
                                    seed=self.entry.seed * 1_000_003 + self.calls)
            for c in self.generator.generate([ids[i] for i in fits], params):
                answers[fits[c.prompt_index]] = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        raw = np.full(len(ids), np.nan, np.float32)
        for i in fits:
            value = self.score(answers[i])
            raw[i] = np.nan if value is None else value
        self.last_answers = answers
        self.last_counts = {"none": int(np.isnan(raw).sum()), "too_long": len(ids) - len(fits)}
        return (raw if self.norm is None else self.norm(raw)), raw


def build_judge(entry: JudgeConfig, name: str, key: str, tokenizer, compute_dtype: str = "float32",
                placement=None) -> Judge:
    """The judge of one `reward_config.judges` entry (`key` names it in errors); its vocabulary must hold the
    tokenizer's. placement (`parallel/placement.py`): who answers which questions (None: this process, all)."""
    try:
        lm = load_model(entry.path, entry.config, compute_dtype=compute_dtype)
    except (OSError, ValueError) as e:
        raise ValueError(f"{key}.path: {e}") from None
    if lm.config.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"{key}.path: the judge's vocab_size {lm.config.vocab_size} is smaller than the "
                         f"tokenizer's {tokenizer.vocab_size} (a judge reads the run's tokens)")
    if entry.chat_template is not None:
        try:
            render_chat([{"role": "user", "content": "?"}], tokenizer_config=entry.chat_template)
        except ChatTemplateError as e:
            raise ValueError(f"{key}.chat_template: {e}") from None
    engine = RolloutEngine(lm, pad_token_id=tokenizer.pad_token_id or 0, max_num_seqs=entry.max_num_seqs,
                           max_model_len=entry.max_model_len)
    logger.info("judge %r: %s, weight %g, parser %s, answers of at most %d tokens (%s)", name, entry.path,
                entry.weight, entry.parser, entry.max_tokens,
                "greedy" if entry.temperature == 0 else f"temperature {entry.temperature:g}")
    return Judge(entry, name, tokenizer, engine, key, None if placement is None else placement.judge_engine(engine))


__all__ = ["Judge", "build_judge"]
