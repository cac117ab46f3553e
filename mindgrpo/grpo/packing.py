"""Micro-batches of an Experience and what each one's forward is fed (numpy).

A step scores and trains on samples of very different lengths. Three ways to cut them into
micro-batches (`Batching`; `actor_config.max_tokens_per_micro_batch` is T):

    rows     T = 0, the default: micro_batch_size samples at a time, in order, each right-padded to
             the step's S (`experience.pack`), fed as they are: input_ids (B, S), score_pos (B, R),
             labels (B, R)
    budget   samples sorted by length, longest first, grouped by row length L (their length rounded
             up, `bucket_length`); each group split evenly into micro-batches of at most floor(T / L)
             rows: each micro-batch is padded only to its own length. One sample per row
    packed   samples placed, longest first, into the first row of length L (the longest sample
             rounded up) that has room for them; the rows split evenly into micro-batches of at most
             floor(T / L) rows. Several samples per row, each attending only to itself
    shared   packed, with the samples of a prompt (GRPO's group, consecutive samples with the same prompt
             tokens) as one run: the prompt once, then each response at the positions after the prompt,
             seeing the prompt and itself (actor_config.shared_prefix); a group longer than T is cut into
             runs that each carry the prompt. The same log-probs as one sample a row, the prompt's tokens
             run once a run instead of once a sample. runs = segment | prefix << 16 (the segment a token
             also sees: its prompt's), for `models.scoring.prefix_bias`. Its L is any multiple of `step`
             up to T (`shape_bound` with max_len T)

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

Bounded shapes. Every compiled shape costs a compile, and on MindSpore's CPU runtime also keeps its
graph's buffers alive (about 1.3 GB per shape for tiny-small-vocab's update at 2,304 tokens per
micro-batch, `benchmarks/packing.py`), so the micro-batches of a step share shapes:
    L      packed: the step's longest sample rounded up to a multiple of `step` (as the padded S);
           budget: a sample's length rounded up to a multiple of `step` and then to two values per
           octave (step times 1, 2, 3, 4, 6, 8, 12, ...; at most the budget): `bucket_length`
    rows   the rows (budget: the samples of one L) split evenly over the fewest micro-batches that fit
           the budget, every micro-batch as many rows as the fullest (the last may carry an empty row)
    n      the fullest micro-batch's sample count (packed: rounded up to a power of two)
    N      the most scored tokens of a micro-batch, rounded up to eight values per octave
           (`bucket_tokens`: at most 12.5% padding beyond a step)
So a step compiles one shape when packed, and one per row length when budgeted (at most
2 log2(S_max / step) + 1 with samples of at most S_max tokens). Over a run, with R fixed, at most
`shape_bound` shapes: sum over the row lengths L (packed: every multiple of `step` up to S_max) of
floor(T / L) * (log2(n_max) + 1) * (the N buckets up to T). With attention "flash" the runs' ends (K,) add a dimension: rows <= K <= n + rows (the
kernel refuses empty runs, so K cannot be padded to a fixed length).
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
    shared_prefix: bool = False  # packed: the samples of a prompt in one run, the prompt once (layout "shared")

    def __post_init__(self):
        if self.micro_batch_size < 1 or self.step < 1 or self.max_tokens < 0:
            raise ValueError(f"bad batching {self}")
        if self.attention not in ("mask", "flash"):
            raise ValueError(f"unknown packed attention {self.attention!r}; valid: mask, flash")
        if self.packing and self.max_tokens == 0:
            raise ValueError("packing needs a token budget (max_tokens_per_micro_batch > 0)")
        if self.shared_prefix and not (self.packing and self.attention == "mask"):
            raise ValueError("a shared prefix needs packed rows with the mask attention")

    @property
    def layout(self) -> str:
        return "shared" if self.shared_prefix else "packed" if self.packing else "budget" if self.max_tokens else "rows"

    @property
    def graph_attention(self) -> str:
        """What the scoring graphs take (`models.scoring.GRAPH_ATTENTION`): the shared layout's runs are prefix runs."""
        return "prefix" if self.shared_prefix else self.attention

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


def bucket_length(n: int, step: int, budget: int) -> int:
    """A row length for n tokens: a multiple of `step`, rounded up to two values per octave (step times
    1, 2, 3, 4, 6, 8, 12, ...), at most the budget's whole steps (never below n rounded up to `step`,
    which `_fits` checked fits)."""
    units = -(-int(n) // step)
    top = pow2(units)
    units = 3 * top // 4 if top >= 4 and units <= 3 * top // 4 else top
    return max(min(units * step, budget // step * step), round_up(int(n), step))


def shape_bound(max_len: int, budget: int, max_samples: int, step: int, packing: bool) -> int:
    """The most (L, rows, n, N) shapes budget or packed micro-batches can take for one R."""
    lengths = {round_up(n, step) for n in range(1, max_len + 1)}
    if not packing:
        lengths = {bucket_length(n, step, budget) for n in lengths}
    tokens = len({bucket_tokens(n, step) for n in range(1, budget + 1)})
    return sum(budget // width for width in lengths) * (math.ceil(math.log2(max(max_samples, 1))) + 1) * tokens


# ---------------------------------------------------------------------------------------
# the layouts
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


def _fits(length: int, batching: Batching) -> int:
    """length rounded up to `step`; refuses a sample over the budget."""
    width = round_up(int(length), batching.step)
    if width > batching.max_tokens:
        raise ValueError(f"a sample of {length} tokens (padded to {width}) does not fit a micro-batch of "
                         f"max_tokens_per_micro_batch = {batching.max_tokens}; raise it to at least {width}")
    return width


@LAYOUTS.register("budget")
def budget_micro_batches(exp: Experience, batching: Batching) -> List[MicroBatch]:
    """One sample per row; the samples of each row length L (longest first) split evenly over the fewest
    micro-batches of at most floor(T / L) rows."""
    order, lengths = _trained(exp)
    widths = [bucket_length(_fits(lengths[s], batching), batching.step, batching.max_tokens) for s in order]
    out = []
    for width in sorted(set(widths), reverse=True):
        rows = [[int(s)] for s, w in zip(order, widths) if w == width]
        groups = _even(rows, batching.max_tokens // width)
        out += _uniform(exp, groups, width, len(groups[0]), batching, exact=True)
    return out


@LAYOUTS.register("packed")
def packed_micro_batches(exp: Experience, batching: Batching) -> List[MicroBatch]:
    """Samples longest first into the first row of length L (the longest's) with room; the rows split
    evenly over the fewest micro-batches the budget allows, all of one shape."""
    order, lengths = _trained(exp)
    if not len(order):
        return []
    width = _fits(lengths[order[0]], batching)
    rows = _first_fit([int(s) for s in order], [int(lengths[s]) for s in order], width)
    groups = _even(rows, batching.max_tokens // width)
    return _uniform(exp, groups, width, len(groups[0]), batching, exact=False)


def _first_fit(items: list, sizes: List[int], width: int) -> List[list]:
    """items (longest first) with their sizes, each into the first row of `width` with room for it."""
    rows, free = [], []
    for item, need in zip(items, sizes):
        k = next((k for k, room in enumerate(free) if room >= need), len(rows))
        if k == len(rows):
            rows.append([])
            free.append(width)
        rows[k].append(item)
        free[k] -= need
    return rows


def prompt_groups(exp: Experience, order) -> List[List[int]]:
    """The samples of `order` cut into runs of consecutive samples (in the experience's order) whose prompts are the
    same tokens: GRPO's groups, whole or as the step left them."""
    groups: List[List[int]] = []
    for s in sorted(int(s) for s in order):
        if groups:
            last = groups[-1][-1]
            n = int(exp.prompt_lens[s])
            if n == int(exp.prompt_lens[last]) and np.array_equal(exp.input_ids[s, :n], exp.input_ids[last, :n]):
                groups[-1].append(s)
                continue
        groups.append([s])
    return groups


@LAYOUTS.register("shared")
def shared_micro_batches(exp: Experience, batching: Batching) -> List[MicroBatch]:
    """`packed`, with the samples of a prompt (`prompt_groups`) as one run: the prompt once, then each response at
    the positions after the prompt, seeing the prompt and itself (runs of `models.scoring.prefix_bias`). Runs placed
    longest first into the first row with room, the rows split as packed's."""
    order, _ = _trained(exp)
    if not len(order):
        return []
    groups = _within(exp, prompt_groups(exp, order), batching)
    sizes = [int(exp.prompt_lens[g[0]] + sum(exp.response_lens[s] for s in g)) for g in groups]
    runs = sorted(range(len(groups)), key=lambda k: -sizes[k])
    width = round_up(sizes[runs[0]], batching.step)
    if width > batching.max_tokens:
        raise ValueError(f"a prompt's samples take {sizes[runs[0]]} tokens (padded to {width}), more than a "
                         f"micro-batch of max_tokens_per_micro_batch = {batching.max_tokens}; raise it to at least "
                         f"{width}")
    rows = _first_fit([groups[k] for k in runs], [sizes[k] for k in runs], width)
    parts = _even(rows, batching.max_tokens // width)
    n, n_tok = _slots(exp, [[[s for g in row for s in g] for row in part] for part in parts], batching, exact=False)
    return [_shared(exp, part, width, len(parts[0]), n, n_tok) for part in parts]


def _within(exp: Experience, groups: List[List[int]], batching: Batching) -> List[List[int]]:
    """Each group cut, in order, into runs that fit the budget (rounded up to the step), each run with the prompt."""
    out = []
    for g in groups:
        p = int(exp.prompt_lens[g[0]])
        run, size = [], p
        for s in g:
            m = int(exp.response_lens[s])
            if run and round_up(size + m, batching.step) > batching.max_tokens:
                out.append(run)
                run, size = [], p
            run.append(s)
            size += m
        out.append(run)
    return out


def _feed_arrays(exp: Experience, width: int, n_rows: int, n: int, n_tok: int) -> tuple:
    """A packed micro-batch's arrays, empty: ids, positions, runs (rows, width); tokens, labels (n_tok,); slots (n, R)
    all n_tok (past every sample's response)."""
    rows = tuple(np.zeros((n_rows, width), np.int32) for _ in range(3))
    return rows + (np.zeros(n_tok, np.int32), np.zeros(n_tok, np.int32),
                   np.full((n, exp.labels.shape[1]), n_tok, np.int32))


def _shared(exp: Experience, rows, width: int, n_rows: int, n: int, n_tok: int) -> MicroBatch:
    """`_packed` for rows of prompt groups (lists of lists of samples): runs of `models.scoring.prefix_bias`."""
    from mindgrpo.models.scoring import PREFIX_SHIFT  # here, not at the top: this module stays numpy

    samples = np.array([s for row in rows for g in row for s in g], np.int64)
    ids, positions, runs, tokens, labels, slots = _feed_arrays(exp, width, n_rows, n, n_tok)
    k = cursor = 0
    for r, row in enumerate(rows):
        start, seg = 0, 0
        for g in row:
            p = int(exp.prompt_lens[g[0]])
            seg += 1
            prompt_seg, prompt_at = seg, start
            ids[r, start:start + p] = exp.input_ids[g[0], :p]
            positions[r, start:start + p] = np.arange(p)
            runs[r, start:start + p] = prompt_seg | prompt_seg << PREFIX_SHIFT
            start += p
            for s in g:
                m = int(exp.response_lens[s])
                seg += 1
                most = (1 << (31 - PREFIX_SHIFT)) - 1  # prefix << PREFIX_SHIFT must stay a positive int32
                if seg > most:
                    raise ValueError(f"a row of {seg} runs: at most {most} with a shared prefix")
                ids[r, start:start + m] = exp.input_ids[s, p:p + m]
                positions[r, start:start + m] = np.arange(p, p + m)
                runs[r, start:start + m] = seg | prompt_seg << PREFIX_SHIFT
                # sequence position q of the sample: the prompt's for q < p, else this response's
                q = exp.score_pos[s, :m]
                tokens[cursor:cursor + m] = r * width + np.where(q < p, prompt_at + q, start + q - p)
                labels[cursor:cursor + m] = exp.labels[s, :m]
                slots[k, :m] = np.arange(cursor, cursor + m)
                start += m
                cursor += m
                k += 1
    part = exp.select(samples).padded(n)
    return MicroBatch(samples, part, ids, (positions, runs, tokens, labels, slots), (positions, runs))


def _even(rows: list, cap: int) -> list:
    """rows cut into the fewest groups of at most cap, as even as consecutive slices allow (the first
    ones the largest)."""
    per = -(-len(rows) // -(-len(rows) // cap))
    return [rows[i:i + per] for i in range(0, len(rows), per)]


def _uniform(exp: Experience, groups: List[List[List[int]]], width: int, n_rows: int, batching: Batching,
             exact: bool) -> List[MicroBatch]:
    """Micro-batches of one shape: each group's rows (lists of samples) in n_rows rows of `width`, n
    the most samples of a group (exact, else rounded up to a power of two), N the most scored tokens."""
    n, n_tok = _slots(exp, groups, batching, exact)
    return [_packed(exp, rows, width, n_rows, n, n_tok, batching) for rows in groups]


def _slots(exp: Experience, groups: List[List[List[int]]], batching: Batching, exact: bool) -> Tuple[int, int]:
    """(n, N) of micro-batches whose rows (lists of samples) are `groups`: n the most samples of a micro-batch
    (exact, else rounded up to a power of two), N its most scored tokens bucketed (`bucket_tokens`)."""
    most = max(sum(len(row) for row in rows) for rows in groups)
    scored = max(int(sum(exp.response_lens[s] for row in rows for s in row)) for rows in groups)
    return (most if exact else pow2(most)), bucket_tokens(max(scored, 1), batching.step)


def _packed(exp: Experience, rows: List[List[int]], width: int, n_rows: int, n: int, n_tok: int,
            batching: Batching) -> MicroBatch:
    """The feed of samples laid out in `rows` (lists of sample indices) of `width` tokens, with
    n_rows rows in all (the rest empty), n sample slots and n_tok scored-token slots."""
    samples = np.array([s for row in rows for s in row], np.int64)
    ids, positions, segments, tokens, labels, slots = _feed_arrays(exp, width, n_rows, n, n_tok)
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
