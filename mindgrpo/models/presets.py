"""Model size presets: the YAML files under model_configs/, found by name."""

from __future__ import annotations

import os

from mindgrpo.models.config import Qwen2Config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_CONFIG_DIR = os.path.join(REPO, "model_configs")


def resolve_model_config(name: str) -> str:
    """A path to a model config file, or a preset name under model_configs/ (tiny_qwen2, ...)."""
    if os.path.exists(name):
        return name
    for candidate in (os.path.join(MODEL_CONFIG_DIR, name + ".yaml"), os.path.join(MODEL_CONFIG_DIR, name)):
        if os.path.exists(candidate):
            return candidate
    presets = sorted(f[:-5] for f in os.listdir(MODEL_CONFIG_DIR) if f.endswith(".yaml")) \
        if os.path.isdir(MODEL_CONFIG_DIR) else []
    raise FileNotFoundError(f"actor_config.model: {name!r} is neither a file nor a preset; presets: {presets}")


def preset_config(name: str, **overrides):
    """The Qwen2Config of a preset name or a config file (overrides: e.g. compute_dtype)."""
    return Qwen2Config.load(resolve_model_config(name), **overrides)
