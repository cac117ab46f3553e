"""Configs: frozen dataclasses holding every default, overridden by YAML, then by dotted CLI keys."""

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.config.loader import (
    ConfigError,
    check,
    config_data,
    data_value,
    from_dict,
    load_config,
    load_yaml,
    parse_overrides,
    to_dict,
    to_yaml,
)
from mindgrpo.config.sections import (
    ActorConfig,
    CosineRewardConfig,
    GenerateConfig,
    JudgeConfig,
    ParallelConfig,
    RefConfig,
    RewardConfig,
    RewardModelConfig,
    RLConfig,
    SFTConfig,
    SoftOverlongConfig,
    SyntheticConfig,
)

__all__ = [
    "ActorConfig", "ConfigError", "CosineRewardConfig", "GRPOConfig", "GenerateConfig", "JudgeConfig", "ParallelConfig",
    "RLConfig", "RefConfig", "RewardConfig", "RewardModelConfig", "SFTConfig", "SoftOverlongConfig", "SyntheticConfig",
    "check", "config_data", "data_value", "from_dict", "load_config", "load_yaml", "parse_overrides", "to_dict",
    "to_yaml",
]
