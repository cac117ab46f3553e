"""Validation during training: val_n samples per prompt at val_temperature, val/pass@k, mean@n, maj@n
and accuracy logged, val_before_train, save_best keeping the best validated step as checkpoints/best,
and the step's perf/* against a hand computation from its logged lengths and times. A fake engine
and fake rewards drive a real GRPOTrainer on a tiny model."""

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.grpo.prompts import PromptSource
from mindgrpo.grpo.trainer import GRPOTrainer
from mindgrpo.grpo.validation import Best, val_metrics
from mindgrpo.inference.engine import Completion
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.progress import Progress
from fakes import RecordingLog

CFG = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64)
G = 4


def test_val_metrics_hand_case():
    # 3 prompts x 2 samples; answers 7/7 (both right), 3/4 (wrong, right), none/5 (wrong, wrong)
    texts = ["so 7", "it is 7", "3", "4", "none", "5"]
    m = val_metrics(np.array([1, 1, 0, 1, np.nan, 0], np.float32), texts, 2)
    # pass@1 = mean of c/n = (1 + 0.5 + 0) / 3; pass@2 = (1 + 1 + 0) / 3; maj@2: 7 (right), tie 3/4 -> 3
    # (wrong), 5 (wrong); an unscored sample (nan) counts 0 in the accuracy
    assert m == pytest.approx({"val/accuracy": 0.5, "val/pass@1": 0.5, "val/pass@2": 2 / 3, "val/mean@2": 0.5,
                               "val/maj@2": 1 / 3})


def test_best_counts_validations_after_a_training_step_and_only_strict_improvements():
    b = Best("val/accuracy")
    assert not b.update({"val/accuracy": 0.9}, 0)  # before training: the initial model is not a checkpoint
    assert b.update({"val/accuracy": 0.2}, 1) and not b.update({"val/accuracy": 0.2}, 2)
    assert not b.update({"loss": 1.0}, 3) and b.update({"val/accuracy": 0.5}, 4)
    assert b.state() == {"metric": "val/accuracy", "value": 0.5, "step": 4}
    other = Best("val/pass@2")
    other.load_state(b.state())  # a record of another metric does not count
    assert other.value is None


class Engine:
    """Training rollouts of 3 tokens; validation samples whose accuracy the fake rewards script."""

    def __init__(self):
        self.last_stats = {"new_tokens": 0, "tokens_per_s": 0.0}
        self.val_params = []

    def generate(self, prompts, params):
        if params.n != G:
            self.val_params.append(params)
        rng = np.random.default_rng(params.seed)
        return [Completion(i, list(rng.integers(2, 64, 3)), "stop") for i in range(len(prompts)) for _ in range(params.n)]


class Tok:
    pad_token_id, stop_token_ids = 0, [1]

    def decode_batch(self, ids, skip_special_tokens=True):
        return [" ".join(map(str, t)) for t in ids]


class Rewards:
    """Training: random rewards. Validation (calls with a `solution` column of 'v'): the next
    accuracy row of `val_scores`."""

    def __init__(self, val_scores):
        self.val_scores, self.calls = list(val_scores), 0

    def __call__(self, completions, **columns):
        if columns["solution"][0] == "v":
            acc = np.array(self.val_scores.pop(0), np.float32)
            return acc, {"accuracy": acc}, {}
        self.calls += 1
        r = np.random.default_rng(self.calls).random(len(completions)).astype(np.float32)
        return r, {"random": r}, {}


class Saves:
    root = "unused"

    def __init__(self):
        self.saved = []

    def save(self, step, groups, state, model_config, name=None):
        self.saved.append((step, name, state.get("best")))


def prompts(solution, n):
    return PromptSource({"prompt_ids": [np.array([k]) for k in range(10, 10 + n)], "prompt_length": [1] * n,
                         "solution": [solution] * n, "answer": [""] * n, "prompt": [""] * n}, seed=0)


def trainer(val_scores, **rl):
    cfg = from_dict(GRPOConfig, {"rl_config": dict(batch_size=2, num_generations=G, max_steps=4, val_interval=1,
                                                   val_size=2, save_interval=2, **rl),
                                 "actor_config": {"micro_batch_size": 4, "lr": 1e-2}})
    lm = Qwen2ForCausalLM(CFG, seed=1)
    log, saves, engine = RecordingLog(), Saves(), Engine()
    t = GRPOTrainer(cfg, policy=lm, inference=lm, reference=None, engine=engine, sync=lambda: {}, ref_sync=None,
                    memory=SwapManager(enabled=False), rewards=Rewards(val_scores), tokenizer=Tok(),
                    train_prompts=prompts("", 20), val_prompts=prompts("v", 2), metrics_log=log,
                    progress=Progress(4), output_dir="unused", checkpoints=saves)
    return t, log, saves, engine


def test_sampled_validation_logs_pass_at_k_and_save_best_keeps_the_best_step():
    # accuracy of 2 prompts x 2 samples at steps 0..4
    scores = [[1, 1, 1, 1], [0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0], [1, 1, 0, 1]]
    t, log, saves, engine = trainer(scores, val_n=2, val_temperature=0.7, save_best="val/accuracy")
    t.fit()
    assert [p.n for p in engine.val_params] == [2] * 5 and {p.temperature for p in engine.val_params} == {0.7}
    acc = [log.rows[s]["val/accuracy"] for s in range(5)]
    assert acc == [1.0, 0.25, 0.5, 0.25, 0.75]
    assert log.rows[2]["val/pass@1"] == 0.5 and log.rows[2]["val/pass@2"] == 1.0 and log.rows[3]["val/pass@2"] == 0.5
    assert {"val/mean@2", "val/maj@2"} <= set(log.rows[1])
    # best after steps 1 (0.25), 2 (0.5), 4 (0.75): step 0's 1.0 is the initial model's; step 3 does not beat 0.5
    assert [(s, n) for s, n, _ in saves.saved] == [(1, "best"), (2, None), (2, "best"), (4, None), (4, "best")]
    assert saves.saved[-1][2] == {"metric": "val/accuracy", "value": 0.75, "step": 4}
    # a resumed run carries the best value on: step 3's 0.25 would not replace it
    t2, _, _, _ = trainer([[0] * 4] * 5, val_n=2, val_temperature=0.7, save_best="val/accuracy")
    t2.best.load_state(saves.saved[2][2])
    assert not t2.best.update({"val/accuracy": 0.25}, 3)


def test_val_before_train_false_skips_step_0_greedy_validation_by_default_and_perf_metrics():
    t, log, saves, engine = trainer([[1, 0]] * 4, val_before_train=False)
    t.fit()
    assert sorted(log.rows) == [1, 2, 3, 4] and log.rows[1]["val/accuracy"] == 0.5
    assert all(p.n == 1 and p.temperature == 0.0 for p in engine.val_params)
    assert all(name is None for _, name, _ in saves.saved)  # no save_best: no best checkpoint

    # perf/* against a hand computation from the step's logged lengths and times
    B = 2 * G
    for step in range(1, 5):
        m = log.rows[step]
        tokens = (m["prompt_length/mean"] + m["response_length/mean"]) * B  # 1 + 3 tokens per sample
        assert tokens == 32
        assert m["perf/e2e_tokens_per_s_per_device"] == pytest.approx(tokens / (m["time/step"] - m["time/validate"]))
        assert m["perf/rollout_tokens_per_s_per_device"] == pytest.approx(tokens / m["time/rollout"])
        assert m["perf/update_tokens_per_s_per_device"] == pytest.approx(tokens / m["time/update"])
        # the update's FLOPs by hand for CFG: per token 2 x (16x16 + 2 x 16x8 + 16x16 + 3 x 16x32) = 4608, x 4
        # tokens; attention 4 x 2 heads x 8 x 10 causal pairs = 640; head 2 x 16 x 64 x 3 response tokens; 8
        # samples; forward + backward = 3 forwards; CPU peak 0.12 TFLOP/s
        flops = 3 * 8 * (4608 * 4 + 640 + 2 * 16 * 64 * 3)
        assert m["perf/mfu"] == pytest.approx(flops / (m["time/update"] * 0.12e12))
        assert "perf/reference_tokens_per_s_per_device" not in m  # beta 0: no reference pass
