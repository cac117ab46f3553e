"""Rollouts packed into training arrays (pure numpy).

Each sample is its prompt (without padding) followed by its response, right-padded to S; the
response tokens are the labels, scored at the positions that predict them:

    input_ids  [p0 p1 p2 r0 r1 r2 pad ...]           (B, S)
    score_pos  [ 2  3  4  0 ...]                      (B, R): p2 predicts r0, r0 predicts r1, ...
    labels     [r0 r1 r2 0 ...]                       (B, R)
    mask       [ 1  1  1  0 ...]                      (B, R)

S and R are rounded up to multiples of `step` so the training graph compiles for a few shapes
only. Padded rows of score_pos point at position 0 and are masked. How the samples are grouped into
micro-batches and fed to the forward (padded rows, token budgets, packed rows) is
`mindgrpo/grpo/packing.py`; every per-sample array here keeps this layout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np


def round_up(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


@dataclass
class Experience:
    input_ids: np.ndarray  # (B, S) int32
    score_pos: np.ndarray  # (B, R) int32
    labels: np.ndarray  # (B, R) int32
    mask: np.ndarray  # (B, R) float32
    advantages: np.ndarray  # (B,) float32
    old_logp: Optional[np.ndarray] = None  # (B, R)
    ref_logp: Optional[np.ndarray] = None  # (B, R)
    # from the rollout engine, 0 where mask is 0: each token's log-prob under softmax(logits / T) of the
    # inference graph, and under the distribution it was drawn from (after top-k / top-p / min-p)
    rollout_logp: Optional[np.ndarray] = None  # (B, R)
    sampling_logp: Optional[np.ndarray] = None  # (B, R)
    extras: Dict[str, np.ndarray] = field(default_factory=dict)
    # tokens of each sample's prompt and response (without padding); token budgets and packing need them
    prompt_lens: Optional[np.ndarray] = None  # (B,) int32
    response_lens: Optional[np.ndarray] = None  # (B,) int32

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: np.ndarray) -> "Experience":
        """The samples `rows`: every array field (and every entry of extras) indexed by rows."""
        return self._map(lambda a: a[rows])

    def padded(self, n: int) -> "Experience":
        """n >= len(self) samples: zero rows appended to every array (their mask is 0: never trained on)."""
        extra = n - len(self)
        if extra < 0:
            raise ValueError(f"cannot pad {len(self)} samples to {n}")
        return self._map(lambda a: np.concatenate([a, np.zeros((extra,) + a.shape[1:], a.dtype)]))

    def _map(self, fn) -> "Experience":
        def one(value):
            if value is None:
                return None
            if isinstance(value, dict):
                return {k: fn(v) for k, v in value.items()}
            return fn(value)

        return dataclasses.replace(self, **{f.name: one(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def lengths(self) -> np.ndarray:
        """(B,) tokens of each sample, prompt and response, without padding."""
        if self.prompt_lens is None or self.response_lens is None:
            raise ValueError("this Experience has no prompt_lens / response_lens (experience.pack makes them): "
                             "token budgets and packing need each sample's length")
        return self.prompt_lens + self.response_lens


def pack(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], advantages: np.ndarray,
         pad_id: int = 0, step: int = 32, caps: Optional[tuple] = None, loss_mask: Optional[np.ndarray] = None,
         rollout_logp: Optional[Sequence[np.ndarray]] = None,
         sampling_logp: Optional[Sequence[np.ndarray]] = None,
         response_masks: Optional[Sequence[Optional[np.ndarray]]] = None) -> Experience:
    """Rows of S positions (the longest prompt + response rounded up to `step`) and R scored positions
    (the longest response, rounded up). caps (S, R): the most the caller's data can need; a rounded-up
    length beyond its cap is cut back to the cap (a caller whose batches all round up past the caps
    compiles one shape, with less padding).
    loss_mask (B,) bool: rows to train on (False rows get an all-zero mask, e.g. overlong
    filtering); default all. rollout_logp, sampling_logp: the engine's log-probs of each response's
    tokens (`Completion.logprobs`, `.sampling_logprobs`), laid out like labels.
    response_masks: per response, (n,) bool of its model's own tokens (a conversation's `Completion.model_mask`;
    None for a response that is all the model's): tool turns stay in input_ids as context and are scored by no
    loss, KL, entropy, correction or metric (their mask is 0, and so are their rollout log-probs)."""
    if len(prompts) != len(responses):
        raise ValueError("prompts and responses differ in length")
    b = len(prompts)
    longest = max(len(p) + len(r) for p, r in zip(prompts, responses)), max(max(len(r) for r in responses), 1)
    s, r_len = (round_up(n, step) for n in longest)
    if caps is not None:
        s, r_len = (max(min(n, cap), need) for n, cap, need in zip((s, r_len), caps, longest))
    input_ids = np.full((b, s), pad_id, np.int32)
    score_pos = np.zeros((b, r_len), np.int32)
    labels = np.zeros((b, r_len), np.int32)
    mask = np.zeros((b, r_len), np.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n_p, n_r = len(p), len(r)
        input_ids[i, :n_p] = p
        input_ids[i, n_p:n_p + n_r] = r
        score_pos[i, :n_r] = np.arange(n_p - 1, n_p + n_r - 1)
        labels[i, :n_r] = r
        mask[i, :n_r] = 1.0
        if response_masks is not None and response_masks[i] is not None:
            if len(response_masks[i]) != n_r:
                raise ValueError(f"response {i}: its mask has {len(response_masks[i])} entries for {n_r} tokens")
            mask[i, :n_r] = np.asarray(response_masks[i], np.float32)
    if loss_mask is not None:
        mask *= np.asarray(loss_mask, np.float32)[:, None]
    out = Experience(input_ids, score_pos, labels, mask, np.asarray(advantages, np.float32),
                     prompt_lens=np.array([len(p) for p in prompts], np.int32),
                     response_lens=np.array([len(r) for r in responses], np.int32))
    out.rollout_logp = None if rollout_logp is None else _rows_like(labels, rollout_logp) * mask
    out.sampling_logp = None if sampling_logp is None else _rows_like(labels, sampling_logp) * mask
    return out


def _rows_like(labels: np.ndarray, rows: Sequence[np.ndarray]) -> np.ndarray:
    """Per-response arrays -> (B, R) float32 laid out like labels, zeros after each response."""
    out = np.zeros(labels.shape, np.float32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def micro_batches(n: int, size: int) -> List[np.ndarray]:
    return [np.arange(i, min(i + size, n)) for i in range(0, n, size)]
