"""LoRA's target modules and its settings, without MindSpore (the config checks them): PEFT's module
names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; q, k, v, o, gate, up, down and
"all-linear" accepted) and where each sits in our model (`models/lora.py` adds the adapters)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes

# PEFT's module name -> (the block's attribute, the projection's attribute), in PEFT's order of a layer
TARGETS = {
    "q_proj": ("attention", "wq"), "k_proj": ("attention", "wk"), "v_proj": ("attention", "wv"),
    "o_proj": ("attention", "wo"), "gate_proj": ("feed_forward", "w1"), "up_proj": ("feed_forward", "w3"),
    "down_proj": ("feed_forward", "w2"),
}
ALL_LINEAR = tuple(TARGETS)
SHORT = {name.split("_")[0]: name for name in TARGETS}  # "q" -> "q_proj", "gate" -> "gate_proj", ...
HF_BLOCK = {"attention": "self_attn", "feed_forward": "mlp"}  # our block -> HF's (the PEFT names' path)


def target_modules(names: Sequence[str], key: str = "lora_target_modules") -> Tuple[str, ...]:
    """User target names -> PEFT's module names in PEFT's order; an unknown one fails naming `key`."""
    if isinstance(names, str):
        names = [names]
    out = set()
    for name in names:
        if name == "all-linear":
            out.update(ALL_LINEAR)
        elif name in TARGETS or name in SHORT:
            out.add(SHORT.get(name, name))
        else:
            raise ValueError(f"{key}: {name!r} is not a module of Qwen2/Qwen3's decoder layers; valid: "
                             f"{', '.join(ALL_LINEAR)} (or {', '.join(SHORT)}, all-linear)")
    if not out:
        raise ValueError(f"{key}: empty; name at least one of {', '.join(ALL_LINEAR)}")
    return tuple(t for t in ALL_LINEAR if t in out)


@dataclass(frozen=True)
class LoraSpec:
    """rank r, alpha, dropout (PEFT's lora_dropout p in [0, 1): `models/lora_dropout.py`), targets (PEFT's names),
    rslora: s = alpha / sqrt(r) (PEFT's use_rslora) instead of alpha / r."""

    rank: int
    alpha: float
    targets: Tuple[str, ...] = ALL_LINEAR
    dropout: float = 0.0
    rslora: bool = False

    def __post_init__(self):
        if self.rank <= 0:
            raise ValueError(f"lora_rank must be > 0, got {self.rank}")
        object.__setattr__(self, "targets", target_modules(self.targets))

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def full_adapter_shapes(cfg: Qwen2Config, rank: int, targets: Sequence[str]) -> Dict[str, Tuple[int, int]]:
    """Our name -> the whole shape of every A (r, in) and B (out, r) of a model of `cfg` with adapters of `rank` on
    `targets`, in layer order then PEFT's (`models.lora.adapter_shapes` of such a model, without building it)."""
    shapes = expected_shapes(cfg)
    out = {}
    for i in range(cfg.num_hidden_layers):
        for t in target_modules(targets):
            block, attr = TARGETS[t]
            path = f"model.layers.{i}.{block}.{attr}"
            rows, cols = shapes[path + ".weight"]
            out[path + ".lora_a"], out[path + ".lora_b"] = (rank, cols), (rows, rank)
    return out
