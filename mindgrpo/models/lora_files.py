"""LoRA adapters in PEFT's files, in and out: a folder with

    adapter_config.json          PEFT's LoraConfig (peft_type LORA, r, lora_alpha, target_modules, ...)
    adapter_model.safetensors    base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight (r, in),
                                 ... .lora_B.weight (out, r); fp32 (or a PEFT-written bf16 / fp16)

which `peft.PeftModel.from_pretrained(hf_base, folder)` loads, and vLLM serves; and any such folder
written by PEFT (plain LoRA on the decoder's projections) loads into ours. Name table: ours
`model.layers.<i>.attention.wq.lora_a` <-> PEFT's `base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Dict, Optional, Tuple

import numpy as np

from mindgrpo.models.convert import WeightError, read_safetensors, to_float32, write_safetensors
from mindgrpo.models.lora_targets import HF_BLOCK, TARGETS, LoraSpec, target_modules

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # PeftModelForCausalLM's prefix over the HF model's names
_OURS = {(HF_BLOCK[block], t): (block, attr) for t, (block, attr) in TARGETS.items()}  # (self_attn, q_proj) -> ...
_PEFT = {v: k for k, v in _OURS.items()}
_MATRIX = {"lora_a": "lora_A", "lora_b": "lora_B"}


def peft_name(ours: str) -> str:
    """`model.layers.3.attention.wq.lora_a` -> `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`."""
    _, _, i, block, attr, matrix = ours.split(".")
    hf_block, target = _PEFT[(block, attr)]
    return f"{PREFIX}model.layers.{i}.{hf_block}.{target}.{_MATRIX[matrix]}.weight"


def our_name(peft: str, source: str) -> str:
    """The inverse of `peft_name`; a name outside its table fails naming the file."""
    parts = peft[len(PREFIX):].split(".") if peft.startswith(PREFIX) else []
    ok = len(parts) == 7 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and parts[6] == "weight" \
        and (parts[3], parts[4]) in _OURS and parts[5] in ("lora_A", "lora_B")
    if not ok:
        raise WeightError(f"{source}: {peft!r} is not a LoRA matrix of a decoder projection (PEFT names "
                          f"{PREFIX}model.layers.<i>.self_attn.q_proj.lora_A.weight and the like)")
    block, attr = _OURS[(parts[3], parts[4])]
    return f"model.layers.{parts[2]}.{block}.{attr}.{'lora_a' if parts[5] == 'lora_A' else 'lora_b'}"


def adapter_config(spec: LoraSpec, base_model: Optional[str]) -> dict:
    """PEFT's LoraConfig fields for `spec` (the ones PEFT writes; from_pretrained reads them)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout,
            "target_modules": list(spec.targets), "use_rslora": spec.rslora, "use_dora": False,
            "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
            "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
            "rank_pattern": {}, "alpha_pattern": {}, "revision": None}


def write_adapter(folder: str, spec: LoraSpec, state: Dict[str, np.ndarray], base_model: Optional[str] = None) -> str:
    """The adapter (our names -> fp32 arrays) as PEFT's folder; whole or not at all (a temporary folder
    renamed into place; an existing folder is replaced)."""
    folder = os.path.abspath(folder)
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(folder) + ".", dir=parent)
    try:
        write_safetensors(os.path.join(tmp, WEIGHTS_FILE),
                          {peft_name(n): ("F32", np.ascontiguousarray(a, np.float32)) for n, a in state.items()},
                          metadata={"format": "pt"})
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            json.dump(adapter_config(spec, base_model), f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(folder):
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


# PEFT fields that change what the adapter computes and that we do not do: (field, its plain value)
_UNSUPPORTED = (("use_dora", False), ("fan_in_fan_out", False), ("modules_to_save", None),
                ("layers_to_transform", None), ("rank_pattern", {}), ("alpha_pattern", {}), ("bias", "none"))


def read_adapter(folder: str) -> Tuple[LoraSpec, Dict[str, np.ndarray]]:
    """(spec, our name -> fp32 array) of a PEFT adapter folder; anything it cannot hold exactly fails naming
    the file and the field."""
    cfg_path, w_path = os.path.join(folder, CONFIG_FILE), os.path.join(folder, WEIGHTS_FILE)
    for path in (cfg_path, w_path):
        if not os.path.isfile(path):
            raise WeightError(f"{path}: no such file (a PEFT adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise WeightError(f"{cfg_path}: not JSON ({e})") from None
    if cfg.get("peft_type") != "LORA":
        raise WeightError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r}; only LORA adapters load")
    for key, plain in _UNSUPPORTED:
        if cfg.get(key, plain) not in (plain, None if plain == {} else plain):
            raise WeightError(f"{cfg_path}: {key} = {cfg[key]!r} is not supported (only {plain!r})")
    targets = cfg.get("target_modules")
    if not isinstance(targets, (list, str)):
        raise WeightError(f"{cfg_path}: target_modules {targets!r}: a list of module names is needed")
    try:
        spec = LoraSpec(rank=int(cfg["r"]), alpha=float(cfg["lora_alpha"]),
                        targets=target_modules(targets, f"{cfg_path}: target_modules"),
                        rslora=bool(cfg.get("use_rslora", False)))
    except (KeyError, ValueError) as e:
        raise WeightError(f"{cfg_path}: {e}") from None
    state = {our_name(name, w_path): to_float32(item) for name, item in read_safetensors(w_path).items()}
    return spec, state
