"""Micro-batches of an Experience and what each one's forward is fed (numpy).

A step scores and trains on samples of very different lengths. Three ways to cut them into
micro-batches (`Batching`; `actor_config.max_tokens_per_micro_batch` is T):

    rows     T = 0, the default: micro_batch_size samples at a time, in order, each right-padded to
             the step's S (`experience.pack`), fed as they are: input_ids (B, S), score_pos (B, R),
             labels (B, R)
    budget   samples sorted by length, longest first; a micro-batch takes the next ones while
             rows * L <= T, L being its first (longest) sample's length rounded up to `step`: each
             micro-batch is padded only to its own length. One sample per row
    packed   samples placed, longest first, into the first row of length L (the longest sample
             rounded up) that has room for them; micro-batches of floor(T / L) such rows. Several
             samples per row, each attending only to itself

Budget and packed micro-batches are fed alike (a row holding one sample is a packed row):

    ids        (rows, L) int32  the row's samples one after another (prompt, response), then padding
    positions  (rows, L) int32  0, 1, ... restarting at each sample (padding: 0)
    runs       which tokens attend to which, causally within a run (a sample; padding apart):
               segments (rows, L) int32: 1, 2, ... the row's samples, 0 its padding, for the additive
               block-diagonal mask (`models.scoring.segment_bias`); or, with attention "flash", the
               runs' cumulative ends (K,) int64 in the rows * L tokens (Ascend's TND layout)
    tokens     (N,) int32       flat index into rows * L of each scored position (the one predicting
                                a response token), sample after sample
    labels     (N,) int32       the token each predicts
    slots      (n, R) int32     where entry [i, j] of the micro-batch's per-sample arrays is in tokens;
                                N past a sample's response (a zero appended to the N log-probs)

So the vocabulary projection runs on the N scored tokens only, and every per-sample array (mask,
advantages, old and reference log-probs, any other (n, R) or (n,) array of the Experience) keeps
its layout: the loss does not know how the forward was fed. Samples whose mask is all zero
(overlong filtering) change no loss, metric or log-prob and are left out of budget and packed
micro-batches.

Bounded shapes: L is a multiple of `step`; rows and n are powers of two (rows at most floor(T / L),
a micro-batch never exceeds the budget); N is rounded up to eight values per octave (at most 12.5%
padding, multiples of `step`). So with samples of at most S_max tokens, at most n_max per
micro-batch and R fixed (one per step, as today), graphs compile for at most
    (S_max / step) * (log2(T / step) + 2) * (8 log2(T / step) + 1) * (log2(n_max) + 1)
shapes (`shape_bound`); a run meets a few of them (`benchmarks/packing.py` counts them). With attention
"flash" the runs' ends (K,) add a dimension: rows <= K <= n + rows (the kernel refuses empty runs, so
K cannot be padded to a fixed length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from mindgrpo.grpo.experience import Experience, micro_batches, round_up
from mindgrpo.utils.registry import Registry

LAYOUTS = Registry("micro-batch layout")


@dataclass(frozen=True)
class Batching:
    """How a Scorer or PolicyUpdater cuts an Experience into micro-batches (see the module docstring)."""

    micro_batch_size: int = 4  # samples per micro-batch when max_tokens == 0
    max_tokens: int = 0  # T: tokens per micro-batch, padding included; 0: micro_batch_size samples
    packing: bool = False  # several samples per row (needs max_tokens)
    attention: str = "mask"  # how packed rows keep samples apart: mask | flash (models.scoring.PACKED_ATTENTION)
    step: int = 32  # lengths are rounded up to multiples of this

    def __post_init__(self):
        if self.micro_batch_size < 1 or self.step < 1 or self.max_tokens < 0:
            raise ValueError(f"bad batching {self}")
        if self.attention not in ("mask", "flash"):
            raise ValueError(f"unknown packed attention {self.attention!r}; valid: mask, flash")
        if self.packing and self.max_tokens == 0:
            raise ValueError("packing needs a token budget (max_tokens_per_micro_batch > 0)")

    @property
    def layout(self) -> str:
        return "packed" if self.packing else "budget" if self.max_tokens else "rows"

    @property
    def by_tokens(self) -> bool:
        """Whether data-parallel replicas should split samples by tokens (budget and packed)."""
        return self.max_tokens > 0


@dataclass
class MicroBatch:
    samples: np.ndarray  # (k,) the experience's samples in it, in the order of exp's rows
    exp: Experience  # those samples, padded with zero rows to n: the per-sample arrays
    ids: np.ndarray  # (rows, S) int32: the first stage's input
    feed: Tuple[np.ndarray, ...]  # the last stage's other forward inputs
    stage_feed: Tuple[np.ndarray, ...]  # what a stage before the last needs besides its input

    @property
    def packed(self) -> bool:
        return len(self.stage_feed) > 0


def plan(exp: Experience, batching: Batching) -> List[MicroBatch]:
    """The micro-batches of exp under batching, in the order they run."""
    return LAYOUTS.get(batching.layout)(exp, batching)


# ---------------------------------------------------------------------------------------
# buckets
# ---------------------------------------------------------------------------------------


def pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def bucket_tokens(n: int, step: int) -> int:
    """n scored tokens rounded up: to a multiple of `step`, and of 1/16 of the power of two above n,
    so eight values per octave (at most 12.5% padding beyond a step)."""
    return round_up(n, max(step, pow2(n) // 16))


def shape_bound(max_len: int, budget: int, max_samples: int, step: int) -> int:
    """The most (L, rows, N, n) shapes budget or packed micro-batches can take for one R."""
    lengths = round_up(max_len, step) // step
    octaves = max(math.log2(budget / step), 0)
    return int(lengths * (math.floor(octaves) + 2) * (8 * math.ceil(octaves) + 1)
               * (math.ceil(math.log2(max(max_samples, 1))) + 1))


# ---------------------------------------------------------------------------------------
# the three layouts
# ---------------------------------------------------------------------------------------


@LAYOUTS.register("rows")
def row_micro_batches(exp: Experience, batching: Batching) -> List[MicroBatch]:
    """Today's micro-batches: micro_batch_size samples in order, the step's padded arrays as they are."""
    out = []
    for rows in micro_batches(len(exp), batching.micro_batch_size):
        part = exp.select(rows)
        out.append(MicroBatch(rows, part, part.input_ids, (part.score_pos, part.labels), ()))
    return out


def _trained(exp: Experience) -> Tuple[np.ndarray, np.ndarray]:
    """Samples with a token to train on, longest first (ties in order), and every sample's length."""
    lengths = exp.lengths()
    keep = np.flatnonzero(exp.mask.sum(-1) > 0)
    return keep[np.argsort(-lengths[keep], kind="stable")], lengths


def _fits(length: int, budget: int, step: int) -> int:
    width = round_up(int(length), step)
    if width > budget:
        raise ValueError(f"a sample of {length} tokens (padded to {width}) does not fit a micro-batch of "
                         f"max_tokens_per_micro_batch = {budget}; raise it to at least {width}")
    return width


@LAYOUTS.register("budget")
def budget_micro_batches(exp: Experience, batching: Batching) -> List[MicroBatch]:
    order, lengths = _trained(exp)
    out, i = [], 0
    while i < len(order):
        width = _fits(lengths[order[i]], batching.max_tokens, batching.step)
        cap = batching.max_tokens // width
        rows = [[int(s)] for s in order[i:i + cap]]
        i += len(rows)
        out.append(_packed(exp, rows, width, min(pow2(len(rows)), cap), batching))
    return out


@LAYOUTS.register("packed")
def packed_micro_batches(exp: Experience, batching: Batching) -> List[MicroBatch]:
    order, lengths = _trained(exp)
    if not len(order):
        return []
    width = _fits(lengths[order[0]], batching.max_tokens, batching.step)
    rows, free = [], []  # first fit, longest first
    for s in order:
        need = int(lengths[s])
        k = next((k for k, room in enumerate(free) if room >= need), len(rows))
        if k == len(rows):
            rows.append([])
            free.append(width)
        rows[k].append(int(s))
        free[k] -= need
    cap = batching.max_tokens // width
    return [_packed(exp, rows[i:i + cap], width, min(pow2(len(rows[i:i + cap])), cap), batching)
            for i in range(0, len(rows), cap)]


def _packed(exp: Experience, rows: List[List[int]], width: int, n_rows: int, batching: Batching) -> MicroBatch:
    """The feed of samples laid out in `rows` (lists of sample indices) of `width` tokens, with
    n_rows rows in all (the rest empty)."""
    samples = np.array([s for row in rows for s in row], np.int64)
    n = pow2(len(samples))
    ids = np.zeros((n_rows, width), np.int32)
    positions = np.zeros((n_rows, width), np.int32)
    segments = np.zeros((n_rows, width), np.int32)
    r_len = exp.labels.shape[1]
    resp = exp.response_lens[samples]
    count = int(resp.sum())
    n_tok = bucket_tokens(max(count, 1), batching.step)
    tokens = np.zeros(n_tok, np.int32)
    labels = np.zeros(n_tok, np.int32)
    slots = np.full((n, r_len), n_tok, np.int32)
    ends = []  # the runs' cumulative ends in rows * width (flash attention)
    k = cursor = 0
    for r, row in enumerate(rows):
        start = 0
        for seg, s in enumerate(row, 1):
            length, m = int(exp.prompt_lens[s] + exp.response_lens[s]), int(exp.response_lens[s])
            ids[r, start:start + length] = exp.input_ids[s, :length]
            positions[r, start:start + length] = np.arange(length)
            segments[r, start:start + length] = seg
            tokens[cursor:cursor + m] = r * width + start + exp.score_pos[s, :m]
            labels[cursor:cursor + m] = exp.labels[s, :m]
            slots[k, :m] = np.arange(cursor, cursor + m)
            start += length
            cursor += m
            k += 1
            ends.append(r * width + start)
        if start < width:  # the row's padding, a run of its own
            ends.append((r + 1) * width)
    ends += [(r + 1) * width for r in range(len(rows), n_rows)]  # empty rows
    runs = np.array(ends, np.int64) if batching.attention == "flash" else segments
    part = exp.select(samples).padded(n)
    return MicroBatch(samples, part, ids, (positions, runs, tokens, labels, slots), (positions, runs))


def gather_samples(shape: Tuple[int, ...], batches: List[MicroBatch], values: List[np.ndarray]) -> np.ndarray:
    """Per-sample results of the micro-batches ((n, ...) each) into one (B, ...) float32 array, in
    the experience's order; samples in no micro-batch get zeros."""
    out = np.zeros(shape, np.float32)
    for mb, v in zip(batches, values):
        out[mb.samples] = v[:len(mb.samples)]
    return out
