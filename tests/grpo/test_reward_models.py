"""Outcome reward models in the trainer (`mindgrpo/grpo/reward_models.py`): a GRPO step on the micro model with
a reward model beside a rule reward, the swap on and every exclusive group present (policy, a copied inference
model, a reference, the reward model): the ledger's invariant in every phase, the reward model resident in its
own phase only and counted as `plan_memory` counts it; the total reward the weighted sum; the config's checks."""

import os

import numpy as np
import pytest

import mindspore as ms

from mindgrpo.config import ConfigError, GRPOConfig, load_config
from mindgrpo.grpo import builder
from mindgrpo.grpo.reward_models import ModelReward
from mindgrpo.memory import swap
from mindgrpo.memory.plan import plan
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.reward_model import RewardScorer
from mindgrpo.rewards.running_norm import RunningNorm
from mindgrpo.utils.progress import Progress

from fakes import keep_rollouts, one_layer_micro, save_reward_model, watch_ledger

HERE = os.path.dirname(os.path.abspath(__file__))
MICRO = ["rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=4",
         "generate_config.max_tokens=8", "generate_config.max_prompt_length=32", "generate_config.max_num_seqs=8",
         "synthetic_config.template=raw", "actor_config.lr=1e-2", "rl_config.beta=0.05",
         "generate_config.inference_weights=copy", "rl_config.val_interval=0", "rl_config.completions_interval=0",
         "rl_config.swap=true", "rl_config.max_steps=1", "reward_config.num_workers=0",
         f"reward_config.reward_plugin={os.path.join(HERE, 'text_length_reward.py')}",
         "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]"]


class NoLog:
    def log_completions(self, step, rows):
        pass


def by_hand_bytes(m: Qwen2Config) -> int:
    """The reward model's fp32 parameters by hand: embedding, per layer q/k/v (+bias), o, SwiGLU, two norms; the
    final norm; the (1, H) head; no lm_head."""
    h, i, q, kv = m.hidden_size, m.intermediate_size, m.num_attention_heads * m.d, m.num_key_value_heads * m.d
    layer = h * q + q + 2 * (h * kv + kv) + q * h + 3 * h * i + 2 * h
    return 4 * (m.vocab_size * h + m.num_hidden_layers * layer + h + h)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    out = tmp_path_factory.mktemp("reward_models")
    model = one_layer_micro(out)
    rm_path = save_reward_model(str(out / "rm"), model)
    cfg = load_config(GRPOConfig, None, MICRO + [
        f"actor_config.model={model}", f"rl_config.output_dir={out}",
        f"reward_config.reward_models=[{{path: {rm_path}, name: judge, weight: 0.5, max_tokens_per_micro_batch: 64}}]"])
    parts = builder.build(cfg, builder.Paths(output_dir=str(out)))
    trainer = builder.make_trainer(cfg, parts, NoLog(), Progress(1), str(out))
    seen = watch_ledger(parts.memory)
    kept = keep_rollouts(trainer)
    metrics = trainer.train_step()
    yield dict(cfg=cfg, parts=parts, metrics=metrics, seen=seen, r=kept["r"], model=model, trainer=trainer)
    ms.set_context(mode=previous)


@pytest.mark.slow
def test_the_reward_model_has_its_own_phase_under_the_swap(run):
    memory, seen = run["parts"].memory, run["seen"]
    assert set(memory.groups) >= {"policy", "inference", "reference", "reward_model"}
    phases = {phase for phase, _ in seen}
    assert {"rollout", "reward_model", "reference", "update", "sync"} <= phases
    for phase, resident in seen:
        assert len(resident) <= 1, (phase, resident)  # the invariant, in every phase and between
        if phase == "reward_model":
            assert resident == ["reward_model"]
        elif phase is not None:
            assert "reward_model" not in resident, phase
    rm_cfg = run["parts"].reward_models.models[0].scorer.rm.config
    assert memory.groups["reward_model"].size() == by_hand_bytes(rm_cfg)
    assert memory.phase_peaks["reward_model"] == by_hand_bytes(rm_cfg)  # nothing else resident then
    p = plan(run["cfg"], Qwen2Config.load(run["model"]), reward_models=[rm_cfg])
    assert p.groups["reward_model"] == by_hand_bytes(rm_cfg) and p.phases["reward_model"] == ["reward_model"]
    # the scorer's graphs (and their buffers) go when the phase ends with release_graphs, else they stay
    scorer = run["parts"].reward_models.models[0].scorer
    assert scorer.compiled_graphs > 0
    assert scorer.kept_graphs == (0 if run["trainer"].memory_policy.release_graphs else scorer.compiled_graphs)


@pytest.mark.slow
def test_the_total_is_the_weighted_sum_of_rule_and_model_scores(run):
    r, metrics = run["r"], run["metrics"]
    rule = np.array([len(t) / 32 for t in r.texts], np.float32)
    model = r.per_function["judge"]
    assert np.isfinite(model).all() and np.ptp(model) > 0
    np.testing.assert_allclose(r.rewards, rule + 0.5 * model, rtol=1e-6, atol=1e-6)
    # the model's scores are its scores of prompt + completion, here scored padded instead of packed
    scorer = RewardScorer(run["parts"].reward_models.models[0].scorer.rm, micro_batch_size=8)
    again = scorer([[*p, *c.token_ids] for p, c in zip(r.prompt_ids, r.completions)])
    np.testing.assert_allclose(model, again, atol=1e-5)
    assert metrics["reward/judge/mean"] == pytest.approx(float(model.mean()), rel=1e-6)
    assert metrics["reward/total/mean"] == pytest.approx(float(r.rewards.mean()), rel=1e-5)


@pytest.mark.slow
def test_a_checkpoint_holds_the_running_statistics_of_a_normalised_reward_model(run):
    """Resume continues the standardisation where the run left it (state.json's reward_norms); statistics for a
    model that normalises but is missing are reported, not silently restarted."""
    trainer, models = run["trainer"], run["parts"].reward_models
    model = models.models[0]
    model.norm = RunningNorm()
    try:
        model.norm(np.array([0.25, 1.5, -3.0], np.float32))
        saved = model.norm.state()
        path = trainer.save()
        model.norm(np.array([7.0, 8.0], np.float32))  # the run went on after the save
        trainer.resume(path)
        assert model.norm.state() == saved and model.norm.count == 3
        assert models.load_state({}) == ["judge"] and model.norm.state() == saved
    finally:
        model.norm = None


def test_the_ledger_refuses_the_reward_model_beside_another_model():
    memory = swap.SwapManager(enabled=True)
    memory.register("policy", extra_bytes=10)
    memory.register("reward_model", extra_bytes=5)
    memory.phases = {**memory.phases, "reward_model": ("reward_model", "policy")}
    with pytest.raises(RuntimeError, match="swap invariant broken in phase 'reward_model'"):
        with memory.phase("reward_model"):
            pass


def test_running_norm_is_numpys_over_everything_seen():
    rng = np.random.default_rng(0)
    norm, seen = RunningNorm(), []
    for n in (5, 1, 7):
        x = rng.normal(3.0, 2.0, n).astype(np.float32)
        x[0] = np.nan if n == 7 else x[0]
        seen.extend(x[np.isfinite(x)].tolist())
        z = norm(x)
        np.testing.assert_allclose(z[1:], (x[1:] - np.mean(seen)) / np.std(seen), rtol=1e-5)
    assert np.isnan(z[0]) and norm.count == len(seen)


def test_running_norm_continues_from_its_state_through_json():
    import json

    rng = np.random.default_rng(3)
    a, b = rng.normal(2.0, 3.0, 9).astype(np.float32), rng.normal(-1.0, 0.5, 4).astype(np.float32)
    whole = RunningNorm()
    whole(a)
    again = RunningNorm()
    again.load_state(json.loads(json.dumps(whole.state())))
    np.testing.assert_array_equal(again(b), whole(b))


def test_model_reward_normalises_and_leaves_empty_inputs_unscored():
    class Fixed:
        def __call__(self, seqs):
            return np.array([float(len(q)) for q in seqs], np.float32)

    m = ModelReward("m", 1.0, "completion", Fixed(), normalize=True)
    final, raw = m([[1, 2], [3], [4]], [[5, 6, 7], [], [8]])
    np.testing.assert_array_equal(raw[[0, 2]], [3.0, 1.0])
    assert np.isnan(raw[1]) and np.isnan(final[1])
    np.testing.assert_allclose(final[[0, 2]], [1.0, -1.0], rtol=1e-6)


@pytest.mark.parametrize("entry, message", [
    ("{name: x}", "reward_models\\[0\\].path"),
    ("{path: a, template: chat}", "unknown reward model template"),
    ("{path: a, kept_row_lengths: 0}", "reward_models\\[0\\].kept_row_lengths': must be >= 1, got 0"),
    ("{path: a, name: test_text_length}", "names must differ"),
    ("[{path: a}, {path: b, name: rm0}]", "names must differ"),
    ("{path: a, model_parallel: 0}", "reward_models\\[0\\].model_parallel'?: must be >= 1"),
    # one process (MICRO): a world of one rank
    ("{path: a, model_parallel: 2}", "reward_models\\[0\\].model_parallel'?: must divide the world of 1 ranks"),
])
def test_config_refuses_bad_entries(entry, message):
    value = entry if entry.startswith("[") else f"[{entry}]"
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, None, MICRO + [f"reward_config.reward_models={value}"])
