"""rl_config.memory (mindgrpo/memory/auto.py): the memory savers chosen from the plan, the user's switches kept,
the resolved policy handed to the engine, the updater and the scorer."""

import dataclasses
import os

import pytest

from mindgrpo.config import ConfigError, GRPOConfig, load_config
from mindgrpo.memory.auto import MARGIN, apply, choose, host_available
from mindgrpo.memory.plan import plan
from mindgrpo.memory.policy import SAVERS, MemoryPolicy, relative_time, update_layers_time
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.presets import resolve_model_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, "model_configs", "qwen_grpo")
GiB = 2 ** 30
OFF = {k: False for k in SAVERS}


def load(name, *overrides):
    cfg = load_config(GRPOConfig, os.path.join(CONFIGS, name, "grpo_config.yaml"), list(overrides))
    return cfg, Qwen2Config.load(resolve_model_config(cfg.actor_config.model), compute_dtype=cfg.actor_config.dtype)


def switches(p: MemoryPolicy) -> dict:
    return {k: getattr(p, k) for k in SAVERS}


def test_the_tiny_default_keeps_every_saver_off_where_it_fits():
    """The tiny recipe's plan is a few GB: on a 24 GiB machine auto is the fastest, every saver off; the reference
    saver cannot act (beta = 0) and is said so."""
    p = choose(*load("tiny"), available=24 * GiB)
    assert switches(p) == OFF and p.fits and p.setting == "auto"
    assert dict(p.set_by) == {"layerwise_update": "auto", "reference_layerwise": "n/a", "generate_layerwise": "auto",
                              "release_graphs": "auto"}
    assert "memory: rl_config.memory=auto, planned against 24.0 GiB" in p.summary()


def test_the_0_5b_recipe_fits_24_gb_with_the_fastest_savers_that_do():
    """No saver set in the recipe: every saver off plans 70+ GB; auto turns on the layerwise savers, keeps the graphs
    (release_graphs is the costliest, and grows memory step after step), and plans within 90% of 24 GiB."""
    cfg, m = load("qwen2_5_0_5b")
    p = choose(cfg, m, available=24 * GiB)
    assert p.fits and p.peak <= (1 - MARGIN) * 24 * GiB
    assert switches(p) == {"layerwise_update": True, "reference_layerwise": True, "generate_layerwise": True,
                           "release_graphs": False}
    # the planned peak is the plan's of the config with these switches written in
    assert p.peak == plan(apply(cfg, p.overrides()), m).cpu_peak(False)
    assert plan(cfg, m).cpu_peak(False) > 24 * GiB  # every saver off would not fit
    # full fine-tuning: every layer of the layerwise update recomputes (keeping activations was measured no faster)
    assert p.recompute_num_layers is None and p.recompute_by == "auto"
    assert "null (auto; every layer runs its forward again" in p.summary()
    # on 16 GiB it must release the graphs too; on 4 GiB nothing fits: every saver, and the block says so
    tight = choose(cfg, m, available=16 * GiB)
    assert switches(tight) == {k: True for k in SAVERS} and tight.fits
    tiny_room = choose(cfg, m, available=4 * GiB)
    assert switches(tiny_room) == {k: True for k in SAVERS} and not tiny_room.fits
    assert "does NOT fit" in tiny_room.summary() and "no set of savers fits" in tiny_room.summary()


def test_auto_keeps_the_activations_of_as_many_lora_layers_as_fit_where_that_is_faster():
    """With LoRA (a kept layer's update 0.8x, a recomputed one beside kept ones 1.15x: policy.update_layers_time) and
    the layerwise update on, auto takes the fewest recomputed layers whose plan fits: none with room to spare, some
    on less, none kept where only a few could be (recomputing every layer is then the faster update)."""
    cfg, m = load("qwen2_5_0_5b", "actor_config.lora_rank=16")
    p = choose(cfg, m, available=24 * GiB)
    assert p.fits and p.layerwise_update and p.recompute_num_layers == 0
    assert p.overrides()["actor_config.recompute_num_layers"] == 0 and p.peak == plan(apply(cfg, p.overrides()),
                                                                                         m).cpu_peak(False)
    assert "actor_config.recompute_num_layers 0    (auto; no layer runs its forward again" in p.summary()
    every = plan(apply(cfg, {**p.overrides(), "actor_config.recompute_num_layers": None}), m).cpu_peak(False)
    assert p.peak > every + 2 * GiB  # 24 layers of 4 rows of 640 positions: 3.2 GiB kept
    p14 = choose(cfg, m, available=14 * GiB)
    n = p14.recompute_num_layers
    assert p14.fits and 0 < n < m.num_hidden_layers and not p14.release_graphs
    # the fewest: one fewer would not fit
    assert plan(apply(cfg, {**p14.overrides(), "actor_config.recompute_num_layers": n - 1}), m).cpu_peak(False) \
        > (1 - MARGIN) * 14 * GiB
    # on 13.15 GiB 14 recomputed layers would fit, 13 not: 10 kept layers beside 14 recomputed are the slower update
    room = 13.15 * GiB
    p13 = choose(cfg, m, available=room)
    assert p13.fits and p13.recompute_num_layers is None and p13.recompute_by == "auto"
    assert update_layers_time(14, 24, True) > 1 > update_layers_time(13, 24, True)
    peak = {k: plan(apply(cfg, {**p13.overrides(), "actor_config.recompute_num_layers": k}), m).cpu_peak(False)
            for k in (13, 14)}
    assert peak[13] > (1 - MARGIN) * room >= peak[14]
    # the block's step time counts the kept layers: faster than the same savers with every layer recomputing, and
    # full fine-tuning's (no kept layer measured faster) the same either way
    recomputing = dataclasses.replace(p, recompute_num_layers=None)
    assert p.step_time < recomputing.step_time == relative_time(p.on)
    assert f"step time ~{p.step_time:.2f}x" in p.summary() and p.step_time != pytest.approx(recomputing.step_time)
    full, _ = load("qwen2_5_0_5b", "actor_config.layerwise_update=true", "actor_config.recompute_num_layers=0")
    kept_full = choose(full, m, available=24 * GiB)
    assert kept_full.recompute_num_layers == 0 and kept_full.step_time == relative_time(kept_full.on)


def test_speed_and_low_and_the_users_switches_win():
    cfg, m = load("qwen2_5_0_5b", "rl_config.memory=speed")
    assert switches(choose(cfg, m, available=24 * GiB)) == OFF
    cfg, m = load("qwen2_5_0_5b", "rl_config.memory=low", "rl_config.release_graphs=false")
    p = choose(cfg, m, available=24 * GiB)
    assert switches(p) == {"layerwise_update": True, "reference_layerwise": True, "generate_layerwise": True,
                           "release_graphs": False}
    assert dict(p.set_by)["release_graphs"] == "user" and "rl_config.release_graphs" not in p.overrides()
    assert p.recompute_num_layers is None and p.recompute_by == "low"  # low: every layer recomputes
    cfg, m = load("tiny", "actor_config.layerwise_update=true")  # speed on the tiny default, one saver asked for
    p = choose(cfg, m, available=24 * GiB)
    assert switches(p) == dict(OFF, layerwise_update=True) and dict(p.set_by)["layerwise_update"] == "user"
    assert p.recompute_num_layers is None and p.recompute_by == "auto"  # full fine-tuning: every layer recomputes
    # the user's value stays whatever the setting
    cfg, m = load("tiny", "actor_config.layerwise_update=true", "actor_config.recompute_num_layers=1")
    p = choose(cfg, m, available=24 * GiB)
    assert p.recompute_num_layers == 1 and p.recompute_by == "user"
    assert "actor_config.recompute_num_layers" not in p.overrides()
    cfg, m = load("tiny", "actor_config.layerwise_update=true", "rl_config.memory=speed")  # speed: the fastest
    p = choose(cfg, m, available=24 * GiB)
    assert p.recompute_num_layers is None and p.recompute_by == "speed"
    cfg, m = load("tiny", "actor_config.layerwise_update=true", "rl_config.memory=speed", "actor_config.lora_rank=4")
    p = choose(cfg, m, available=24 * GiB)
    assert p.recompute_num_layers == 0 and p.overrides()["actor_config.recompute_num_layers"] == 0


def test_a_saver_that_cannot_act_is_left_unset_so_the_config_stays_valid():
    """beta = 0: no reference, so ref_config.layerwise stays null (INERT_UNLESS refuses any other value);
    tensor parallelism: no layerwise update or rollout. `low` turns on what can act and the config still loads."""
    cfg, m = load("tiny", "rl_config.memory=low")
    p = choose(cfg, m, available=24 * GiB)
    assert switches(p) == {"layerwise_update": True, "reference_layerwise": False, "generate_layerwise": True,
                           "release_graphs": True}
    resolved = apply(cfg, p.overrides())
    assert resolved.ref_config.layerwise is None and resolved.generate_config.layerwise is True
    with pytest.raises(ConfigError, match="ref_config"):
        apply(cfg, {"ref_config.layerwise": True})


def test_auto_leaves_the_savers_off_where_the_plan_has_no_figures_for_them():
    """Ascend (the savers were measured on the CPU runtime; planned on the device ledger) and several processes."""
    cfg, m = load("qwen2_5_0_5b")
    p = choose(cfg, m, "Ascend", available=64 * GiB)
    assert switches(p) == OFF and "CPU runtime only" in p.note and "swap parks up to" in p.note
    assert p.peak == plan(cfg, m).peak(True)  # the device ledger with swap (rl_config.swap is on)
    p = choose(cfg, m, "CPU", one_device=False, available=64 * GiB)
    assert switches(p) == OFF and "several processes" in p.note


def test_memory_budget_is_read_with_auto_only():
    with pytest.raises(ConfigError, match="memory_budget_gb"):
        load_config(GRPOConfig, overrides=["rl_config.memory=speed", "rl_config.memory_budget_gb=24"])
    with pytest.raises(ConfigError, match="memory_budget_gb"):
        load_config(GRPOConfig, overrides=["rl_config.memory_budget_gb=0"])


def test_the_host_memory_is_what_meminfo_says_plus_this_process():
    with open("/proc/meminfo") as f:
        meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    assert meminfo["MemAvailable"] < host_available() < meminfo["MemTotal"] + meminfo.get("SwapTotal", 0)


def test_the_builder_hands_the_policy_to_the_engine_the_updater_and_the_scorer(tmp_path):
    """rl_config.memory=low on the micro model with a reference: every saver reaches its part."""
    from mindgrpo.grpo import builder
    from mindgrpo.utils.progress import Progress

    class NoLog:
        def log(self, *a, **k):
            pass

    micro = os.path.join(REPO, "tests", "grpo", "micro_qwen2.yaml")
    cfg = load_config(GRPOConfig, overrides=[f"actor_config.model={micro}", "rl_config.memory=low",
                                              "rl_config.beta=0.05", "generate_config.max_tokens=8", "generate_config.max_prompt_length=128",
                                              "synthetic_config.template=raw", "rl_config.batch_size=2",
                                              "rl_config.num_generations=4", "actor_config.micro_batch_size=4"])
    parts = builder.build(cfg, builder.Paths(output_dir=str(tmp_path)))
    assert switches(parts.memory_policy) == {k: True for k in SAVERS}
    trainer = builder.make_trainer(cfg, parts, NoLog(), Progress(1), str(tmp_path))
    assert trainer.memory_policy is parts.memory_policy
    assert parts.engine.layerwise and trainer.updater.layerwise and trainer.ref_scorer.layerwise

    class Part:
        released = 0

        def release(self):
            self.released += 1

    part = Part()
    trainer.release(part)  # a phase's graphs dropped when it ends: release_graphs from the policy
    assert part.released == 1


def test_the_restart_bound_is_read_only_where_graphs_can_be_released():
    for off in (["rl_config.release_graphs=false"], ["rl_config.memory=speed"]):
        with pytest.raises(ConfigError, match="restart_on_memory_growth"):
            load_config(GRPOConfig, overrides=off + ["rl_config.restart_on_memory_growth=0.05"])
    load_config(GRPOConfig, overrides=["rl_config.restart_on_memory_growth=0.05"])  # auto may release them
