"""MindSpore checkpoints of Qwen2 weights, and building a model from an HF directory or a checkpoint."""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import numpy as np
import mindspore as ms

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import (WeightError, atomic_path, bf16_to_f32, check_state, f32_to_bf16,
                                     head_of, load_hf_model_state, REWARD_HEADS)
from mindgrpo.models.qwen2 import Qwen2ForCausalLM


def save_ms_checkpoint(state: Dict[str, Tuple[str, np.ndarray]], path: str) -> None:
    """state: name -> ("F32" | "BF16" | ..., array; BF16 as uint16 bits). Atomic."""
    items = []
    for name in sorted(state):
        dtype, arr = state[name]
        if dtype == "BF16":
            t = ms.Tensor(bf16_to_f32(arr)).astype(ms.bfloat16)  # exact: bf16 values fit in fp32
        else:
            t = ms.Tensor(np.ascontiguousarray(arr))
        items.append({"name": name, "data": t})
    with atomic_path(path) as tmp:
        os.remove(tmp)  # save_checkpoint appends .ckpt to names without it
        ms.save_checkpoint(items, tmp + ".ckpt")
        os.replace(tmp + ".ckpt", tmp)


def read_ms_checkpoint(path: str) -> Dict[str, Tuple[str, np.ndarray]]:
    """name -> (dtype string, array); bf16 tensors come back as their exact uint16 bits."""
    if not os.path.isfile(path):
        raise WeightError(f"{path}: no such checkpoint file")
    try:
        params = ms.load_checkpoint(path)
    except Exception as e:  # MindSpore raises ValueError/RuntimeError with long texts
        raise WeightError(f"{path}: cannot read MindSpore checkpoint ({str(e).splitlines()[0]})") from None
    out = {}
    for name, p in params.items():
        if p.dtype == ms.bfloat16:
            out[name] = ("BF16", f32_to_bf16(p.astype(ms.float32).asnumpy()))
        elif p.dtype == ms.float16:
            out[name] = ("F16", p.asnumpy())
        else:
            out[name] = ("F32", p.asnumpy().astype(np.float32, copy=False))
    return out


def load_state(lm: Qwen2ForCausalLM, state: Dict[str, np.ndarray]) -> None:
    """Copy checked fp32 arrays (MindSpore names) into the model's parameters. WeightError naming the parameter on
    a name the model does not have or a shape other than its own (set_data would take another shape silently),
    checked for every name before any is copied: the model is left as it was."""
    params = dict(lm.parameters_and_names())
    for name, arr in state.items():
        p = params.get(name)
        if p is None:
            raise WeightError(f"{name}: no such parameter in the model")
        if tuple(arr.shape) != tuple(p.shape):
            raise WeightError(f"{name}: shape {tuple(arr.shape)} where the model's parameter is {tuple(p.shape)}")
    for name, arr in state.items():
        p = params[name]
        p.set_data(ms.Tensor(np.ascontiguousarray(arr, np.float32)).astype(p.dtype))


def model_state(lm: Qwen2ForCausalLM) -> Dict[str, np.ndarray]:
    """The model's weights as fp32 numpy arrays, MindSpore names."""
    return {name: p.astype(ms.float32).asnumpy() if p.dtype != ms.float32 else p.asnumpy()
            for name, p in lm.parameters_and_names()}


def require_weights(path: str) -> None:
    """Raise WeightError when the weights path (an HF directory, a .ckpt, a folder of shards) does not exist."""
    if not os.path.exists(path):
        raise WeightError(f"{path}: no such file or folder (the weights path does not exist)")


def find_config(path: str) -> str:
    """The config beside a model: PATH/config.json for a directory, else config.json or
    config.yaml next to the checkpoint file."""
    require_weights(path)
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for name in ("config.json", "config.yaml", "model.yaml"):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    raise WeightError(f"{path}: no config.json or config.yaml beside the weights; pass a config")


def read_model_state(path: str, cfg: Qwen2Config, head: str = "lm_head") -> Dict[str, np.ndarray]:
    """Checked fp32 weights (MindSpore names) from an HF directory or a MindSpore .ckpt (or a
    directory holding one); head "score" for a reward model, whichever of `convert.REWARD_HEADS` the
    weights hold (`convert.head_of` of the returned names tells which)."""
    require_weights(path)
    if os.path.isdir(path) and not any(f.endswith(".ckpt") for f in os.listdir(path)):
        return load_hf_model_state(path, cfg, head)
    ckpt = path
    if os.path.isdir(path):
        ckpts = sorted(f for f in os.listdir(path) if f.endswith(".ckpt"))
        if len(ckpts) != 1:
            raise WeightError(f"{path}: expected one .ckpt file, found {ckpts}")
        ckpt = os.path.join(path, ckpts[0])
    raw = read_ms_checkpoint(ckpt)
    if head in REWARD_HEADS and head_of(raw) in REWARD_HEADS:
        head = head_of(raw)
    return check_state({k: (bf16_to_f32(a) if d == "BF16" else a) for k, (d, a) in raw.items()}, cfg, ckpt, head)


def load_model(path: str, config: Optional[str] = None, seed: int = 0, **overrides) -> Qwen2ForCausalLM:
    """Build a model from an HF directory (config.json + safetensors) or a MindSpore .ckpt with
    a config beside it (or given)."""
    cfg = Qwen2Config.load(config or find_config(path), **overrides)
    state = read_model_state(path, cfg)
    lm = Qwen2ForCausalLM(cfg, seed=seed)
    load_state(lm, state)
    return lm
