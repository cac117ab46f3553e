"""Training-side graphs over a Qwen2ForCausalLM: full logits (tests, parity) and per-token
log-probs of given labels at the scored positions only (the GRPO training and reference graph)."""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.models.qwen2 import NEG_INF, Qwen2ForCausalLM


def causal_bias(s: int):
    """(1, 1, S, S) additive: 0 where key <= query, NEG_INF after."""
    causal = ops.arange(s).reshape(s, 1) >= ops.arange(s).reshape(1, s)
    return ops.where(causal, 0.0, NEG_INF).astype(ms.float32).reshape(1, 1, s, s)


def positions(b: int, s: int):
    """(B, S) int32: 0 .. S-1 in every row (right padding: the real tokens come first)."""
    return ops.arange(s).astype(ms.int32).reshape(1, s).broadcast_to((b, s))


class StageHidden(nn.Cell):
    """A pipeline stage before the last: inputs (token ids (B, S) on the first stage, else the
    previous stage's (B, S, H)) -> hidden states (B, S, H) for the next stage. Right-padded rows,
    positions 0 .. S-1, causal attention, as `TokenLogProbs`."""

    def __init__(self, lm: Qwen2ForCausalLM):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.lm = lm

    def construct(self, inputs):
        b, s = inputs.shape[0], inputs.shape[1]
        return self.lm.hidden_states(inputs, positions(b, s), causal_bias(s))


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
    the logits). 0: MindSpore's autodiff over the whole."""

    def __init__(self, lm: Qwen2ForCausalLM, with_entropy: bool = True, temperature: float = 1.0, chunk: int = 0):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        if not lm.last_stage:
            raise ValueError("TokenLogProbs needs the last pipeline stage (the final norm and the lm_head)")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.lm = lm
        self.with_entropy = with_entropy
        self.inv_temperature = 1.0 / temperature
        self.chunk = chunk
        if chunk > 0:
            self.head = lm.layer_factory.head_logprobs(lm.config.vocab_size, chunk, with_entropy)

    def construct(self, inputs, score_pos, labels):
        b, s = inputs.shape[0], inputs.shape[1]  # inputs: ids (B, S), or (B, S, H) from the previous stage
        r = score_pos.shape[1]
        h = self.lm.hidden_states(inputs, positions(b, s), causal_bias(s))  # (B, S, H)
        flat = (ops.arange(b).astype(ms.int32).reshape(b, 1) * s + score_pos).reshape(-1)
        h = ops.gather(h.reshape(b * s, -1), flat, 0)  # (B*R, H)
        h = self.lm.model.norm_out(h)
        if self.inv_temperature != 1.0:
            h = h * self.inv_temperature
        if self.chunk > 0:
            logp, ent, _ = self.head(self.lm.head_enter(h), self.lm.head_weight(), labels.reshape(-1))
        else:
            logp, ent = self.lm.token_logprobs(h, labels.reshape(-1), self.with_entropy)
        return logp.reshape(b, r), ent.reshape(b, r)
