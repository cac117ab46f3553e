"""Configs: frozen dataclasses holding every default, overridden by YAML, then by dotted CLI keys."""

from mindgrpo.config.grpo import (
    ActorConfig,
    CosineRewardConfig,
    GenerateConfig,
    GRPOConfig,
    ParallelConfig,
    RefConfig,
    RewardConfig,
    RLConfig,
    SFTConfig,
    SoftOverlongConfig,
    SyntheticConfig,
)
from mindgrpo.config.loader import (
    ConfigError,
    check,
    from_dict,
    load_config,
    load_yaml,
    parse_overrides,
    to_dict,
    to_yaml,
)

__all__ = [
    "ActorConfig", "ConfigError", "CosineRewardConfig", "GRPOConfig", "GenerateConfig", "ParallelConfig",
    "RLConfig", "RefConfig", "RewardConfig", "SFTConfig", "SoftOverlongConfig", "SyntheticConfig",
    "check", "from_dict", "load_config", "load_yaml", "parse_overrides", "to_dict", "to_yaml",
]
