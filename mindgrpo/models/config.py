"""The Qwen2 / Qwen2.5 / Qwen3 (dense) model config: the frozen dataclass with every default, and
its readers and writers (HF `config.json`, our model YAML). No MindSpore here: the layouts, the
memory planner and the weight converter size things from it without building a model.

Qwen3 is Qwen2 with two switches and a field: RMSNorm over d on every query and key head before
RoPE (`qk_norm`), no q/k/v bias (`attention_bias`), and `head_dim` set on its own (not H / nh).
`model_type` picks the switches' defaults (`MODEL_TYPES`); a config may set them explicitly.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Optional

import yaml

from mindgrpo.models.precision import COMPUTE_DTYPES  # `compute_dtype` names (models/qwen2.py maps them)

# model_type -> the defaults of its architecture switches (a config may override either)
MODEL_TYPES = {
    "qwen2": {"qk_norm": False, "attention_bias": True},
    "qwen3": {"qk_norm": True, "attention_bias": False},
}
# head_dim of an HF config.json without the key, as transformers' config classes take it (Qwen3Config: 128,
# whatever hidden_size / num_attention_heads is; Qwen2Config has no head_dim: hidden_size / num_attention_heads)
HF_HEAD_DIM = {"qwen3": 128}


@dataclass(frozen=True)
class Qwen2Config:
    model_type: str = "qwen2"  # a key of MODEL_TYPES
    vocab_size: int = 151936
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int = 4
    head_dim: Optional[int] = None  # hidden_size // num_attention_heads when None
    qk_norm: Optional[bool] = None  # RMSNorm over d on each q and k head before RoPE; None: model_type's
    attention_bias: Optional[bool] = None  # q/k/v projection biases; None: model_type's
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    compute_dtype: str = "float32"  # "bfloat16" on Ascend: fp32 master weights, bf16 matmuls
    param_init_std: float = 0.02

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {sorted(MODEL_TYPES)}, got {self.model_type!r}")
        for key, default in MODEL_TYPES[self.model_type].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, default)  # frozen: resolved once, here
            elif not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.model_type == "qwen3" and self.attention_bias:
            raise ValueError("attention_bias: true is not supported for qwen3 (HF's Qwen3 then also biases "
                             "o_proj, which this model does not hold)")
        if self.head_dim is not None and (not isinstance(self.head_dim, int) or self.head_dim <= 0
                                          or self.head_dim % 2):
            raise ValueError(f"head_dim must be a positive even integer (RoPE rotates halves), got {self.head_dim!r}")
        for key in ("rms_norm_eps", "rope_theta", "param_init_std"):
            if not math.isfinite(getattr(self, key)):
                raise ValueError(f"{key} must be a finite number, got {getattr(self, key)}")
        if self.hidden_size % self.num_attention_heads and self.head_dim is None:
            raise ValueError("hidden_size must be divisible by num_attention_heads (or set head_dim)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, got {self.compute_dtype!r}")

    @property
    def d(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    # HF config.json keys we read; everything else in an HF config (architectures, torch_dtype,
    # sliding-window switches that Qwen2/Qwen3 do not use, ...) is ignored on purpose.
    HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
               "rope_theta", "max_position_embeddings", "tie_word_embeddings")

    @classmethod
    def from_hf_dict(cls, d: dict, **overrides) -> "Qwen2Config":
        model_type = d.get("model_type", "qwen2")
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type is {model_type!r}, expected one of {sorted(MODEL_TYPES)}")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"HF config is missing {', '.join(missing)}")
        kw = {k: d[k] for k in cls.HF_KEYS if k in d and d[k] is not None}
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}  # newer transformers nest it
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"rope scaling {rope} is not supported (only the default RoPE)")
        if "rope_theta" in rope:
            kw["rope_theta"] = rope["rope_theta"]
        kw.setdefault("num_key_value_heads", d["num_attention_heads"])
        if "head_dim" not in d and model_type in HF_HEAD_DIM:
            kw["head_dim"] = HF_HEAD_DIM[model_type]
        kw["model_type"] = model_type
        kw.update({k: d[k] for k in MODEL_TYPES[model_type] if d.get(k) is not None})
        kw.update(overrides)
        return cls(**kw)

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> "Qwen2Config":
        """Our own YAML/JSON format: exactly the dataclass fields; unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{source}: unknown model config key(s) {unknown}; valid: {sorted(names)}")
        return cls(**d)

    @classmethod
    def load(cls, path: str, **overrides) -> "Qwen2Config":
        """Read an HF `config.json` (a .json with `model_type`, or any file with `architectures`) or
        our model YAML (which may name its `model_type` too)."""
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path) as f:
            d = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a mapping")
        if "architectures" in d or (path.endswith(".json") and "model_type" in d):
            return cls.from_hf_dict(d, **overrides)
        d = d.get("model", d)
        return cls.from_dict({**d, **overrides}, source=path)

    def to_hf_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.HF_KEYS}
        d["head_dim"] = self.d
        arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.model_type]
        d.update(model_type=self.model_type, architectures=[arch], hidden_act="silu",
                 torch_dtype="float32", use_sliding_window=False, attention_dropout=0.0)
        if self.model_type == "qwen3":
            d["attention_bias"] = False  # HF's Qwen3 key (there it would also bias o_proj)
        for key, default in MODEL_TYPES[self.model_type].items():
            if getattr(self, key) != default:  # a switch set against model_type's default
                d[key] = getattr(self, key)
        return d

    def num_params(self) -> int:
        h, i, v, d = self.hidden_size, self.intermediate_size, self.vocab_size, self.d
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
        layer += (q + 2 * kv) * self.attention_bias + 2 * d * self.qk_norm
        return v * h * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + h
