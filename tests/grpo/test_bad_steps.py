"""A non-finite loss or gradient norm skips the optimizer step (weights, AdamW moments and the bias
corrections' step count untouched), is counted, and rl_config.max_bad_steps of them in a row stop
the run. Non-finite values are injected into the advantages and the old log-probs of a tiny model."""

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.grpo.actor import PolicyUpdater
from mindgrpo.grpo.experience import pack
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import AdamWSettings
from mindgrpo.grpo.packing import Batching
from mindgrpo.grpo.prompts import PromptSource
from mindgrpo.grpo.trainer import GRPOTrainer, TrainingStopped
from mindgrpo.inference.engine import Completion
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.progress import Progress
from fakes import RecordingLog

CFG = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64)
G = 4


def experience(seed=0):
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(2, 64, 3)) for _ in range(8)]
    responses = [list(rng.integers(2, 64, 1 + i % 4)) for i in range(8)]
    return pack(prompts, responses, rng.standard_normal(8).astype(np.float32))


def updater(lm, needs_old=False):
    return PolicyUpdater(lm, GRPOLoss(beta=0.0, kl_kind="k3", clip_low=0.2, clip_high=0.2, dual_clip=None,
                                      agg_mode="token-mean"), Batching(4), detach_old=not needs_old,
                         use_ref=False, optimizer=AdamWSettings(beta2=0.99, weight_decay=0.01))


def snapshot(lm, up):
    return ({p.name: p.asnumpy().copy() for p in lm.get_parameters()},
            {p.name: p.asnumpy().copy() for p in up.state_parameters()})


def assert_same(a, b):
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def poisoned(seed, poison):
    bad = experience(seed)
    bad.old_logp = np.where(bad.mask > 0, -4.0, 0.0).astype(np.float32)
    if poison == "advantage nan":
        bad.advantages[2] = np.nan
    elif poison == "advantage inf":
        bad.advantages[5] = np.inf
    else:
        bad.old_logp[3, 0] = -np.inf
    return bad


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_non_finite_steps_are_skipped_and_the_next_one_is_a_first_step():
    lm, twin = Qwen2ForCausalLM(CFG, seed=3), Qwen2ForCausalLM(CFG, seed=3)
    up, fresh = updater(lm, needs_old=True), updater(twin, needs_old=True)
    before = snapshot(lm, up)
    for seed, poison in enumerate(["advantage nan", "advantage inf", "old logp -inf"]):
        m = up.update(poisoned(seed, poison), lr=1e-2)
        assert m["skipped"] == 1.0 and not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])), poison
        assert up.optimizer_steps == 0
        assert_same(before[0], snapshot(lm, up)[0])  # weights
        assert_same(before[1], snapshot(lm, up)[1])  # moments
        assert all(not b.asnumpy().any() for b in up.buffer.bufs)  # the bad gradients are gone
    # the next good step is the first step of AdamW, exactly as on a twin that never saw the bad ones
    good = experience(7)
    good.old_logp = np.where(good.mask > 0, -4.0, 0.0).astype(np.float32)
    m1, m2 = up.update(good, lr=1e-2), fresh.update(good, lr=1e-2)
    assert m1["skipped"] == m2["skipped"] == 0.0 and m1["grad_norm"] == m2["grad_norm"] > 0
    assert up.optimizer_steps == fresh.optimizer_steps == 1
    after, twin_after = snapshot(lm, up), snapshot(twin, fresh)
    assert_same(after[0], twin_after[0])
    assert_same(after[1], twin_after[1])
    assert any(not np.array_equal(after[0][k], before[0][k]) for k in after[0])  # it did move


# ------------------------------------------------------------------------------ the trainer


class Engine:
    last_stats = {"new_tokens": 0, "tokens_per_s": 0.0}

    def generate(self, prompts, params):
        rng = np.random.default_rng(params.seed)
        return [Completion(i, list(rng.integers(2, 64, 3)), "stop") for i in range(len(prompts)) for _ in range(G)]


class Tok:
    pad_token_id, stop_token_ids = 0, [1]

    def decode_batch(self, ids, skip_special_tokens=True):
        return [" ".join(map(str, t)) for t in ids]


class Rewards:
    """Random rewards; nan at the steps (1-based) in `bad`."""

    def __init__(self, bad):
        self.bad, self.calls = set(bad), 0

    def __call__(self, completions, **columns):
        self.calls += 1
        r = np.random.default_rng(self.calls).random(len(completions)).astype(np.float32)
        if self.calls in self.bad:
            r[1] = np.nan
        return r, {"random": r}, {}


class Saves:
    root = "unused"

    def __init__(self):
        self.steps = []

    def save(self, step, groups, state, model_config):
        self.steps.append(step)


def trainer(bad, max_steps, max_bad_steps):
    cfg = from_dict(GRPOConfig, {"rl_config": dict(batch_size=2, num_generations=G, max_steps=max_steps,
                                                   max_bad_steps=max_bad_steps, save_interval=1),
                                 "actor_config": {"micro_batch_size": 4, "lr": 1e-2}})
    data = {"prompt_ids": [np.array([k]) for k in range(10, 30)], "prompt_length": [1] * 20,
            "solution": [""] * 20, "answer": [""] * 20, "prompt": [""] * 20}
    lm = Qwen2ForCausalLM(CFG, seed=1)
    log, saves = RecordingLog(), Saves()
    t = GRPOTrainer(cfg, policy=lm, inference=lm, reference=None, engine=Engine(), sync=lambda: {}, ref_sync=None,
                    memory=SwapManager(enabled=False), rewards=Rewards(bad), tokenizer=Tok(),
                    train_prompts=PromptSource(data, seed=0), val_prompts=None, metrics_log=log,
                    progress=Progress(max_steps), output_dir="unused", checkpoints=saves)
    return t, log, saves


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_bad_steps_are_counted_and_max_bad_steps_in_a_row_stop_the_run_before_saving():
    t, log, saves = trainer(bad={2, 3, 5, 6, 7}, max_steps=10, max_bad_steps=3)
    with pytest.raises(TrainingStopped, match=r"stopped at step 7: 3 steps in a row \(rl_config.max_bad_steps = 3\)"
                                              r".*weights are still those of step 4"):
        t.fit()
    assert sorted(log.rows) == [1, 2, 3, 4, 5, 6, 7]  # the bad steps are logged
    assert [log.rows[s]["train/skipped_updates"] for s in range(1, 8)] == [0, 1, 1, 0, 1, 1, 1]
    assert [log.rows[s]["train/bad_steps"] for s in range(1, 8)] == [0, 1, 2, 2, 3, 4, 5]
    assert t.updater.optimizer_steps == 2  # steps 1 and 4
    assert saves.steps == [1, 2, 3, 4, 5, 6]  # two bad steps in a row go on; the third is not saved
    assert t.bad_steps == {"total": 5, "in_a_row": 3}
