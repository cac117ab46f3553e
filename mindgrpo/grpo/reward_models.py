"""The run's outcome reward models (`reward_config.reward_models`) and generative judges (`reward_config.judges`,
`grpo/judges.py`), scored in the memory phase "reward_model".

    models = build_model_rewards(cfg, tokenizer, memory)            # None without reward models or judges
    scores, metrics = models(prompt_ids, completion_ids, columns)   # inside memory.phase("reward_model")
    models.last_answers                                             # {judge name: its answers}

Each entry is a `models/reward_model.RewardModel`, whole on one device and under msrun split like the policy's
tensor parallelism (every rank holds the same rollouts, so every data-parallel replica scores them all), shown each rollout
through its template (`TEMPLATES`), scored micro-batch by micro-batch (`RewardScorer`: padded rows, or packed
rows within a token budget) and, with `normalize`, standardised by its running statistics
(`rewards/running_norm.py`). The trainer adds the scores to the verifiers' by their weights
(`rewards/combine.add_model_scores`). A rollout its template leaves empty (an empty completion under
"completion") scores None, counted in reward/<name>/none.

The swap ledger (`memory/swap.py`) holds every reward model's and judge's parameters (a judge's engine's fused
copies and KV cache too) in one group, "reward_model", exclusive with the policy, the reference and the inference
model: on the device only in its phase.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.config.sections import REWARD_MODEL_TEMPLATES
from mindgrpo.grpo.judges import Judge, build_judge
from mindgrpo.memory.swap import nbytes
from mindgrpo.models.reward_model import RewardModel, RewardScorer
from mindgrpo.parallel.one_device import OneDevice
from mindgrpo.rewards.running_norm import RunningNorm

logger = logging.getLogger(__name__)

# template name -> (prompt ids, completion ids) -> the reward model's input ids
TEMPLATES: Dict[str, Callable[[Sequence[int], Sequence[int]], List[int]]] = {
    "raw": lambda prompt, completion: [*prompt, *completion],
    "completion": lambda prompt, completion: list(completion),
}
assert tuple(TEMPLATES) == REWARD_MODEL_TEMPLATES  # the config checks names against the same list


class ModelReward:
    """One reward model of the run: name, weight, template, scorer, optional running normaliser."""

    def __init__(self, name: str, weight: float, template: str, scorer: RewardScorer, normalize: bool):
        self.name, self.weight, self.scorer = name, weight, scorer
        self.present = TEMPLATES[template]
        self.norm = RunningNorm() if normalize else None

    def parameters(self) -> list:
        return list(self.scorer.rm.get_parameters())

    def __call__(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                 columns=None) -> Tuple[np.ndarray, np.ndarray]:
        """(the scores it enters the total with (B,), its raw scores (B,)); NaN where none."""
        seqs = [self.present(p, c) for p, c in zip(prompt_ids, completion_ids)]
        keep = [i for i, q in enumerate(seqs) if q]
        raw = np.full(len(seqs), np.nan, np.float32)
        raw[keep] = self.scorer([seqs[i] for i in keep])
        return (raw if self.norm is None else self.norm(raw)), raw


class ModelRewards:
    """The run's reward models and judges, scored one after another."""

    def __init__(self, models: List):
        self.models = models  # ModelReward and grpo/judges.Judge
        self.last_answers: Dict[str, List[str]] = {}

    @property
    def names(self) -> List[str]:
        return [m.name for m in self.models]

    @property
    def weights(self) -> List[float]:
        return [m.weight for m in self.models]

    def parameters(self) -> list:
        return [p for m in self.models for p in m.parameters()]

    def state(self) -> Dict[str, dict]:
        """{name: running statistics} of the models that normalise their scores, for a checkpoint."""
        return {m.name: m.norm.state() for m in self.models if m.norm is not None}

    def load_state(self, state: Dict[str, dict]) -> List[str]:
        """Restore `state()`; returns the names of normalising models it holds nothing for (nothing restored then)."""
        missing = [m.name for m in self.models if m.norm is not None and m.name not in state]
        if not missing:
            for m in self.models:
                if m.norm is not None:
                    m.norm.load_state(state[m.name])
        return missing

    def release(self) -> None:
        """With rl_config.release_graphs, after the phase: the reward models' scoring graphs dropped with their
        buffers (`RewardScorer.release`); the judges' engines keep theirs."""
        for m in self.models:
            if isinstance(m, ModelReward):
                m.scorer.release()

    def cache_bytes(self) -> int:
        """The judges' KV caches allocated so far."""
        return sum(m.engine.cache_bytes() for m in self.models if isinstance(m, Judge))

    def __call__(self, prompt_ids, completion_ids, columns=None) -> Tuple[Dict[str, np.ndarray], Dict[str, float]]:
        """{name: scores (B,)} as they enter the total, and metrics: the raw scores' where normalised, the judges'
        counts of rollouts without a score."""
        scores, metrics = {}, {}
        self.last_answers = {}
        for m in self.models:
            scores[m.name], raw = m(prompt_ids, completion_ids, columns)
            if isinstance(m, Judge):
                self.last_answers[m.name] = m.last_answers
                metrics.update({f"reward/{m.name}/{k}": float(v) for k, v in m.last_counts.items()})
            if m.norm is not None:
                finite = raw[np.isfinite(raw)]
                metrics[f"reward/{m.name}/raw_mean"] = float(finite.mean()) if finite.size else float("nan")
                metrics[f"reward/{m.name}/running_mean"] = m.norm.mean
                metrics[f"reward/{m.name}/running_std"] = m.norm.std
        return scores, metrics


def build_model_rewards(cfg: GRPOConfig, tokenizer, memory=None, placement=None) -> Optional[ModelRewards]:
    """The reward models of `reward_config.reward_models` and the judges of `reward_config.judges` (None when there
    are none), registered with the swap ledger as the group "reward_model". Each model's vocabulary must hold the
    tokenizer's. Under msrun (`placement`) a reward model is split like the policy's tensor parallelism
    (`parallel.colocated.ParallelPlacement.reward_model`), or over its entry's model_parallel ranks, each replica
    scoring its share of the rollouts (`reward_scorer`); a judge runs whole on every rank, each answering its share
    of the questions (`judge_engine`)."""
    placement = placement or OneDevice()
    entries, judges = cfg.reward_config.reward_models, cfg.reward_config.judges
    if not entries and not judges:
        return None
    pad_token_id, vocab_size = tokenizer.pad_token_id, tokenizer.vocab_size
    models: list = []
    for i, (entry, name) in enumerate(zip(entries, cfg.reward_config.model_names())):
        key = f"reward_config.reward_models[{i}]"
        try:
            rm: RewardModel = placement.reward_model(entry.path, entry.config, cfg.actor_config.dtype,
                                                     entry.model_parallel)
        except (OSError, ValueError) as e:
            raise ValueError(f"{key}.path: {e}") from None
        if rm.config.vocab_size < vocab_size:
            raise ValueError(f"{key}.path: the reward model's vocab_size {rm.config.vocab_size} is smaller than "
                             f"the tokenizer's {vocab_size} (a reward model scores the policy's tokens)")
        scorer = placement.reward_scorer(RewardScorer(rm, entry.micro_batch_size, entry.max_tokens_per_micro_batch,
                                                      pad_token_id, kept_row_lengths=entry.kept_row_lengths),
                                         entry.model_parallel)
        models.append(ModelReward(name, entry.weight, entry.template, scorer, entry.normalize))
        logger.info("reward model %r: %s, weight %g, template %s", name, entry.path, entry.weight, entry.template)
    for i, (entry, name) in enumerate(zip(judges, cfg.reward_config.judge_names())):
        models.append(build_judge(entry, name, f"reward_config.judges[{i}]", tokenizer, cfg.actor_config.dtype,
                                  placement))
    out = ModelRewards(models)
    if memory is not None:
        params = out.parameters()
        weights = nbytes(params)
        memory.register("reward_model", params, sizer=lambda: weights + out.cache_bytes())
    return out
