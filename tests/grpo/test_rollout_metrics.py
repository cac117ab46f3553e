"""The trainer keeps the rollout engine's account of a step: its per-call figures as rollout/<key>,
-log p of the sampled tokens under the inference graph as rollout/nll, and each token's two
log-probs in the experience, laid out like the labels (a stand-in engine: nothing compiles)."""

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.grpo.prompts import PromptSource
from mindgrpo.grpo.rollouts import ROLLOUT_STATS
from mindgrpo.grpo.trainer import GRPOTrainer
from mindgrpo.inference.engine import Completion
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.progress import Progress

CFG = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64)
G = 2
STATS = {"new_tokens": 0, "tokens_per_s": 100.0, "useful_fraction": 0.75, "slots_in_use": 3.0, "kv_bytes": 4096,
         "prefill_seconds": 0.5, "decode_seconds": 1.5, "decode_steps": 7, "compiled_graphs": 4}


class Engine:
    """Responses of 1 to 3 tokens; token k of a response has log-probs -(k + 1) / 10 (scaled) and
    -(k + 1) / 20 (sampled)."""

    def __init__(self):
        self.last_stats = dict(STATS)

    def generate(self, prompts, params):
        out = []
        for i in range(len(prompts)):
            for j in range(G):
                n = 1 + (i + j) % 3
                scaled = -np.arange(1, n + 1, dtype=np.float32) / 10
                out.append(Completion(i, list(range(2, 2 + n)), "stop", scaled, scaled / 2))
        self.last_stats["new_tokens"] = sum(len(c.token_ids) for c in out)
        return out


class Tok:
    pad_token_id, stop_token_ids = 0, [1]

    def decode_batch(self, ids, skip_special_tokens=True):
        return [" ".join(map(str, t)) for t in ids]


def rewards(completions, **columns):
    r = np.arange(len(completions), dtype=np.float32) % 3
    return r, {"r": r}, {}


@pytest.fixture(scope="module")
def trainer():
    cfg = from_dict(GRPOConfig, {"rl_config": dict(batch_size=3, num_generations=G, max_steps=1),
                                 "actor_config": {"micro_batch_size": 3}})
    data = {"prompt_ids": [np.array([k, k + 1]) for k in range(10, 20)], "prompt_length": [2] * 10,
            "solution": [""] * 10, "answer": [""] * 10, "prompt": [""] * 10}
    lm = Qwen2ForCausalLM(CFG, seed=1)
    return GRPOTrainer(cfg, policy=lm, inference=lm, reference=None, engine=Engine(), sync=lambda: {},
                       ref_sync=None, memory=SwapManager(enabled=False), rewards=rewards, tokenizer=Tok(),
                       train_prompts=PromptSource(data, seed=0), val_prompts=None, metrics_log=None,
                       progress=Progress(1), output_dir="unused", checkpoints=object())


def test_the_step_logs_the_engines_figures_and_the_inference_nll(trainer):
    r, metrics = trainer.collect()
    for key in ROLLOUT_STATS:
        assert metrics[f"rollout/{key}"] == float(STATS[key]), key
    # responses of 1, 2, 3 | 2, 3, 1 tokens...: the mean of -log p over every sampled token
    scaled = np.concatenate([c.logprobs for c in r.completions])
    assert scaled.size == 12 and metrics["rollout/nll"] == pytest.approx(-scaled.mean())
    assert metrics["rollout/nll"] == pytest.approx((6 * 0.1 + 4 * 0.2 + 2 * 0.3) / 12)


def test_the_experience_keeps_both_log_probs_laid_out_like_the_labels(trainer):
    r, _ = trainer.collect()
    adv, _ = trainer.advantages(r)
    exp = trainer.build_experience(r, adv)
    for i, c in enumerate(r.completions):
        n = len(c.token_ids)
        assert exp.mask[i].sum() == n
        np.testing.assert_array_equal(exp.rollout_logp[i, :n], c.logprobs)
        np.testing.assert_array_equal(exp.sampling_logp[i, :n], c.sampling_logprobs)
        assert not exp.rollout_logp[i, n:].any() and not exp.sampling_logp[i, n:].any()
    rows = exp.select(np.array([1, 4]))  # mini-batches carry them too
    np.testing.assert_array_equal(rows.rollout_logp, exp.rollout_logp[[1, 4]])
    np.testing.assert_array_equal(rows.sampling_logp, exp.sampling_logp[[1, 4]])
