"""LoRA adapters on a Qwen2ForCausalLM, as PEFT makes them (Hu et al. 2021):

    y = x W^T (+ b) + s (x A^T) B^T,   A (r, in), B (out, r), s = alpha / r  (alpha / sqrt(r) with rsLoRA)

on the decoder's projections named by `targets` (PEFT's module names: q_proj, k_proj, v_proj,
o_proj, gate_proj, up_proj, down_proj; q, k, v, o, gate, up, down and "all-linear" accepted).
A starts Kaiming-uniform with a = sqrt(5) (bound 1 / sqrt(in), PEFT's default), B at zeros, so a
new adapter leaves the model as it was. Only the adapters train (`add_adapters` freezes the rest).

The adapter itself lives in `models/qwen2.Linear` (its parameters `<layer>.lora_a`, `<layer>.lora_b`
and the untrained `<layer>.lora_scaling`); this module adds them, switches them off (`adapters_off`:
the reference as the base model) and moves their values in and out as numpy. PEFT's files:
`mindgrpo/models/lora_files.py`; lora_dropout in the training graphs: `mindgrpo/models/lora_dropout.py`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor

from mindgrpo.models.lora_files import read_adapter
from mindgrpo.models.lora_targets import (ALL_LINEAR, HF_BLOCK, SHORT, TARGETS, LoraSpec, full_adapter_shapes,
                                          target_modules)
from mindgrpo.models.qwen2 import Linear, Qwen2ForCausalLM

__all__ = ["ALL_LINEAR", "HF_BLOCK", "SHORT", "TARGETS", "LoraSpec", "target_modules", "ADAPTER_SUFFIXES",
           "projections", "add_adapters", "adapter_shapes", "lora_spec", "adapter_parameters", "adapter_names", "adapters_off", "base_trains",
           "adapter_state", "load_adapter_state", "merge_state", "load_adapter"]
ADAPTER_SUFFIXES = (".lora_a", ".lora_b")

def projections(lm: Qwen2ForCausalLM, targets: Sequence[str]) -> Iterator[Tuple[str, str, Linear]]:
    """(our path `model.layers.<i>.attention.wq`, PEFT's path `model.layers.<i>.self_attn.q_proj`, the layer)
    of every targeted projection of the model's decoder layers, in layer order then PEFT's."""
    for i in lm.layer_ids:
        layer = lm.model.layers[i]
        for t in target_modules(targets):
            block, attr = TARGETS[t]
            yield f"model.layers.{i}.{block}.{attr}", f"model.layers.{i}.{HF_BLOCK[block]}.{t}", \
                getattr(getattr(layer, block), attr)


def add_adapters(lm: Qwen2ForCausalLM, spec: LoraSpec, seed: int = 0) -> None:
    """Adapters on every targeted projection (A Kaiming-uniform from `seed`, B zeros); every other
    parameter stops training (requires_grad False). Once per model, before any graph of it compiles.
    Every layout draws the whole model's adapters in the same order and keeps its own: a pipeline stage its
    layers', a tensor-parallel piece its piece of each, so a seed gives the one-device adapters anywhere."""
    if getattr(lm, "lora", None) is not None:
        raise ValueError("the model has adapters already")
    rng = np.random.default_rng([seed, 0x10A])  # a stream of its own: the base's draws stay as they were
    held = {path: lin for path, _, lin in projections(lm, spec.targets)}
    for name, (rank, in_f) in full_adapter_shapes(lm.config, spec.rank, spec.targets).items():
        if not name.endswith(".lora_a"):
            continue
        bound = 1.0 / math.sqrt(in_f)  # kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / 6) * sqrt(3 / fan_in)
        a = rng.uniform(-bound, bound, (rank, in_f)).astype(np.float32)  # drawn on every stage: the stream goes on
        path = name[:-len(".lora_a")]
        if path in held:
            lin = held.pop(path)
            out_f = lin.full_shape()[0]
            lin.add_adapter(path, *lin.adapter_piece(a, np.zeros((out_f, spec.rank), np.float32)), spec.scaling,
                            spec.dropout)
    if held:  # the model's projections are the config's
        raise ValueError(f"no adapter shape for {sorted(held)[0]} in the model's config")
    for p in lm.get_parameters():
        p.requires_grad = p.name.endswith(ADAPTER_SUFFIXES)
    lm.lora = spec


def adapter_shapes(lm: Qwen2ForCausalLM) -> Dict[str, Tuple[int, int]]:
    """Our name -> the whole shape of every A (r, in) and B (out, r) of the whole model, in layer order then PEFT's,
    whatever a rank holds (a pipeline stage its layers', a tensor-parallel piece its piece of each): a resharding's
    and a strategy file's full shapes, the same on every rank; empty without adapters."""
    spec = lora_spec(lm)
    return {} if spec is None else full_adapter_shapes(lm.config, spec.rank, spec.targets)


def lora_spec(lm: Qwen2ForCausalLM):
    """The model's LoraSpec, or None without adapters."""
    return getattr(lm, "lora", None)


def adapter_parameters(lm: Qwen2ForCausalLM) -> List[Parameter]:
    """Every A and B of the model, in model order (none without adapters)."""
    return [p for p in lm.get_parameters() if p.name.endswith(ADAPTER_SUFFIXES)]


def adapter_names(lm: Qwen2ForCausalLM) -> List[str]:
    return [p.name for p in adapter_parameters(lm)]


def _scalings(lm: Qwen2ForCausalLM) -> List[Parameter]:
    return [p for p in lm.get_parameters() if p.name.endswith(".lora_scaling")]


@contextmanager
def adapters_off(lm: Qwen2ForCausalLM):
    """Inside: the model computes as its base (every scaling 0: y + 0, bit for bit the base's values);
    after: the adapters' scaling again. Nothing happens to a model without adapters."""
    scalings = _scalings(lm)
    kept = [p.asnumpy().copy() for p in scalings]
    try:
        for p in scalings:
            p.set_data(Tensor(np.float32(0.0)))
        yield lm
    finally:
        for p, v in zip(scalings, kept):
            p.set_data(Tensor(v))


@contextmanager
def base_trains(lm: Qwen2ForCausalLM):
    """Inside: the base weights train and the adapters are off (the SFT warm start of a LoRA run makes its
    base); after: the adapters train again, the base not. Nothing happens to a model without adapters."""
    if lora_spec(lm) is None:
        yield lm
        return
    params = [p for p in lm.get_parameters() if ".lora_" not in p.name]
    adapters = adapter_parameters(lm)
    try:
        for p in params:
            p.requires_grad = True
        for p in adapters:
            p.requires_grad = False
        with adapters_off(lm):
            yield lm
    finally:
        for p in params:
            p.requires_grad = False
        for p in adapters:
            p.requires_grad = True


def adapter_state(lm: Qwen2ForCausalLM) -> Dict[str, np.ndarray]:
    """Our name -> fp32 array of every A and B (copies: they keep their values when the adapters train)."""
    return {p.name: p.astype(ms.float32).asnumpy() if p.dtype != ms.float32 else p.asnumpy().copy()
            for p in adapter_parameters(lm)}


def load_adapter_state(lm: Qwen2ForCausalLM, state: Dict[str, np.ndarray], source: str) -> None:
    """Set every A and B from `state` (our names); the names and shapes must be the model's exactly."""
    params = {p.name: p for p in adapter_parameters(lm)}
    missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which the model's adapters do not"
        raise ValueError(f"{source}: the adapter {what} ({len(missing)} missing, {len(extra)} unknown)")
    for name, p in params.items():
        if tuple(state[name].shape) != tuple(p.shape):
            raise ValueError(f"{source}: {name} has shape {tuple(state[name].shape)}, the model's is {tuple(p.shape)}")
    for name, p in params.items():
        p.set_data(Tensor(np.ascontiguousarray(state[name], np.float32)).astype(p.dtype))


def merge_state(base: Dict[str, np.ndarray], adapters: Dict[str, np.ndarray], scaling: float) -> Dict[str, np.ndarray]:
    """Base weights (our names, fp32) with each adapter merged: W + s B A in fp32 (PEFT's merge_and_unload)."""
    out = dict(base)
    for name in adapters:
        if name.endswith(".lora_a"):
            path = name[:-len(".lora_a")]
            delta = adapters[path + ".lora_b"].astype(np.float32) @ adapters[name].astype(np.float32)
            out[path + ".weight"] = (base[path + ".weight"].astype(np.float32) + delta * np.float32(scaling))
    return out


def load_adapter(lm: Qwen2ForCausalLM, folder: str) -> LoraSpec:
    """A PEFT adapter folder (ours or anyone's plain LoRA) onto the model: its adapters added and loaded. The
    rollout engine then generates with W + s B A (`inference/layers.py` merges them into its copies)."""
    spec, state = read_adapter(folder)
    add_adapters(lm, spec)
    load_adapter_state(lm, state, folder)
    return spec
