"""An outcome reward model: the Qwen2 / Qwen3 decoder of `models/qwen2.py` under a scalar head, as
Hugging Face writes it (`Qwen2ForSequenceClassification` / `Qwen3ForSequenceClassification` with
`num_labels: 1`): `score.weight` (1, H), no bias, applied after the final norm; a sequence's score
is the head's output at its last real token.

    RewardModel          the parameters: the decoder (`model.*`, the causal LM's names, no lm_head)
                         and `score.weight`; built from a config, loaded by `load_reward_model`
    RewardScores         padded rows, left or right: input_ids (B, S), attention_mask (B, S) -> (B,)
    PackedRewardScores   packed rows (several sequences a row, each attending only to itself):
                         ids, positions, segments (rows, L), last (n,) -> (n,)
    pack_rows            sequences -> the packed rows' arrays (numpy; first fit, longest first)
    RewardScorer         token sequences -> scores in input order, micro-batch by micro-batch (padded or packed)

Positions count only real tokens (0 at each sequence's first token), as under right padding and packing.
(HF's forward numbers positions 0 .. S-1 whatever the mask unless given `position_ids`; RoPE depends only
on the distance between positions, so a left-padded row's shifted positions change its score by rounding
only, and the parity test passes either way: it checks the pooling and the mask, not this choice.)
The last real token is the rightmost position whose mask is 1 (HF takes the rightmost token that is
not `pad_token_id`: the same where no real token is the pad id).
Shapes use the vocabulary of `mindgrpo/__init__.py`; n is the number of scored sequences.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from mindgrpo.models.checkpoint import find_config, read_model_state
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import REWARD_HEADS, head_of
from mindgrpo.models.qwen2 import _DTYPES, NEG_INF, DenseLayers, Linear, Qwen2ForCausalLM, StageSpec
from mindgrpo.models.scoring import causal_bias, segment_bias


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


class RewardScores(nn.Cell):
    """input_ids (B, S), attention_mask (B, S) (left or right padding) -> scores (B,) fp32: the head
    on the last real token of each row, run on those B rows only."""

    def __init__(self, rm: RewardModel):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.rm = rm

    def construct(self, input_ids, attention_mask):
        b, s = input_ids.shape
        mask = attention_mask.astype(ms.int32)
        positions = ops.maximum(ops.cumsum(mask, 1) - 1, 0).astype(ms.int32)  # (B, S)
        keys = ops.where(mask > 0, 0.0, NEG_INF).astype(ms.float32).reshape(b, 1, 1, s)
        h = self.rm.lm.hidden_states(input_ids, positions, causal_bias(s) + keys)  # (B, S, H)
        at = ops.arange(s).astype(ms.float32).reshape(1, s) * mask.astype(ms.float32)
        last = at.max(axis=1).astype(ms.int32)  # (B,) the rightmost real token
        flat = ops.arange(b).astype(ms.int32) * s + last
        return self.rm.head(ops.gather(h.reshape(b * s, -1), flat, 0))  # (B,)


class PackedRewardScores(nn.Cell):
    """Packed rows (`pack_rows`): ids (rows, L), positions (rows, L), segments (rows, L) (1, 2, ... the
    row's sequences, 0 its padding), last (n,) flat index into rows * L of each sequence's last token
    -> scores (n,) fp32."""

    def __init__(self, rm: RewardModel):
        super().__init__(auto_prefix=False)
        self.rm = rm

    def construct(self, ids, positions, segments, last):
        b, s = ids.shape
        h = self.rm.lm.hidden_states(ids, positions, segment_bias(segments))  # (rows, L, H)
        return self.rm.head(ops.gather(h.reshape(b * s, -1), last, 0))  # (n,)


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


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class RewardScorer:
    """Scores of token sequences by a reward model, micro-batch by micro-batch, in input order:

        max_tokens = 0   sequences sorted by length, micro_batch_size at a time, each micro-batch right-padded
                         to its longest sequence rounded up to `step` (and to micro_batch_size rows)
        max_tokens = T   packed rows (`pack_rows`) of the longest sequence's length rounded up to `step`,
                         T // that length rows a micro-batch (at least one), the sequences of a micro-batch
                         counted up to a power of two
    so the shapes a run compiles stay few (one per row length)."""

    def __init__(self, rm: RewardModel, micro_batch_size: int = 8, max_tokens: int = 0, pad_id: int = 0,
                 step: int = 32):
        self.rm, self.micro_batch_size, self.max_tokens, self.pad_id, self.step = \
            rm, micro_batch_size, max_tokens, pad_id, step
        self.padded, self.packed = RewardScores(rm), PackedRewardScores(rm)

    def __call__(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """seqs: n token sequences -> scores (n,) float32."""
        if not seqs:
            return np.zeros(0, np.float32)
        return self._packed(seqs) if self.max_tokens else self._padded(seqs)

    def _padded(self, seqs) -> np.ndarray:
        out = np.zeros(len(seqs), np.float32)
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        for k in range(0, len(order), self.micro_batch_size):
            part = order[k:k + self.micro_batch_size]
            s = _round_up(max(len(seqs[i]) for i in part), self.step)
            ids = np.full((self.micro_batch_size, s), self.pad_id, np.int32)
            mask = np.zeros((self.micro_batch_size, s), np.int32)
            for row, i in enumerate(part):
                ids[row, :len(seqs[i])], mask[row, :len(seqs[i])] = seqs[i], 1
            out[part] = self.padded(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()[:len(part)]
        return out

    def _packed(self, seqs) -> np.ndarray:
        width = _round_up(max(len(q) for q in seqs), self.step)
        rows_per = max(1, self.max_tokens // width)
        arrays, order = pack_rows(seqs, width, self.pad_id)
        row_of = arrays["last"] // width  # (n,) the row of each packed sequence
        out = np.zeros(len(seqs), np.float32)
        where = np.empty(len(seqs), np.int64)  # packed entry -> input index
        where[order] = np.arange(len(seqs))
        for first in range(0, len(arrays["ids"]), rows_per):
            mine = np.nonzero((row_of >= first) & (row_of < first + rows_per))[0]  # packed entries
            feed = {}
            for key in ("ids", "positions", "segments"):
                block = np.zeros((rows_per, width), np.int32)
                got = arrays[key][first:first + rows_per]
                block[:len(got)] = got
                feed[key] = block
            last = np.zeros(_pow2(len(mine)), np.int32)
            last[:len(mine)] = arrays["last"][mine] - first * width
            scores = self.packed(*(ms.Tensor(feed[k]) for k in ("ids", "positions", "segments")), ms.Tensor(last))
            out[where[mine]] = scores.asnumpy()[:len(mine)]
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
