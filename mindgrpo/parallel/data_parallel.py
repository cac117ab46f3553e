"""Data parallelism: replicas of the training layout split a mini-batch, replicas of the inference
layout split the prompts.

Every rank of the stage holds the whole step's data on the host (prompts, then the gathered
completions, rewards and advantages; a few KB per row). So:

  * `DataParallelGrads` (PolicyUpdater's `grad_reducer`): a replica trains on its contiguous share
    of the mini-batch rows (with token-budget micro-batches, a share of about the same number of
    tokens: `share_by_tokens`); the token / sequence counts that normalise the loss are those of
    the whole mini-batch (the sum of the replicas' counts), so the summed gradients equal the
    one-process gradient; the accumulated gradients and the logged sums are summed over the
    data-parallel group before the optimizer step.
  * `DataParallelEngine` (the trainer's rollout engine): a replica generates its share of the
    prompts, each prompt keyed by its index in the whole batch (a sample's random stream is a
    function of that index, its sample number and its token number only, so it gets the tokens
    of a one-process run), then the completions are summed into every rank's copy. With
    conversations each replica runs its share's on its own tool workers (`generate_share`), and
    what they give besides the tokens meets in `gather_values` (grpo/conversations.py).
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

import numpy as np
from mindspore import nn, ops

from mindgrpo.inference.engine import Completion, RolloutEngine, appended_positions
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.utils.spans import spans
from mindgrpo.parallel.comm import AllReduce, Comm, Group, host_gather


def share(n: int, parts: int, index: int) -> np.ndarray:
    """Rows of part `index` when n rows are cut into `parts` contiguous, near-equal parts."""
    return np.array_split(np.arange(n), parts)[index]


def share_by_tokens(tokens: np.ndarray, parts: int, index: int) -> np.ndarray:
    """Rows of part `index` (in increasing order) when rows of `tokens` (n,) tokens each are dealt,
    longest first, to the part with the fewest tokens so far (the lowest index on a tie): the
    parts' totals differ by at most the longest row."""
    load = np.zeros(parts, np.int64)
    owner = np.empty(len(tokens), np.int64)
    for row in np.argsort(-np.asarray(tokens), kind="stable"):
        owner[row] = int(np.argmin(load))
        load[owner[row]] += tokens[row]
    return np.flatnonzero(owner == index)


class _AllReduceSpan(nn.Cell):
    def __init__(self, n: int, reduce: nn.Cell):
        super().__init__(auto_prefix=False)
        self.n, self.reduce = n, reduce

    def construct(self, bufs):
        out = ()
        for i in range(self.n):
            out = out + (ops.assign(bufs[i], self.reduce(bufs[i])),)
        return out


class _AllReduceBuffers(nn.Cell):
    """Every gradient buffer <- its sum over the group, in one graph (in spans: `utils/spans.py`)."""

    def __init__(self, bufs, group: Group):
        super().__init__(auto_prefix=False)
        self.bufs = bufs
        self.bounds = spans(len(bufs))
        reduce = AllReduce(group)
        self.span = nn.CellList([_AllReduceSpan(b - a, reduce) for a, b in self.bounds])

    def construct(self):
        out = ()
        for k in range(len(self.bounds)):
            a, b = self.bounds[k]
            out = out + self.span[k](self.bufs[a:b])
        return out


class DataParallelGrads:
    """The data-parallel hook of `mindgrpo.grpo.actor.PolicyUpdater` (its `grad_reducer`)."""

    def __init__(self, comm: Comm, group: Group):
        self.comm, self.group = comm, group
        self._graphs = {}

    def rows(self, n: int, tokens: Optional[np.ndarray] = None) -> np.ndarray:
        """This replica's rows of an n-row mini-batch that every replica holds: a contiguous share,
        or given each row's tokens (n,), a share of about the same number of tokens."""
        if tokens is None:
            return share(n, self.group.size, self.group.index)
        return share_by_tokens(tokens, self.group.size, self.group.index)

    def __call__(self, buffer) -> None:
        """Sum the accumulated gradients over the data-parallel group."""
        if self.group.size == 1:
            return
        if id(buffer) not in self._graphs:
            self._graphs[id(buffer)] = _AllReduceBuffers(buffer.bufs, self.group)
        self._graphs[id(buffer)]()

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Host sums (loss, metric sums, token counts) over the data-parallel group."""
        return self.comm.host_sum(np.asarray(values, np.float64), self.group)

    def max(self, values: np.ndarray) -> np.ndarray:
        """Host maxima (metrics) over the data-parallel group: each replica's values in its own row
        of a (replicas, n) table that the group sums."""
        table = np.zeros((self.group.size, np.size(values)), np.float64)
        table[self.group.index] = np.ravel(values)
        return self.comm.host_sum(table, self.group).max(axis=0).reshape(np.shape(values))


# a completion as one float32 row: [number of tokens, stopped, turns appended, has a model mask, then `width` slots each
# of: tokens, log-probs, sampled log-probs, model mask, versions] (token ids and versions < 2**24 are exact in float32)
ROW_HEAD, ROW_FIELDS = 4, 5


def row_width(params: SamplingParams, turns=None) -> int:
    """Token slots of a sample's row (`completion_rows`): its max_tokens, and with conversations (`engine.Turns`) the
    positions of its appended turns (the model mask marks them)."""
    return params.max_tokens + appended_positions(turns)


def completion_rows(comps: Sequence[Completion], rows: int, width: int, first: int = 0) -> np.ndarray:
    """(rows, ROW_HEAD + ROW_FIELDS * width) float32, comps in rows first, first + 1, ...; the other rows 0 (a sum
    over ranks that each fill their own rows gives every row)."""
    out = np.zeros((rows, ROW_HEAD + ROW_FIELDS * width), np.float32)
    at = [ROW_HEAD + j * width for j in range(ROW_FIELDS)]
    for k, c in enumerate(comps):
        m = len(c.token_ids)
        row = out[first + k]
        row[:ROW_HEAD] = m, c.finish_reason == "stop", c.turns, c.model_mask is not None
        row[at[0]:at[0] + m] = c.token_ids
        row[at[1]:at[1] + m] = c.logprobs
        row[at[2]:at[2] + m] = c.sampling_logprobs
        if c.model_mask is not None:
            row[at[3]:at[3] + m] = c.model_mask
        if c.versions is not None:
            row[at[4]:at[4] + m] = c.versions
    return out


def rows_completions(rows: np.ndarray, n: int, width: int) -> List[Completion]:
    """The completions of `completion_rows` (n samples a prompt, adjacent)."""
    at = [ROW_HEAD + j * width for j in range(ROW_FIELDS)]
    out = []
    for i, row in enumerate(rows):
        m = int(row[0])
        out.append(Completion(i // n, row[at[0]:at[0] + m].astype(np.int64).tolist(),
                              "stop" if row[1] > 0 else "length", row[at[1]:at[1] + m].copy(),
                              row[at[2]:at[2] + m].copy(), row[at[3]:at[3] + m] > 0 if row[3] > 0 else None,
                              int(row[2]), row[at[4]:at[4] + m].astype(np.int64)))
    return out


class DataParallelEngine:
    """A RolloutEngine over one replica's tensor-parallel model, generating that replica's share
    of the prompts; `generate` returns every prompt's completions on every rank."""

    def __init__(self, engine: RolloutEngine, comm: Comm, group: Group):
        self.engine, self.comm, self.group = engine, comm, group
        self.last_stats: dict = {}
        self._started = time.perf_counter()

    @property
    def compiled_graphs(self) -> int:
        return self.engine.compiled_graphs

    def cache_bytes(self) -> int:
        return self.engine.cache_bytes()

    def release(self) -> None:
        self.engine.release()

    @property
    def version(self) -> int:
        """The policy version of the replica's weights (every replica's: they are synced together)."""
        return self.engine.version

    @version.setter
    def version(self, value: int) -> None:
        self.engine.version = value

    def share(self, count: int) -> np.ndarray:
        """The indices of this replica's prompts among `count` (a contiguous share, in prompt order)."""
        return share(count, self.group.size, self.group.index)

    def next_round(self, count: int) -> int:
        """rl_config.dynamic_sampling: the trainer's `count` of prompts the next rollout draws (`RolloutEngine.
        next_round`); every replica generates its share of the prompts it is given."""
        return count

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 return_logits: bool = False, turns=None) -> List[Completion]:
        """turns: conversations (`engine.Turns`), run by this replica for its share of the prompts."""
        mine = self.share(len(prompts))
        local = self.generate_share([prompts[i] for i in mine], mine, params, return_logits, turns)
        return self.gather(local, len(prompts), params, turns)

    def generate_share(self, prompts: Sequence[Sequence[int]], index: Sequence[int], params: SamplingParams,
                       return_logits: bool = False, turns=None) -> List[Completion]:
        """This replica's completions of its share of the prompts (`prompts`, their indices in the whole batch
        `index`, from `share`: the keys of their random streams); `gather` then brings every replica's to every rank.
        Conversations in between see the replica's own requests (`replica_stats`: its engine's figures)."""
        self._started = time.perf_counter()
        if not len(index):
            return []
        local = self.engine.generate(prompts, params, prompt_index=index, return_logits=return_logits, turns=turns)
        if return_logits:
            self.last_logits = self.engine.last_logits
        return local

    @property
    def replica_stats(self) -> dict:
        """The figures of this replica's last `generate_share` (its own engine's)."""
        return self.engine.last_stats

    def gather(self, local: Sequence[Completion], count: int, params: SamplingParams, turns=None) -> List[Completion]:
        """Every replica's completions of `generate_share` (count prompts in all), on every rank in prompt order:
        each replica's rows at its share's, summed over the group."""
        n = params.n
        width = row_width(params, turns)
        mine = self.share(count)
        first = int(mine[0]) * n if len(mine) else 0
        rows = completion_rows(local, count * n, width, first)  # only this replica's rows are nonzero
        rows = self.comm.host_sum(rows, self.group)  # the others add +0.0: the sum is exact
        out = rows_completions(rows, n, width)
        elapsed = time.perf_counter() - self._started
        new_tokens = int(rows[:, 0].sum())
        self.last_stats = dict(self.engine.last_stats, rows=len(out), new_tokens=new_tokens, seconds=elapsed,
                               tokens_per_s=new_tokens / max(elapsed, 1e-9))
        return out

    def gather_values(self, value) -> list:
        """Every replica's picklable `value` (None: nothing) on every rank, in replica order (`comm.host_gather`)."""
        return host_gather(self.comm, value, self.group)
