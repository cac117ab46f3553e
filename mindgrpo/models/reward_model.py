"""An outcome reward model: the Qwen2 / Qwen3 decoder of `models/qwen2.py` under a scalar head, as
Hugging Face writes it (`Qwen2ForSequenceClassification` / `Qwen3ForSequenceClassification` with
`num_labels: 1`): `score.weight` (1, H), no bias, applied after the final norm; a sequence's score
is the head's output at its last real token.

    RewardModel          the parameters: the decoder (`model.*`, the causal LM's names, no lm_head)
                         and `score.weight`; built from a config, loaded by `load_reward_model`
    pack_rows            sequences -> the packed rows' arrays (numpy; first fit, longest first)
    row_length           a micro-batch's row length: two values per octave (`scoring_graph_bound` counts them)
    RewardScorer         token sequences -> scores in input order, micro-batch by micro-batch (padded or packed),
                         layerwise on one device: a few graphs per row length, one decoder layer's buffers each,
                         the attention in blocks of queries (`models/block_attention.py`), the graphs of at most
                         `kept_row_lengths` row lengths alive; `rows` scores given packed rows at every position

There is one forward: the parity tests with transformers run `RewardScorer` as users do.

Positions count only real tokens (0 at each sequence's first token): a padded row is a packed row of one sequence.
(HF's forward numbers positions 0 .. S-1 whatever the mask unless given `position_ids`; RoPE depends only
on the distance between positions, so a left-padded row's shifted positions change its score by rounding
only: the parity test compares left- and right-padded transformers with the same scores.)
A sequence's score is read at its last token (HF takes the rightmost token that is not `pad_token_id`: the
same where no real token is the pad id).
Shapes use the vocabulary of `mindgrpo/__init__.py`; n is the number of scored sequences.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from mindgrpo.models.checkpoint import find_config, read_model_state
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import REWARD_HEADS, head_of
from mindgrpo.models.qwen2 import _DTYPES, DenseLayers, Linear, Qwen2ForCausalLM, StageSpec


class RewardModel(nn.Cell):
    """The decoder (a `Qwen2ForCausalLM` without its lm_head: its parameter names, its layer factory,
    so the same tensor-parallel layers) and the head `score`, replicated: head "score" the linear (1, H) one of
    HF's *ForSequenceClassification, "score_mlp" Qwen2ForRewardModel's Linear(H, H) + bias, ReLU, Linear(H, 1) +
    bias (`score.0.*`, `score.2.*`; Qwen2.5-Math-RM)."""

    def __init__(self, cfg: Qwen2Config, seed: int = 0, max_positions: Optional[int] = None,
                 layers: Optional[DenseLayers] = None, head: str = "score"):
        super().__init__()
        if head not in REWARD_HEADS:
            raise ValueError(f"unknown reward model head {head!r}; valid: {', '.join(REWARD_HEADS)}")
        self.config, self.head_kind = cfg, head
        self.lm = Qwen2ForCausalLM(cfg, seed, max_positions, layers, StageSpec(), lm_head=False)
        rng = np.random.default_rng(seed + 1)
        h, dtype = cfg.hidden_size, _DTYPES[cfg.compute_dtype]

        def draw(*shape):
            return rng.normal(0.0, cfg.param_init_std, size=shape).astype(np.float32)

        if head == "score":
            self.score = Linear(draw(1, h), None, dtype)  # named score.weight
        else:  # named score.0.weight, score.0.bias, score.2.weight, score.2.bias
            self.score = nn.SequentialCell([Linear(draw(h, h), np.zeros(h, np.float32), dtype), nn.ReLU(),
                                            Linear(draw(1, h), np.zeros(1, np.float32), dtype)])

    def named_parameters(self) -> dict:
        """Checkpoint name (`model.*`, `score.weight`) -> Parameter."""
        return {p.name: p for p in self.get_parameters()}

    def load(self, state: dict) -> None:
        """Copy checked fp32 arrays (checkpoint names, `read_model_state(..., head="score")`) in."""
        params = self.named_parameters()
        for name, arr in state.items():
            params[name].set_data(ms.Tensor(np.ascontiguousarray(arr, np.float32)).astype(params[name].dtype))

    def head(self, h):
        """Hidden states (N, H) before the final norm -> scores (N,) fp32."""
        return self.score(self.lm.model.norm_out(h)).astype(ms.float32).reshape(-1)


def pack_rows(seqs: Sequence[Sequence[int]], width: int, pad_id: int = 0, n_rows: Optional[int] = None,
              n_last: Optional[int] = None) -> Tuple[dict, np.ndarray]:
    """Token sequences -> (the packed rows' arrays, order): each sequence goes, longest first, into the
    first row of `width` tokens with room for it. Arrays: ids, positions, segments (rows, width) int32,
    last (n,) int32; order (len(seqs),): order[i] is the entry of `last` (and of the scores) that holds
    input i, so `scores[order]` are in input order. n_rows / n_last pad the rows (empty rows) and the `last` entries (pointing at token 0) to fixed
    counts, so that a few shapes serve many calls. A sequence longer than width is an error."""
    lengths = [len(q) for q in seqs]
    if any(n == 0 for n in lengths):
        raise ValueError("pack_rows: an empty sequence cannot be scored")
    if max(lengths, default=0) > width:
        raise ValueError(f"pack_rows: a sequence of {max(lengths)} tokens does not fit a row of {width}")
    rows: List[List[int]] = []  # sequence indices per row
    room: List[int] = []
    for i in sorted(range(len(seqs)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if free >= lengths[i]:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(width - lengths[i])
    total_rows = max(len(rows), n_rows or 0)
    ids = np.full((total_rows, width), pad_id, np.int32)
    pos = np.zeros((total_rows, width), np.int32)
    seg = np.zeros((total_rows, width), np.int32)
    last = np.zeros(max(len(seqs), n_last or 0), np.int32)
    order = np.zeros(len(seqs), np.int64)
    k = 0
    for r, members in enumerate(rows):
        at = 0
        for j, i in enumerate(members):
            n = lengths[i]
            ids[r, at:at + n] = seqs[i]
            pos[r, at:at + n] = np.arange(n)
            seg[r, at:at + n] = j + 1
            last[k] = r * width + at + n - 1
            order[i] = k
            k += 1
            at += n
    return {"ids": ids, "positions": pos, "segments": seg, "last": last}, order


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def row_length(n: int, step: int = 32) -> int:
    """The row length a scorer pads n tokens to: n rounded up to `step`, then to two values per octave (step
    times 1, 2, 3, 4, 6, 8, 12, 16, ...), so a run's row lengths take few values (at most a third of a row is
    padding beyond the step's rounding)."""
    units = -(-int(n) // step)
    top = _pow2(units)
    return (3 * top // 4 if top >= 4 and units <= 3 * top // 4 else top) * step


class _Inputs(nn.Cell):
    """ids, positions (rows, L) -> the first layer's input x (rows, L, H) and RoPE's cos / sin."""

    def __init__(self, rm: RewardModel):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.rm = rm

    def construct(self, ids, positions):
        lm = self.rm.lm
        cos, sin = lm.rope(positions)
        return lm.model.tok_embeddings(ids).astype(lm.dtype), cos, sin


class _Layer(nn.Cell):
    """x (rows, L, H), cos, sin, segments (rows, L), w (a decoder layer's weights, `DecoderLayer.weights()` order)
    -> (rows, L, H): any decoder layer of the model (`DecoderLayer.apply`), its attention in blocks of queries with
    their masks built from the segments, so one compiled graph runs every layer."""

    def __init__(self, layer: nn.Cell):
        super().__init__(auto_prefix=False)
        self.layer = layer

    def construct(self, x, cos, sin, segments, w):
        return self.layer.apply(x, cos, sin, None, w, (), segments)


class _Head(nn.Cell):
    """x (rows, L, H) after the last layer -> the score at every position (rows, L) fp32."""

    def __init__(self, rm: RewardModel):
        super().__init__(auto_prefix=False)
        self.rm = rm

    def construct(self, x):
        b, s, h = x.shape
        return self.rm.head(x.reshape(b * s, h)).reshape(b, s)


class _Whole(nn.Cell):
    """ids, positions, segments (rows, L) -> the score at every position (rows, L) fp32, the whole model in one
    graph (tensor parallelism: its layers hold pieces of the weights and sum over the ranks), the attention in
    blocks of queries (`DecoderLayer.construct_blocks`)."""

    def __init__(self, rm: RewardModel):
        super().__init__(auto_prefix=False)
        self.rm = rm

    def construct(self, ids, positions, segments):
        b, s = ids.shape
        lm = self.rm.lm
        cos, sin = lm.rope(positions)
        x = lm.model.tok_embeddings(ids).astype(lm.dtype)
        for i in lm.layer_ids:
            x = lm.model.layers[i].construct_blocks(x, cos, sin, segments)
        return self.rm.head(x.reshape(b * s, -1)).reshape(b, s)


GRAPHS_PER_LENGTH = {True: 3, False: 1}  # layerwise: inputs, layer, head; else the whole model
KEPT_ROW_LENGTHS = 4  # a scorer's default: the row lengths whose graphs stay alive (the most recently used)


def scoring_graph_bound(max_len: int, step: int = 32, layerwise: bool = True) -> int:
    """The most graphs a RewardScorer compiles in a run whose sequences have at most max_len tokens, padded or
    packed, and keeps every row length's (`kept_row_lengths` at least the row lengths counted here): every
    micro-batch's rows are one `row_length`, and each row length compiles its graphs once (three layerwise, one
    whole-model graph otherwise), whatever the calls' lengths."""
    lengths = {row_length(n, step) for n in range(1, max_len + 1)}
    return len(lengths) * GRAPHS_PER_LENGTH[layerwise]


class RewardScorer:
    """Scores of token sequences by a reward model, micro-batch by micro-batch, in input order:

        max_tokens = 0   sequences sorted by length, micro_batch_size at a time, one a row, each micro-batch's
                         rows of its longest sequence's `row_length`, micro_batch_size rows
        max_tokens = T   packed rows (`pack_rows`) of the longest sequence's `row_length`, T // that length rows a
                         micro-batch (at least one)

    Both are fed as packed rows (ids, positions, segments: a padded row is a packed row of one sequence) and the
    graphs return the score at every position, read at each sequence's last token on the host; so a micro-batch's
    shape is its row length alone and a run compiles at most `scoring_graph_bound` graphs. MindSpore's CPU runtime
    keeps every compiled graph's buffers while the graph lives: layerwise (the default on one device) a row
    length's graphs are the inputs, one decoder layer run for every layer (its weights the graph's inputs) and the
    head, holding one layer's buffers instead of every layer's; under tensor parallelism one whole-model graph.
    Either way the attention takes its queries in blocks (`models/block_attention.py`): no (rows, heads, L, L)
    buffer. The graphs of at most `kept_row_lengths` row lengths stay alive: meeting another drops those of the row
    length used longest ago (as `release()` drops them all, with their buffers); the next call that needs them
    compiles them again."""

    def __init__(self, rm: RewardModel, micro_batch_size: int = 8, max_tokens: int = 0, pad_id: int = 0,
                 step: int = 32, layerwise: Optional[bool] = None, kept_row_lengths: int = KEPT_ROW_LENGTHS):
        if kept_row_lengths < 1:
            raise ValueError(f"kept_row_lengths must be >= 1, got {kept_row_lengths}")
        self.rm, self.micro_batch_size, self.max_tokens, self.pad_id, self.step = \
            rm, micro_batch_size, max_tokens, pad_id, step
        self.kept_row_lengths = kept_row_lengths
        lm = rm.lm
        self.layerwise = lm.tp == 1 if layerwise is None else layerwise
        if self.layerwise and lm.tp != 1:
            raise ValueError("layerwise scoring runs the reward model on one device (no tensor parallelism)")
        layers = [lm.model.layers[i] for i in lm.layer_ids]
        self.layer_inputs = [ms.mutable(tuple(layer.weights())) for layer in layers] if self.layerwise else []
        self._graphs: OrderedDict = OrderedDict()  # row length -> its graphs, the most recently used last
        self.compiled_graphs = 0  # grows with each row length's graphs built (again after a release)

    @property
    def kept_graphs(self) -> int:
        """The compiled graphs alive (with their buffers)."""
        return sum(len(g) for g in self._graphs.values())

    def release(self) -> None:
        """Drop every compiled graph and the buffers the runtime keeps for them (freed only with the cells that
        compiled them: DEVELOPERS.md); the next call compiles again."""
        self._graphs.clear()

    def __call__(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """seqs: n token sequences -> scores (n,) float32."""
        if not seqs:
            return np.zeros(0, np.float32)
        return self._packed(seqs) if self.max_tokens else self._padded(seqs)

    @property
    def row_lengths(self) -> Tuple[int, ...]:
        """The row lengths whose graphs are alive, the most recently used last."""
        return tuple(self._graphs)

    def _graphs_for(self, width: int) -> tuple:
        """The row length's graphs, built when missing; the least recently used row length's dropped past the cap."""
        if width in self._graphs:
            self._graphs.move_to_end(width)
            return self._graphs[width]
        while len(self._graphs) >= self.kept_row_lengths:
            self._graphs.popitem(last=False)  # its cells go, and with them their compiled graphs' buffers
        rm = self.rm
        graphs = (_Inputs(rm), _Layer(rm.lm.model.layers[rm.lm.layer_ids[0]]), _Head(rm)) \
            if self.layerwise else (_Whole(rm),)
        self._graphs[width] = graphs
        self.compiled_graphs += len(graphs)
        return graphs

    def rows(self, ids: np.ndarray, positions: np.ndarray, segments: np.ndarray) -> np.ndarray:
        """Packed rows (`pack_rows`' ids, positions, segments, (rows, L) int32) -> the score at every position
        (rows, L) fp32: the graphs every call runs (a sequence's score is the one at its last token)."""
        graphs = self._graphs_for(ids.shape[1])
        feed = (ms.Tensor(ids), ms.Tensor(positions), ms.Tensor(segments))
        if not self.layerwise:
            return graphs[0](*feed).asnumpy()
        inputs, layer, head = graphs
        x, cos, sin = inputs(feed[0], feed[1])
        for w in self.layer_inputs:
            x = layer(x, cos, sin, feed[2], w)
        return head(x).asnumpy()

    def _padded(self, seqs) -> np.ndarray:
        out = np.zeros(len(seqs), np.float32)
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        for k in range(0, len(order), self.micro_batch_size):
            part = order[k:k + self.micro_batch_size]
            s = row_length(max(len(seqs[i]) for i in part), self.step)
            ids = np.full((self.micro_batch_size, s), self.pad_id, np.int32)
            pos = np.zeros((self.micro_batch_size, s), np.int32)
            seg = np.zeros((self.micro_batch_size, s), np.int32)
            for row, i in enumerate(part):
                n = len(seqs[i])
                ids[row, :n], pos[row, :n], seg[row, :n] = seqs[i], np.arange(n), 1
            scores = self.rows(ids, pos, seg)
            out[part] = scores[np.arange(len(part)), [len(seqs[i]) - 1 for i in part]]
        return out

    def _packed(self, seqs) -> np.ndarray:
        width = row_length(max(len(q) for q in seqs), self.step)
        rows_per = max(1, self.max_tokens // width)
        arrays, order = pack_rows(seqs, width, self.pad_id)
        row_of = arrays["last"] // width  # (n,) the row of each packed sequence
        out = np.zeros(len(seqs), np.float32)
        where = np.empty(len(seqs), np.int64)  # packed entry -> input index
        where[order] = np.arange(len(seqs))
        for first in range(0, len(arrays["ids"]), rows_per):
            mine = np.nonzero((row_of >= first) & (row_of < first + rows_per))[0]  # packed entries
            feed = []
            for key in ("ids", "positions", "segments"):
                block = np.full((rows_per, width), self.pad_id if key == "ids" else 0, np.int32)
                got = arrays[key][first:first + rows_per]
                block[:len(got)] = got
                feed.append(block)
            scores = self.rows(*feed).reshape(-1)
            out[where[mine]] = scores[arrays["last"][mine] - first * width]
        return out


def load_reward_model(path: str, config: Optional[str] = None, seed: int = 0, layers: Optional[DenseLayers] = None,
                      shard=None, **overrides) -> RewardModel:
    """A reward model from an HF folder (config.json + safetensors with `score.weight`, or Qwen2ForRewardModel's
    `score.0.*` / `score.2.*`) or a MindSpore .ckpt with a config beside it (or given), as
    `scripts/convert_weight.py` writes them. layers / shard: a tensor-parallel piece (`layers` its factory,
    `shard(name, full array)` this rank's piece of each tensor)."""
    cfg = Qwen2Config.load(config or find_config(path), **overrides)
    state = read_model_state(path, cfg, head="score")
    rm = RewardModel(cfg, seed=seed, layers=layers, head=head_of(state))
    rm.load(state if shard is None else {n: shard(n, a) for n, a in state.items()})
    return rm
