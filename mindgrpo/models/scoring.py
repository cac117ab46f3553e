"""Training-side graphs over a Qwen2ForCausalLM: full logits (tests, parity) and per-token
log-probs of given labels at the scored positions only (the GRPO training and reference graph), on
right-padded rows or on packed rows (several samples per row, `mindgrpo/grpo/packing.py`)."""

from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgrpo.models.qwen2 import NEG_INF, Qwen2ForCausalLM


def causal_bias(s: int):
    """(1, 1, S, S) additive: 0 where key <= query, NEG_INF after."""
    causal = ops.arange(s).reshape(s, 1) >= ops.arange(s).reshape(1, s)
    return ops.where(causal, 0.0, NEG_INF).astype(ms.float32).reshape(1, 1, s, s)


def positions(b: int, s: int):
    """(B, S) int32: 0 .. S-1 in every row (right padding: the real tokens come first)."""
    return ops.arange(s).astype(ms.int32).reshape(1, s).broadcast_to((b, s))


def segment_bias(segments, prefixes=None):
    """segments (B, S) int32, the sample each token of a packed row belongs to -> (B, 1, S, S)
    additive: 0 where the key is at or before the query and in the same sample, NEG_INF elsewhere.
    prefixes (B, S) int32 or None: a segment each token also sees (`prefix_bias`).

    Built as (key elsewhere) cast to fp32 times NEG_INF (-0.0 where kept: adding it changes no
    score), one side's broadcast explicit. A differentiated graph over packed rows so holds 4.6 bytes
    per (B, S, S) element beyond the padded one's (the bias and its bool mask); `ops.where(keep, 0.0,
    NEG_INF)` over both sides broadcast held 27 (`tests/grpo/test_packing.py`)."""
    b, s = segments.shape
    key = segments.reshape(b, 1, s)
    other = ops.broadcast_to(segments.reshape(b, s, 1), (b, s, s)) != key
    if prefixes is not None:
        other = ops.logical_and(other, ops.broadcast_to(prefixes.reshape(b, s, 1), (b, s, s)) != key)
    after = (ops.arange(s).reshape(s, 1) < ops.arange(s).reshape(1, s)).reshape(1, s, s)  # the key follows the query
    elsewhere = ops.logical_or(other, after)  # (B, S, S) bool
    return (elsewhere.astype(ms.float32) * NEG_INF).reshape(b, 1, s, s)


# shared-prefix runs (`packing`'s "shared" layout): a token's segment in the low 16 bits, in the high ones the segment
# it also sees (its group's prompt for a response token, its own for a prompt token)
PREFIX_SHIFT = 16


def prefix_bias(runs):
    """runs (B, S) int32 = segment | prefix << PREFIX_SHIFT -> `segment_bias` of the segments with the prefixes: a
    response sees its group's prompt and itself."""
    return segment_bias(ops.bitwise_and(runs, (1 << PREFIX_SHIFT) - 1), ops.bitwise_right_shift(runs, PREFIX_SHIFT))


# How packed rows keep samples apart (`mindgrpo/grpo/packing.py` makes the matching runs input):
#   mask   an additive block-diagonal causal bias built from segments (B, S); every device
#   flash  Ascend's flash_attention_score in its TND layout, given the runs' cumulative ends (K,)
PACKED_ATTENTION = ("mask", "flash")
# and what the graphs also take: prefix, the shared-prefix runs' bias (`prefix_bias`; not a user's option: the layout's)
GRAPH_ATTENTION = PACKED_ATTENTION + ("prefix",)


def runs_bias(runs, attention: str):
    """runs (B, S) int32 -> (B, 1, S, S) additive: `prefix_bias` (attention "prefix") or `segment_bias` ("mask")."""
    return prefix_bias(runs) if attention == "prefix" else segment_bias(runs)


class StageHidden(nn.Cell):
    """A pipeline stage before the last: inputs (token ids (B, S) on the first stage, else the
    previous stage's (B, S, H)) -> hidden states (B, S, H) for the next stage. Right-padded rows,
    positions 0 .. S-1, causal attention, as `TokenLogProbs`, with feed = (); or, given feed =
    (positions (B, S), runs), packed rows (`packed`). (feed is one tuple input, not `*feed`: see
    `mindgrpo.grpo.train_graph`'s note on construct signatures.)
    dropout: the policy's training forward with LoRA dropout: feed ends with the micro-batch's dropout key (int32
    scalar, `models/lora_dropout.update_key`), so (key,) or (positions, runs, key)."""

    def __init__(self, lm: Qwen2ForCausalLM, attention: str = "mask", dropout: bool = False):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        if attention not in GRAPH_ATTENTION:
            raise ValueError(f"unknown packed attention {attention!r}; valid: {', '.join(GRAPH_ATTENTION)}")
        self.lm = lm
        self.dropout = dropout
        self.attention, self.flash = attention, attention == "flash"
        if self.flash:  # the kernel's compressed causal mask (sparse_mode 3): 1 above the diagonal
            self.causal = Tensor(np.triu(np.ones((2048, 2048), np.uint8), 1))

    def construct(self, inputs, feed):
        drop = feed[len(feed) - 1] if self.dropout else None
        if len(feed) > (1 if self.dropout else 0):
            return self.packed(inputs, feed[0], feed[1], drop)
        b, s = inputs.shape[0], inputs.shape[1]
        return self.lm.hidden_states(inputs, positions(b, s), causal_bias(s), None, drop)

    def packed(self, inputs, positions, runs, drop=None):
        """Packed rows: positions (B, S); runs: segments (B, S) (mask) or the runs' cumulative
        ends in B*S (K,) (flash) -> (B, S, H). drop: the LoRA dropout key or None."""
        if self.flash:
            return self.lm.hidden_states(inputs, positions, None, (runs, self.causal), drop)
        return self.lm.hidden_states(inputs, positions, runs_bias(runs, self.attention), None, drop)


class SequenceLogits(nn.Cell):
    """input_ids (B, S), attention_mask (B, S) (left or right padding) -> logits (B, S, V).

    Positions count only real tokens (cumsum of the mask - 1), as HF generate does."""

    def __init__(self, lm: Qwen2ForCausalLM):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.lm = lm

    def construct(self, input_ids, attention_mask):
        b, s = input_ids.shape
        mask = attention_mask.astype(ms.int32)
        positions = ops.maximum(ops.cumsum(mask, 1) - 1, 0).astype(ms.int32)
        keys = ops.where(mask > 0, 0.0, NEG_INF).astype(ms.float32).reshape(b, 1, 1, s)
        h = self.lm.hidden_states(input_ids, positions, causal_bias(s) + keys)
        h = self.lm.model.norm_out(h)
        return self.lm.logits(h.reshape(b * s, -1)).reshape(b, s, -1)


class TokenLogProbs(nn.Cell):
    """Right-padded input_ids (B, S), score_pos (B, R), labels (B, R) -> logp (B, R), entropy (B, R).
    On the last of several pipeline stages the first input is the previous stage's (B, S, H).

    score_pos[b, r] is the position whose output predicts labels[b, r] (for a response that
    starts at position L, score_pos = L-1, L, ...). Padded entries may point anywhere: the
    caller masks them. With right padding, causal attention alone keeps pads out of view of
    real tokens, so no key mask is built. The vocabulary projection runs on B*R rows, not B*S.

    temperature T: log-probs and entropy of softmax(logits / T), the distribution a rollout at
    temperature T samples from (as TRL and verl score); the lm_head has no bias, so h / T before
    it is logits / T without a (B*R, V) pass.

    chunk > 0: the projection and log-softmax run `chunk` rows at a time with a hand-written
    backward (`mindgrpo.models.fused_head`; one more matmul in the backward pass, fewer passes over
    the logits). 0: MindSpore's autodiff over the whole.

    from_hidden: the first input is the hidden states (B, S, H) after every decoder layer (the
    layerwise update, `mindgrpo/grpo/layerwise.py`): only the final norm and the head run here."""

    def __init__(self, lm: Qwen2ForCausalLM, with_entropy: bool = True, temperature: float = 1.0, chunk: int = 0,
                 from_hidden: bool = False):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        if not lm.last_stage:
            raise ValueError("TokenLogProbs needs the last pipeline stage (the final norm and the lm_head)")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.lm = lm
        self.with_entropy = with_entropy
        self.inv_temperature = 1.0 / temperature
        self.chunk = chunk
        self.from_hidden = from_hidden
        if chunk > 0:
            self.head = lm.layer_factory.head_logprobs(lm.config.vocab_size, chunk, with_entropy)

    def construct(self, inputs, score_pos, labels):
        return self.scored(inputs, score_pos, labels, None)

    def scored(self, inputs, score_pos, labels, drop):
        """`construct`, drop: the LoRA dropout key of the policy's training forward (`DroppedTokenLogProbs`) or None."""
        b, s = inputs.shape[0], inputs.shape[1]  # inputs: ids (B, S), or (B, S, H) from the previous stage
        r = score_pos.shape[1]
        if self.from_hidden:
            h = inputs
        else:
            h = self.lm.hidden_states(inputs, positions(b, s), causal_bias(s), None, drop)  # (B, S, H)
        flat = (ops.arange(b).astype(ms.int32).reshape(b, 1) * s + score_pos).reshape(-1)
        h = ops.gather(h.reshape(b * s, -1), flat, 0)  # (B*R, H)
        logp, ent = self.project(h, labels.reshape(-1))
        return logp.reshape(b, r), ent.reshape(b, r)

    def project(self, h, labels):
        """Hidden states (N, H) at scored positions, before the final norm; labels (N,)
        -> log p (N,), entropy (N,)."""
        h = self.lm.model.norm_out(h)
        if self.inv_temperature != 1.0:
            h = h * self.inv_temperature
        if self.chunk > 0:
            logp, ent, _ = self.head(self.lm.head_enter(h), self.lm.head_weight(), labels)
        else:
            logp, ent = self.lm.token_logprobs(h, labels, self.with_entropy)
        return logp, ent


class PackedTokenLogProbs(nn.Cell):
    """`TokenLogProbs` on packed rows (`mindgrpo/grpo/packing.py`): inputs (ids (B, S), or the
    previous stage's (B, S, H)), positions (B, S), runs (segments (B, S), or with flash attention
    the runs' ends (K,)), tokens (N,), labels (N,), slots (n, R) -> logp (n, R), entropy (n, R) in
    the samples' layout (0 where a slot is N).

    Attention is causal within each sample; the vocabulary projection runs on the N scored tokens
    (flat indices into B*S), then each sample's entries are picked from them by its slots.

    from_hidden: inputs are the hidden states (B, S, H) after every decoder layer (the layerwise update and
    scoring, `mindgrpo/grpo/layerwise.py`): positions and runs are not read, only the final norm and the head run."""

    def __init__(self, lm: Qwen2ForCausalLM, with_entropy: bool = True, temperature: float = 1.0, chunk: int = 0,
                 attention: str = "mask", from_hidden: bool = False):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.scorer = TokenLogProbs(lm, with_entropy, temperature, chunk)
        self.rows = StageHidden(lm, attention)
        self.from_hidden = from_hidden

    def construct(self, inputs, positions, runs, tokens, labels, slots):
        return self.scored(inputs, positions, runs, tokens, labels, slots, None)

    def scored(self, inputs, positions, runs, tokens, labels, slots, drop):
        """`construct`, drop: the LoRA dropout key (`DroppedPackedTokenLogProbs`) or None."""
        b, s = positions.shape
        h = inputs if self.from_hidden else self.rows.packed(inputs, positions, runs, drop)  # (B, S, H)
        h = ops.gather(h.reshape(b * s, -1), tokens, 0)  # (N, H)
        logp, ent = self.scorer.project(h, labels)  # (N,) each
        zero = ops.zeros((1,), logp.dtype)
        picked = slots.reshape(-1)
        logp = ops.gather(ops.concat((logp, zero)), picked, 0).reshape(slots.shape)
        ent = ops.gather(ops.concat((ent, zero)), picked, 0).reshape(slots.shape)
        return logp, ent


class DroppedTokenLogProbs(TokenLogProbs):
    """`TokenLogProbs` of the policy's training forward with LoRA dropout: one more input, the micro-batch's
    dropout key (int32 scalar, `models/lora_dropout.update_key`), which the update's feed ends with."""

    def construct(self, inputs, score_pos, labels, drop):
        return self.scored(inputs, score_pos, labels, drop)


class DroppedPackedTokenLogProbs(PackedTokenLogProbs):
    """`PackedTokenLogProbs` with LoRA dropout (`DroppedTokenLogProbs`): the dropout key last."""

    def construct(self, inputs, positions, runs, tokens, labels, slots, drop):
        return self.scored(inputs, positions, runs, tokens, labels, slots, drop)
