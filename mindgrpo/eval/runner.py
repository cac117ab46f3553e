"""An evaluation run: K samples per problem from the rollout engine, scored by a registered reward
function, summarised as pass@k / mean@K / maj@K (`mindgrpo/eval/metrics.py`).

    problems = problems_from_mindrecord(path)                    # or problems_from_questions(...) for jsonl
    result = evaluate(engine, tokenizer, problems, params, rewards, "accuracy")
    write_outputs(output_dir, result)                            # summary.json, samples.jsonl
    print(format_table(result.summary))

Problems go to the engine a chunk at a time (as many as its slots hold at K samples each), so the
progress line can say how far it is (conversations, `evaluate(conversations=...)`: all in one call); a
sample's tokens depend only on (seed, problem, sample, token), not on the chunking
(`mindgrpo/inference/streams.py`). Scoring goes through a
`rewards.RewardSet`, the trainer's reward pool (worker processes, a timeout per call). A sample is
right when its score is at least `pass_threshold` (1.0: `accuracy`'s right answer); a sample the
reward could not score (None) is wrong. maj@K votes over each sample's final answer
(`rewards.answer.answer_key`: the number it states, exactly, else its normalised text).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mindgrpo.data.mindrecord import PromptRow, encode_prompts, load_prompt_dataset
from mindgrpo.data.questions import read_rows
from mindgrpo.eval.metrics import summarize
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.rewards.answer import answer_key
from mindgrpo.utils.progress import format_duration
from mindgrpo.utils.staging import write_text

SUMMARY_FILE, SAMPLES_FILE = "summary.json", "samples.jsonl"


@dataclass(frozen=True)
class Problems:
    """P problems: each prompt's token ids and the dataset columns the rewards read (solution,
    answer, prompt), and each problem's index among the source file's problems (its row in a
    MindRecord, its valid row in a .jsonl)."""

    ids: List[List[int]]
    columns: Dict[str, list]
    rows: List[int]
    path: str

    def __len__(self) -> int:
        return len(self.ids)


def problems_from_mindrecord(path: str, limit: Optional[int] = None) -> Problems:
    """A prompt MindRecord of data_tools/rlhf_data.py (its first `limit` rows); a missing file or
    column fails naming the file."""
    data = load_prompt_dataset(path)
    n = len(data["prompt_length"]) if limit is None else min(limit, len(data["prompt_length"]))
    ids = [data["prompt_ids"][i, :data["prompt_length"][i]].tolist() for i in range(n)]
    return Problems(ids, {k: list(data[k][:n]) for k in ("solution", "answer", "prompt")}, list(range(n)), path)


def problems_from_rows(rows: Sequence[PromptRow], tokenizer, template: str, max_prompt_length: int,
                       path: str) -> Problems:
    """Questions read from a .jsonl / .json file (`mindgrpo/data/questions.read_rows`), templated and
    tokenized as the MindRecord writer does; prompts over max_prompt_length tokens are left out."""
    enc = encode_prompts([r.question for r in rows], tokenizer, max_prompt_length, None, template)
    if not enc.kept:
        raise ValueError(f"{path}: every prompt is longer than max_prompt_length {max_prompt_length} tokens")
    ids = [enc.ids[j, :enc.lengths[j]].tolist() for j in range(len(enc.kept))]
    columns = {"solution": [rows[i].solution for i in enc.kept], "answer": [rows[i].answer for i in enc.kept],
               "prompt": list(enc.texts)}
    return Problems(ids, columns, list(enc.kept), path)


def problems_from_questions(path: str, tokenizer, template: str, max_prompt_length: int,
                            limit: Optional[int] = None) -> Problems:
    """A GSM8K- or MATH-style .jsonl / .json file (its type detected from the first row; its first
    `limit` valid rows) through `problems_from_rows`; a bad row fails naming the file and line."""
    rows = read_rows(path, "auto", {}, skip_invalid=False, limit=limit).rows
    if not rows:
        raise ValueError(f"{path}: no problems")
    return problems_from_rows(rows, tokenizer, template, max_prompt_length, path)


@dataclass
class EvalResult:
    samples: List[dict]  # P * K rows, a problem's K samples adjacent
    summary: dict


class ProgressLine:
    """`evaluate: 12/100 problems | 850 tok/s | ETA 1m05s` on stderr after every chunk (redrawn in place
    on a terminal)."""

    def __init__(self, total: int, stream=None, clock: Callable[[], float] = time.perf_counter):
        self.total, self.stream, self.clock = total, stream or sys.stderr, clock
        self.start = clock()

    def __call__(self, done: int, tokens: int) -> str:
        elapsed = self.clock() - self.start
        rate = tokens / max(elapsed, 1e-9)
        eta = elapsed / max(done, 1) * (self.total - done)
        bar = "#" * int(20 * done / max(self.total, 1))
        line = f"evaluate [{bar:<20}] {done}/{self.total} problems | {rate:.0f} tok/s | ETA {format_duration(eta)}"
        tty = self.stream.isatty()
        self.stream.write(("\r" if tty else "") + line + ("" if tty and done < self.total else "\n"))
        self.stream.flush()
        return line


def evaluate(engine, tokenizer, problems: Problems, params: SamplingParams, rewards, reward_name: str,
             pass_threshold: float = 1.0, on_progress: Optional[Callable[[int, int], object]] = None,
             settings: Optional[dict] = None,
             score_model: Optional[Callable[[List[List[int]]], np.ndarray]] = None,
             conversations=None) -> EvalResult:
    """Generate params.n samples per problem with `engine` (a RolloutEngine), score them with
    `rewards` (a RewardSet holding `reward_name`) and summarise. `settings` go into the summary as
    they are (model, data, ...). score_model: a reward model's scorer (token sequences -> scores,
    `models/reward_model.RewardScorer`), given each sample as its prompt's tokens and its completion's:
    every sample gets `rm_score`, the summary `reward_model` (the mean and each problem's mean).
    conversations: a run's conversations (`grpo.conversations.Conversations`: tools or an environment), run in
    one generate call over every problem (the progress line comes at its end): the rewards get their columns
    (tool_calls, messages, ...), each sample its `turns`, the summary `conversations` (tool/*, env/*, turns/*)."""
    K = params.n
    per_call = max(1, engine.max_num_seqs // K)
    comps, seconds, row_columns, conversation_metrics = [], 0.0, {}, None
    prompt_ids = problems.ids
    if conversations is not None:  # (the engine keys each problem's samples by its index, as below)
        prompt_ids, comps, row_columns, conversation_metrics = conversations.generate(
            engine, problems.ids, problems.columns["prompt"], params, tokenizer,
            prompt_index=list(range(len(problems))))
        seconds = engine.last_stats["seconds"]
        if on_progress is not None:
            on_progress(len(problems), sum(len(c.token_ids) for c in comps))
    else:
        for start in range(0, len(problems), per_call):
            idx = list(range(start, min(start + per_call, len(problems))))
            # each problem keyed by its index, so its samples do not depend on the chunking
            comps += engine.generate([problems.ids[i] for i in idx], params, prompt_index=idx)
            seconds += engine.last_stats["seconds"]
            if on_progress is not None:
                on_progress(idx[-1] + 1, sum(len(c.token_ids) for c in comps))
    texts = tokenizer.decode_batch([c.token_ids for c in comps], skip_special_tokens=True)
    # the engine numbers the prompts of one call from 0: a problem's K samples are adjacent, in order
    columns = {k: [v[j // K] for j in range(len(comps))] for k, v in problems.columns.items()}
    columns["completion_length"] = [len(c.token_ids) for c in comps]
    columns.update(row_columns)
    _, per_fn, _ = rewards(texts, **columns)
    scores = np.asarray(per_fn[reward_name], np.float64)  # (P * K,), nan where the reward gave None
    correct = np.nan_to_num(scores, nan=-np.inf) >= pass_threshold
    keys = [answer_key(t) for t in texts]

    samples = []
    for j, (c, text) in enumerate(zip(comps, texts)):
        p = j // K
        samples.append({"problem": problems.rows[p], "sample": j % K, "prompt": problems.columns["prompt"][p],
                        "completion": text, "solution": problems.columns["solution"][p],
                        "answer_key": keys[j], "score": None if np.isnan(scores[j]) else float(scores[j]),
                        "correct": bool(correct[j]), "finish_reason": c.finish_reason,
                        "tokens": len(c.token_ids),
                        **({"turns": c.turns, **{k: v[j] for k, v in row_columns.items()}}
                           if conversations is not None else {})})
    P = len(problems)
    rm = None
    if score_model is not None:
        rm = np.asarray(score_model([[*prompt_ids[j // K], *c.token_ids] for j, c in enumerate(comps)]), np.float64)
        for sample, value in zip(samples, rm):
            sample["rm_score"] = float(value)
    metrics = summarize(correct.reshape(P, K).astype(np.float64), [keys[p * K:(p + 1) * K] for p in range(P)])
    tokens = int(sum(len(c.token_ids) for c in comps))
    summary = {**(settings or {}), "problems": P, "n": K, "temperature": params.temperature, "top_p": params.top_p,
               "top_k": params.top_k, "max_tokens": params.max_tokens, "seed": params.seed, "reward": reward_name,
               "pass_threshold": pass_threshold, "metrics": metrics,
               "reward_mean": float(np.nan_to_num(scores).mean()),
               "unscored": int(np.isnan(scores).sum()),
               "length_clipped": float(np.mean([c.finish_reason == "length" for c in comps])),
               "generated_tokens": tokens, "generate_seconds": seconds,
               "tokens_per_s": tokens / max(seconds, 1e-9)}
    if conversation_metrics is not None:
        summary["conversations"] = conversation_metrics
    if rm is not None:
        per_problem = rm.reshape(P, K).mean(1)
        summary["reward_model"] = {"mean": float(rm.mean()), "per_problem": [float(v) for v in per_problem]}
    return EvalResult(samples, summary)


def write_outputs(output_dir: str, result: EvalResult) -> Dict[str, str]:
    """summary.json and samples.jsonl in output_dir, each written whole or not at all (samples first,
    so a summary is never beside another run's samples)."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {"samples": os.path.join(output_dir, SAMPLES_FILE), "summary": os.path.join(output_dir, SUMMARY_FILE)}
    write_text(paths["samples"], "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in result.samples))
    write_text(paths["summary"], json.dumps(result.summary, indent=2, ensure_ascii=False) + "\n")
    return paths


def format_table(summary: dict) -> str:
    """The metrics as a two-column table, then the throughput."""
    rows = [("metric", "value")] + [(k, f"{v:.4f}") for k, v in summary["metrics"].items()]
    rows += [("reward_mean", f"{summary['reward_mean']:.4f}"), ("length_clipped", f"{summary['length_clipped']:.3f}")]
    if "reward_model" in summary:
        rows.append(("reward_model_mean", f"{summary['reward_model']['mean']:.4f}"))
    rows += [(k, f"{v:.4f}") for k, v in summary.get("conversations", {}).items()]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v:>8}" for k, v in rows]
    lines.insert(1, "-" * (width + 10))
    lines.append(f"{summary['problems']} problems x {summary['n']} samples, {summary['generated_tokens']} tokens in "
                 f"{summary['generate_seconds']:.1f} s ({summary['tokens_per_s']:.1f} tokens/s)")
    return "\n".join(lines)
