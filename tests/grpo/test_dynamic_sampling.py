"""DAPO options in the trainer: dynamic sampling refills zero-variance groups; overlong filtering
masks truncated samples. A scripted engine and reward stand in for the model. Also the reward phase
with real reward sets: a hung reward times out and the step goes on, a broken one stops it."""

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.grpo.prompts import PromptSource
from mindgrpo.grpo.trainer import GRPOTrainer
from mindgrpo.inference.engine import Completion
from mindgrpo.memory.swap import SwapManager
from mindgrpo.rewards import RewardError, RewardSet, load_reward_plugin
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.progress import Progress

G = 4


class ScriptedEngine:
    """Prompt k's samples answer `k` (right) or `k+1` (wrong) as `pattern(k)` says."""

    def __init__(self, pattern, answers=None):
        self.pattern, self.calls, self.last_stats = pattern, [], {"new_tokens": 0, "tokens_per_s": 0.0}
        self.told = []  # the trainer's counts of prompts to draw again (a separate placement's rollout ranks hear them)
        # the counts this engine answers instead (a separate placement's rollout ranks' decision); None: the trainer's
        self.answers = answers

    def next_round(self, count):
        self.told.append(count)
        return count if self.answers is None else self.answers.pop(0)

    def generate(self, prompts, params):
        self.calls.append([p[0] for p in prompts])
        out = []
        for i, p in enumerate(prompts):
            for j, right in enumerate(self.pattern(p[0])):
                tokens = [p[0] if right else p[0] + 1] + ([7] * 3 if j == 0 else [])
                out.append(Completion(i, tokens, "length" if j == 0 else "stop"))
        self.last_stats = {"new_tokens": sum(len(c.token_ids) for c in out), "tokens_per_s": 1.0}
        return out


class Tok:
    pad_token_id, stop_token_ids = 0, [1]

    def decode_batch(self, ids, skip_special_tokens=True):
        return [str(t[0]) for t in ids]


def exact(completions, solution, **_):
    return [float(c == s) for c, s in zip(completions, solution)]


class Rewards:
    def __call__(self, completions, **columns):
        r = np.array(exact(completions, **columns), np.float32)
        return r, {"accuracy": r}, {}


class Log:
    def log_completions(self, step, rows):
        pass


def prompts() -> PromptSource:
    """Prompts 10, 11, ... in order, prompt k's solution "k"."""
    data = {"prompt_ids": [np.array([k]) for k in range(10, 40)], "prompt_length": [1] * 30,
            "solution": [str(k) for k in range(10, 40)], "answer": [""] * 30, "prompt": [""] * 30}
    return PromptSource(data, seed=0, shuffle=False)


def make_trainer(pattern, rewards=None, answers=None, **rl):
    cfg = from_dict(GRPOConfig, {"rl_config": dict(batch_size=3, num_generations=G, **rl),
                                 "actor_config": {"micro_batch_size": 4}})
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    engine = ScriptedEngine(pattern, answers)
    trainer = GRPOTrainer(cfg, policy=lm, inference=lm, reference=None, engine=engine, sync=None, ref_sync=None,
                          memory=SwapManager(enabled=False), rewards=rewards or Rewards(), tokenizer=Tok(),
                          train_prompts=prompts(), val_prompts=None,
                          metrics_log=Log(), progress=Progress(1), output_dir="unused")
    return trainer, engine


def informative(k):  # even prompts: mixed rewards; odd prompts: all wrong
    return [True, False, False, False] if k % 2 == 0 else [False] * G


def test_dynamic_sampling_keeps_informative_groups_and_refills():
    trainer, engine = make_trainer(informative, dynamic_sampling=True, max_resample_times=3)
    r, metrics = trainer.collect()
    # round 0 draws 10, 11, 12 (keeps 10, 12), round 1 draws one more prompt: 13 (all wrong), round 2: 14
    assert engine.calls == [[10, 11, 12], [13], [14]]
    assert engine.told == [1, 1, 0]  # after each round: the prompts still wanted, then 0 once the batch is full
    assert r.batch.columns["solution"] == ["10", "12", "14"]
    assert len(r) == 3 * G and r.rewards.reshape(3, G).std(-1).min() > 0
    assert metrics["dynamic_sampling/rounds"] == 3


def test_dynamic_sampling_fills_with_dropped_groups_when_rounds_run_out():
    trainer, engine = make_trainer(lambda k: [False] * G, dynamic_sampling=True, max_resample_times=1)
    r, metrics = trainer.collect()
    assert len(engine.calls) == 2 and len(r) == 3 * G
    assert engine.told == [3, 0]  # nothing kept: three again, then 0 when the rounds run out
    assert metrics["dynamic_sampling/kept_groups"] == 0


@pytest.mark.parametrize("answers, calls", [
    ([0], [[10, 11, 12]]),  # the engine ends the step where the trainer wanted one more prompt: one rollout
    ([2, 0], [[10, 11, 12], [13, 14]]),  # two prompts where the trainer wanted one: it draws two, trains three groups
])
def test_dynamic_sampling_follows_the_engines_count_of_prompts(answers, calls):
    """A separate placement's rollout ranks decide a step's rounds (RemoteRollout.next_round answers their count): the
    trainer draws and meets as they say, whatever its own rewards say, and trains batch_size groups on its own
    scores."""
    trainer, engine = make_trainer(informative, answers=answers, dynamic_sampling=True, max_resample_times=3)
    r, metrics = trainer.collect()
    assert engine.calls == calls and engine.told[0] == 1
    assert len(r) == 3 * G and metrics["dynamic_sampling/rounds"] == len(calls)
    # kept first (10, 12; 14 with a second rollout), then a dropped group fills the batch
    assert r.batch.columns["solution"] == (["10", "12", "11"] if len(calls) == 1 else ["10", "12", "14"])


def test_without_dynamic_sampling_one_round():
    trainer, engine = make_trainer(informative)
    r, _ = trainer.collect()
    assert engine.calls == [[10, 11, 12]] and len(r) == 3 * G


def test_overlong_filtering_masks_truncated_rows():
    trainer, _ = make_trainer(informative, overlong_filtering=True)
    r, _ = trainer.collect()
    adv, _ = trainer.advantages(r)
    exp = trainer.build_experience(r, adv)
    truncated = np.array([c.finish_reason == "length" for c in r.completions])
    assert truncated.sum() == 3
    assert exp.mask[truncated].sum() == 0 and exp.mask[~truncated].sum() == (~truncated).sum()


SLOW_REWARDS = """
import time

from mindgrpo.rewards import register_reward


@register_reward("test_ds_hangs_on_11")
def hangs_on_11(completions, solution, **kwargs):
    if "11" in solution:
        time.sleep(60)  # a math check that never returns on prompt 11's completions
    return [float(c == s) for c, s in zip(completions, solution)]


@register_reward("test_ds_text")
def text(completions, **kwargs):
    return ["1" for _ in completions]
"""


@pytest.fixture(scope="module")
def slow_rewards(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "slow_rewards.py"
    path.write_text(SLOW_REWARDS)
    load_reward_plugin(str(path))


def test_a_hung_reward_costs_its_completions_and_the_step_goes_on(slow_rewards):
    rewards = RewardSet(["test_ds_hangs_on_11", "format"], num_workers=2, timeout_s=1.0)
    try:
        trainer, _ = make_trainer(informative, rewards=rewards)
        r, metrics = trainer.collect()  # prompts 10, 11, 12
    finally:
        rewards.close()
    scores = r.per_function["test_ds_hangs_on_11"].reshape(3, G)
    np.testing.assert_array_equal(scores[0], [1, 0, 0, 0])
    assert np.isnan(scores[1]).all()
    np.testing.assert_array_equal(scores[2], [1, 0, 0, 0])
    assert metrics["reward/test_ds_hangs_on_11/timeouts"] == G and metrics["reward/format/timeouts"] == 0
    np.testing.assert_array_equal(r.rewards.reshape(3, G)[1], 0.0)  # None counts as 0 in the total


def test_a_reward_returning_text_stops_the_step(slow_rewards):
    trainer, _ = make_trainer(informative, rewards=RewardSet(["test_ds_text"]))
    with pytest.raises(RewardError, match="reward 'test_ds_text' returned str '1' for completion 0"):
        trainer.collect()


def test_dynamic_sampling_that_keeps_nothing_does_not_update_and_says_so(caplog):
    trainer, engine = make_trainer(lambda k: [False] * G, dynamic_sampling=True, max_resample_times=1)
    before = {n: p.asnumpy().copy() for n, p in trainer.policy.parameters_and_names()}
    with caplog.at_level("WARNING", logger="mindgrpo"):
        metrics = trainer.train_step()  # an update would compile and run the training graph, and sync (None here)
    assert metrics["dynamic_sampling/no_update"] == 1 and metrics["dynamic_sampling/kept_groups"] == 0
    assert metrics["train/groups_with_reward_spread"] == 0 and metrics["train/skipped_updates"] == 0
    assert "loss" not in metrics and trainer.updater.optimizer_steps == 0
    for n, p in trainer.policy.parameters_and_names():
        np.testing.assert_array_equal(p.asnumpy(), before[n], err_msg=n)
    assert [r.getMessage() for r in caplog.records] == [
        "step 1: dynamic sampling kept no group in 2 rounds (every group's rewards were equal): no update this step "
        "(weights and optimizer state unchanged)"]


def test_a_step_whose_groups_all_have_equal_rewards_is_said(caplog):
    trainer, _ = make_trainer(lambda k: [False] * G)
    r, metrics = trainer.collect()
    with caplog.at_level("WARNING", logger="mindgrpo"):
        assert trainer.check_spread(r, metrics)  # without dynamic sampling the step updates as configured
    assert metrics["train/groups_with_reward_spread"] == 0 and "dynamic_sampling/no_update" not in metrics
    assert [r.getMessage() for r in caplog.records] == [
        "step 1: every group's rewards are equal (zero spread in all 3 groups): its advantages are 0 and the policy "
        "loss teaches nothing"]
    trainer, _ = make_trainer(informative, dynamic_sampling=True)
    r, metrics = trainer.collect()
    caplog.clear()
    with caplog.at_level("WARNING", logger="mindgrpo"):
        assert trainer.check_spread(r, metrics)
    assert caplog.records == [] and metrics["train/groups_with_reward_spread"] == 3
    assert metrics["dynamic_sampling/no_update"] == 0
