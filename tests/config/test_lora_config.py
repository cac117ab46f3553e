"""actor_config's LoRA keys: read with lora_rank > 0, refused naming the key otherwise or where they cannot act."""

import pytest

from mindgrpo.config import ConfigError, GRPOConfig, load_config
from mindgrpo.models.lora_targets import ALL_LINEAR


def test_lora_keys_load_and_accept_peft_and_short_names():
    cfg = load_config(GRPOConfig, overrides=["actor_config.lora_rank=8", "actor_config.lora_alpha=32",
                                             "actor_config.lora_target_modules=[q_proj, v, down_proj]"])
    a = cfg.actor_config
    assert (a.lora_rank, a.lora_alpha, a.lora_dropout, a.lora_target_modules) == (8, 32.0, 0.0, ("q_proj", "v", "down_proj"))
    assert GRPOConfig().actor_config.lora_rank == 0 and GRPOConfig().actor_config.lora_target_modules == ALL_LINEAR


@pytest.mark.parametrize("overrides, key, expected", [
    (["actor_config.lora_alpha=8"], "actor_config.lora_alpha", "no effect with actor_config.lora_rank = 0"),
    (["actor_config.lora_target_modules=[q_proj]"], "actor_config.lora_target_modules", "lora_rank = 0"),
    (["actor_config.lora_rank=-1"], "actor_config.lora_rank", "must be >= 0"),
    (["actor_config.lora_rank=8", "actor_config.lora_target_modules=[q_proj, embed_tokens]"],
     "actor_config.lora_target_modules", "'embed_tokens' is not a module of Qwen2/Qwen3's decoder layers"),
    (["actor_config.lora_rank=8", "actor_config.lora_dropout=-0.1"], "actor_config.lora_dropout", "must be in [0, 1)"),
    (["actor_config.lora_rank=8", "actor_config.lora_dropout=1.0"], "actor_config.lora_dropout", "must be in [0, 1)"),
    (["actor_config.lora_rank=8", "actor_config.lora_alpha=0"], "actor_config.lora_alpha", "must be > 0"),
    (["actor_config.lora_rank=8", "actor_config.parallel_config.data_parallel=2",
      "actor_config.parallel_config.optimizer_shard=true", "generate_config.parallel_config.data_parallel=2"],
     "actor_config.lora_rank", "optimizer_shard"),
    # with LoRA the reference is the policy with its adapters off: no reference model to load or lay out
    (["actor_config.lora_rank=8", "rl_config.beta=0.04", "ref_config.load_checkpoint=/models/ref"],
     "ref_config.load_checkpoint", "actor_config.lora_rank > 0"),
    (["actor_config.lora_rank=8", "rl_config.beta=0.04", "rl_config.ref_model_sync_steps=10"],
     "rl_config.ref_model_sync_steps", "actor_config.lora_rank > 0"),
    (["actor_config.lora_rank=8", "rl_config.beta=0.04", "actor_config.parallel_config.model_parallel=2",
      "generate_config.parallel_config.data_parallel=2", "ref_config.parallel_config.model_parallel=2"],
     "ref_config.parallel_config.model_parallel", "actor_config.lora_rank > 0"),
])
def test_lora_refusals_name_the_key(overrides, key, expected):
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=overrides)
    assert info.value.key == key and expected in info.value.message, str(info.value)


def test_lora_takes_the_layer_graphs():
    """The layer-at-a-time graphs (update, reference, rollout) run the adapters too (`grpo/layerwise.py`)."""
    cfg = load_config(GRPOConfig, overrides=["actor_config.lora_rank=8", "rl_config.beta=0.04",
                                             "actor_config.layerwise_update=true", "generate_config.layerwise=true",
                                             "ref_config.layerwise=true"])
    assert cfg.actor_config.layerwise_update and cfg.generate_config.layerwise and cfg.ref_config.layerwise


def test_lora_loads_under_msrun_layouts():
    """Training tp2 or pp2 with inference dp2 (the layouts of tests/parallel/test_lora_msrun.py), and data
    parallelism."""
    for overrides in (["actor_config.parallel_config.model_parallel=2", "generate_config.parallel_config.data_parallel=2"],
                      ["actor_config.parallel_config.pipeline_stage=2", "generate_config.parallel_config.data_parallel=2"],
                      ["actor_config.parallel_config.data_parallel=2", "generate_config.parallel_config.model_parallel=2"]):
        cfg = load_config(GRPOConfig, overrides=["actor_config.lora_rank=8", "rl_config.beta=0.04", *overrides])
        assert cfg.actor_config.lora_rank == 8 and cfg.actor_config.parallel_config.world_size == 2
