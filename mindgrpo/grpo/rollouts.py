"""One step's samples: the rollouts (B = prompts * G rows) with their prompts' dataset columns and
rewards, the figures a step logs about them, and their record as MindRecord (`--save_data_file`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional

import numpy as np

from mindgrpo.grpo.experience import Experience
from mindgrpo.grpo.prompts import PromptBatch
from mindgrpo.inference.engine import Completion
from mindgrpo.utils.stats import sample_std

# the engine's per-call figures logged as rollout/<key> (mindgrpo.inference.engine.RolloutEngine.last_stats)
ROLLOUT_STATS = ("useful_fraction", "slots_in_use", "kv_bytes", "prefill_seconds", "decode_seconds", "decode_steps",
                 "compiled_graphs")
# the rollout group's seconds generating and waiting in meetings since its last samples (its slowest rank's; the sum
# over its ranks: wait_seconds_sum), the training rank's waiting for these samples (mindgrpo/parallel/separate.py)
ASYNC_STATS = ("generate_seconds", "wait_seconds", "wait_seconds_sum", "train_wait_seconds")


class Rollouts:
    """The samples of one step: B = prompts * G rows, a prompt's G rows adjacent. row_columns: columns of the
    samples themselves (conversations' tool_calls and messages: grpo/conversations.py), one value per row."""

    def __init__(self, batch: PromptBatch, completions: List[Completion], texts: List[str], group: int,
                 row_columns: Optional[Dict[str, list]] = None):
        self.batch, self.completions, self.texts, self.group = batch, completions, texts, group
        self.row_columns = dict(row_columns or {})
        self.prompt_ids = [batch.ids[c.prompt_index] for c in completions]
        self.columns = {k: [v[c.prompt_index] for c in completions] for k, v in batch.columns.items()}
        self.columns["completion_length"] = [len(c.token_ids) for c in completions]
        self.columns.update(self.row_columns)
        self.rewards = np.zeros(len(completions), np.float32)
        self.per_function: Dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.completions)

    def groups(self, keep: np.ndarray) -> "Rollouts":
        """The rollouts of the groups where keep (prompts,) is True."""
        rows = np.repeat(keep, self.group)
        picked = [i for i, k in enumerate(rows) if k]
        prompts = sorted({self.completions[i].prompt_index for i in picked})
        remap = {p: j for j, p in enumerate(prompts)}
        batch = PromptBatch([self.batch.ids[p] for p in prompts],
                            {k: [v[p] for p in prompts] for k, v in self.batch.columns.items()})
        comps = [replace(self.completions[i], prompt_index=remap[self.completions[i].prompt_index]) for i in picked]
        out = Rollouts(batch, comps, [self.texts[i] for i in picked], self.group,
                       {k: [v[i] for i in picked] for k, v in self.row_columns.items()})
        out.rewards = self.rewards[rows]
        out.per_function = {k: v[rows] for k, v in self.per_function.items()}
        return out

    @staticmethod
    def concat(parts: List["Rollouts"]) -> "Rollouts":
        ids, cols, comps, texts, offset = [], {}, [], [], 0
        for r in parts:
            ids += r.batch.ids
            for k, v in r.batch.columns.items():
                cols.setdefault(k, []).extend(v)
            comps += [replace(c, prompt_index=c.prompt_index + offset) for c in r.completions]
            texts += r.texts
            offset += len(r.batch.ids)
        rows = {k: [x for r in parts for x in r.row_columns[k]] for k in parts[0].row_columns}
        out = Rollouts(PromptBatch(ids, cols), comps, texts, parts[0].group, rows)
        out.rewards = np.concatenate([r.rewards for r in parts])
        out.per_function = {k: np.concatenate([r.per_function[k] for r in parts]) for k in parts[0].per_function}
        return out


def rollout_metrics(r: Rollouts, stats: Dict[str, float]) -> Dict[str, float]:
    """The rollout's logged figures: rewards, lengths, the inference graph's nll of the sampled tokens,
    and `stats`, the engine's account of the call (`RolloutEngine.last_stats`)."""
    lengths = np.array([len(c.token_ids) for c in r.completions])
    clipped = np.array([c.finish_reason == "length" for c in r.completions])
    out = {"reward_mean": float(r.rewards.mean()), "reward_std": float(sample_std(r.rewards)),
           "prompt_length/mean": float(np.mean([len(p) for p in r.prompt_ids])),
           "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
           "response_length/clip_ratio": float(clipped.mean())}
    if "accuracy" in r.per_function:
        out["train/accuracy"] = float(np.nan_to_num(r.per_function["accuracy"]).mean())
    out["rollout/tokens_per_s"] = stats.get("tokens_per_s", 0.0)
    out["rollout/new_tokens"] = float(lengths.sum())
    if all(c.logprobs is not None for c in r.completions):  # -log p of the sampled tokens under the inference graph:
        # the update's `nll` scores the same tokens with the training graph (their gap is the mismatch)
        out["rollout/nll"] = float(-np.concatenate([c.logprobs for c in r.completions]).mean())
    for key in ROLLOUT_STATS:  # the engine's account of this call (this replica's, under data parallelism)
        if key in stats:
            out[f"rollout/{key}"] = float(stats[key])
    for key in ASYNC_STATS:  # generate_config.placement separate: each side's generating and waiting (idle) seconds
        if key in stats:
            out[f"async/{key}"] = float(stats[key])
    for key, value in stats.get("replicas", {}).items():  # several rollout ranks: each one's tokens/s and idle seconds
        out[f"async/{key}"] = float(value)
    return out


def save_experience(save_data_file: str, step: int, r: Rollouts, exp: Experience) -> str:
    """The experience of step `step` (counted from 1, as in metrics.jsonl) as MindRecord:
    `<save_data_file stem>_step<step>.mindrecord`."""
    from mindgrpo.data.mindrecord import write_mindrecord

    stem = save_data_file[:-len(".mindrecord")] if save_data_file.endswith(".mindrecord") \
        else save_data_file
    path = f"{stem}_step{step:06d}.mindrecord"
    schema = {"prompt_ids": {"type": "int32", "shape": [-1]}, "response_ids": {"type": "int32", "shape": [-1]},
              "reward": {"type": "float32"}, "advantage": {"type": "float32"},
              "loss_mask": {"type": "float32", "shape": [-1]}, "completion": {"type": "string"},
              "ref_logp": {"type": "float32", "shape": [-1]}}
    rows = []
    for i, c in enumerate(r.completions):
        n = len(c.token_ids)
        ref = exp.ref_logp[i, :n] if exp.ref_logp is not None else np.zeros(n, np.float32)
        rows.append({"prompt_ids": np.asarray(r.prompt_ids[i], np.int32),
                     "response_ids": np.asarray(c.token_ids, np.int32), "reward": float(r.rewards[i]),
                     "advantage": float(exp.advantages[i]), "loss_mask": exp.mask[i, :n].astype(np.float32),
                     "completion": r.texts[i], "ref_logp": ref.astype(np.float32)})
    write_mindrecord(path, schema, [rows], overwrite=True, description="mindgrpo experience")
    return path
