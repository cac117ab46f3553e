"""fp16 compute with fp32 master weights on CPU (the bf16 path of Ascend, in the half precision the CPU
kernels have): the parameters stay fp32, and the log-probs of a random Qwen2 and Qwen3 stay within a stated
tolerance of the fp32 model's."""

import dataclasses

import numpy as np
import pytest
import mindspore as ms

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import TokenLogProbs

# max |log p_fp16 - log p_fp32| over the batch: each matmul's output rounded to 11 bits through two layers, on
# log-probs from -9.5 up (weights drawn with std 0.3: peaked distributions, unlike the near-uniform ones of the
# default 0.02); measured 3.0e-2 (Qwen2) and 1.3e-2 (Qwen3). The norms, softmax and log-probs stay fp32.
FP16_LOGPROB_TOLERANCE = 5e-2
QWEN2 = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
                    param_init_std=0.3)
QWEN3 = Qwen2Config(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=128,
                    tie_word_embeddings=False, param_init_std=0.3)


def batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 96, (3, 24)).astype(np.int32)
    pos = np.tile(np.arange(4, 23, dtype=np.int32), (3, 1))
    return ids, pos, np.take_along_axis(ids, pos + 1, axis=1)


@pytest.mark.parametrize("cfg", [QWEN2, QWEN3], ids=["qwen2", "qwen3"])
def test_fp16_compute_keeps_fp32_masters_and_logprobs_within_tolerance(cfg):
    full = Qwen2ForCausalLM(cfg, seed=3)
    half = Qwen2ForCausalLM(dataclasses.replace(cfg, compute_dtype="float16"), seed=3)
    masters = {p.name: p for p in half.get_parameters()}
    assert {p.dtype for p in masters.values()} == {ms.float32}
    for p in full.get_parameters():
        assert np.array_equal(p.asnumpy(), masters[p.name].asnumpy())
    ids, pos, labels = (ms.Tensor(a) for a in batch())
    lp32, _ = TokenLogProbs(full, with_entropy=False)(ids, pos, labels)
    lp16, _ = TokenLogProbs(half, with_entropy=False)(ids, pos, labels)
    assert lp16.dtype == ms.float32
    diff = np.abs(lp16.asnumpy() - lp32.asnumpy()).max()
    assert 0 < diff <= FP16_LOGPROB_TOLERANCE, diff  # half precision really ran, and stayed close
