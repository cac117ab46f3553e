"""Inputs shared by the msrun workers (tests/parallel/workers) and the tests that check them."""

import numpy as np

from mindgrpo.models.config import Qwen2Config

# nh=4, nkv=2: tp=2 splits whole kv groups; untied so lm_head is vocabulary-parallel on its own;
# one layer keeps the compile times of the msrun tier down (the four-rank case has two)
CFG = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
# for four ranks: nkv=4 so tp=4 is possible; tied embeddings
CFG4 = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, max_position_embeddings=128, tie_word_embeddings=True)
# for pipeline stages: untied (the embedding and the head live on different stages), four layers
# (two stages hold two each, four stages one)
CFG_PP = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
# LoRA through two pipeline stages (a layer each): the micro model's shape (tests/grpo/micro_qwen2.yaml) with CFG's
# vocabulary, untied (the embedding and the head live on different stages)
CFG_PP2 = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
# Qwen3: QK-norm, no q/k/v bias, head_dim 12 (not hidden / heads = 8); untied, one layer
CFG_QWEN3 = Qwen2Config(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=128,
                        tie_word_embeddings=False)
# Qwen3 through pipeline stages: CFG_PP's shapes with QK-norm, no q/k/v bias and head_dim 12
CFG_PP_QWEN3 = Qwen2Config(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                           max_position_embeddings=128, tie_word_embeddings=False)
SEED = 7  # the models' initial weights
SHARD_SEED = 8  # the checkpoint sliced by scripts/transform_checkpoint.py


def token_batch():
    """ids (3, 10), attention mask (row 0 left-padded), score positions (3, 7), labels (3, 7)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 96, (3, 10)).astype(np.int32)
    mask = np.ones((3, 10), np.int32)
    mask[0, :3] = 0
    pos = np.tile(np.arange(2, 9, dtype=np.int32), (3, 1))
    labels = rng.integers(0, 96, (3, 7)).astype(np.int32)
    return ids, mask, pos, labels


def experience_arrays():
    """(prompts, responses, advantages) of 8 rows of different lengths: the two data-parallel
    halves hold different token counts, so only global normalisation gives the one-device loss."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 96, n).tolist() for n in (3, 5, 4, 6, 3, 4, 5, 3)]
    responses = [rng.integers(1, 96, n).tolist() for n in (9, 2, 7, 4, 12, 1, 3, 8)]
    return prompts, responses, rng.standard_normal(8).astype(np.float32)


def sampling_logprobs(mask):
    """Stand-in rollout-engine log-probs of the sampled tokens, (B, R) like `mask`, 0 on padding: spread
    over [-6, -1] around the tiny models' log-probs (about -ln 96 = -4.6), so a tis_token weight
    exp(training - rollout) is truncated at 2 on some tokens and not on others."""
    rng = np.random.default_rng(2)
    return (-rng.uniform(1.0, 6.0, np.shape(mask)) * mask).astype(np.float32)


# the update of the msrun checks: token-mean, the rollout correction on (its weights and the mismatch
# metrics, maxima among them, combined over micro-batches, replicas and stages)
LOSS = dict(agg_mode="token-mean", rollout_correction="tis_token", rollout_correction_threshold=2.0)
# the metrics of that update that must match one device's
UPDATE_KEYS = ("loss", "pg_loss", "grad_norm", "entropy", "mismatch/abs_diff_mean", "mismatch/abs_diff_max",
               "mismatch/k3", "rollout_correction/weight_mean", "rollout_correction/weight_max",
               "rollout_correction/clipfrac")


def updater_kwargs(micro_batch_size=2, **batching):
    """PolicyUpdater's keywords of the cases; batching: Batching's max_tokens, packing."""
    from mindgrpo.grpo.optim import AdamWSettings
    from mindgrpo.grpo.packing import Batching

    # grad_clip small enough to clip: the clipping coefficient needs the whole gradient's norm
    return dict(batching=Batching(micro_batch_size, **batching), detach_old=True, use_ref=False,
                optimizer=AdamWSettings(beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.01, grad_clip=0.05))


def prompts():
    return [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]


def full_logits(cfg, seed):
    """The one-device model's logits (3, 10, V) on token_batch."""
    from mindspore import Tensor

    from mindgrpo.models.qwen2 import Qwen2ForCausalLM
    from mindgrpo.models.scoring import SequenceLogits

    ids, mask, _, _ = token_batch()
    return SequenceLogits(Qwen2ForCausalLM(cfg, seed=seed, max_positions=128))(Tensor(ids), Tensor(mask)).asnumpy()


def rm_sequences():
    """Nine token sequences of mixed lengths (ids < 96) for a reward model of CFG4's shape to score."""
    rng = np.random.default_rng(5)
    return [rng.integers(1, 96, n).tolist() for n in (5, 17, 9, 30, 2, 12, 21, 7, 26)]
