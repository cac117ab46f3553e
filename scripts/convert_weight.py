"""Convert Qwen2/Qwen2.5 weights between Hugging Face safetensors and a MindSpore checkpoint.

HF -> MindSpore:
    python scripts/convert_weight.py --torch_ckpt_dir HF_DIR --mindspore_ckpt_path OUT.ckpt [--dtype fp32|bf16]
MindSpore -> HF (safetensors + config.json):
    python scripts/convert_weight.py --reverse --mindspore_ckpt_path IN.ckpt --torch_ckpt_dir OUT_DIR \
        [--config CONFIG] [--dtype fp32|bf16]

The name map is `mindgrpo/models/convert.py:NAME_TABLE`. Every tensor is checked against the
model config (names and shapes) before anything is written; outputs are written under a
temporary name and renamed when complete. With no --dtype the source dtype is kept, so a round
trip is bit-exact. The HF config.json is copied beside the MindSpore checkpoint so the
checkpoint loads on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from mindgrpo.models.checkpoint import read_ms_checkpoint, save_ms_checkpoint
from mindgrpo.models.convert import (WeightError, atomic_path, bf16_to_f32, check_state, f32_to_bf16,
                                     hf_to_ms_state, ms_to_hf_name, read_hf_state, write_safetensors)
from mindgrpo.models.qwen2 import Qwen2Config

DTYPES = {"fp32": "F32", "bf16": "BF16", None: None}


def cast(item, target):
    dtype, arr = item
    if target is None or target == dtype:
        return item
    f32 = bf16_to_f32(arr) if dtype == "BF16" else arr.astype("float32")
    return (target, f32_to_bf16(f32) if target == "BF16" else f32)


def hf_to_ms(hf_dir: str, out: str, dtype) -> dict:
    cfg_path = os.path.join(hf_dir, "config.json")
    if not os.path.exists(cfg_path):
        raise WeightError(f"{hf_dir}: no config.json")
    cfg = Qwen2Config.load(cfg_path)
    state = hf_to_ms_state(read_hf_state(hf_dir), hf_dir)
    check_state({k: a for k, (_, a) in state.items()}, cfg, hf_dir)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {k: cast(v, dtype) for k, v in state.items()}
    save_ms_checkpoint(state, out)
    with atomic_path(os.path.join(os.path.dirname(os.path.abspath(out)), "config.json")) as tmp:
        shutil.copyfile(cfg_path, tmp)
    return state


def ms_to_hf(ckpt: str, out_dir: str, config: str, dtype) -> dict:
    cfg = Qwen2Config.load(config)
    state = read_ms_checkpoint(ckpt)
    check_state({k: a for k, (_, a) in state.items()}, cfg, ckpt)
    tensors = {ms_to_hf_name(k): cast(v, dtype) for k, v in state.items()}
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
    hf_cfg = cfg.to_hf_dict()
    if config.endswith(".json"):  # keep the user's HF config as it is
        with open(config) as f:
            hf_cfg = json.load(f)
    with atomic_path(os.path.join(out_dir, "config.json")) as tmp:
        with open(tmp, "w") as f:
            json.dump(hf_cfg, f, indent=2)
    return tensors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch_ckpt_dir", required=True, help="HF model directory (input, or output with --reverse)")
    ap.add_argument("--mindspore_ckpt_path", required=True, help="MindSpore .ckpt (output, or input with --reverse)")
    ap.add_argument("--reverse", action="store_true", help="MindSpore -> HF")
    ap.add_argument("--config", help="model config for --reverse (default: config.json/yaml beside the .ckpt)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="output dtype (default: keep)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.reverse:
            from mindgrpo.models.checkpoint import find_config
            config = args.config or find_config(args.mindspore_ckpt_path)
            out = ms_to_hf(args.mindspore_ckpt_path, args.torch_ckpt_dir, config, DTYPES[args.dtype])
            dest = args.torch_ckpt_dir
        else:
            out = hf_to_ms(args.torch_ckpt_dir, args.mindspore_ckpt_path, DTYPES[args.dtype])
            dest = args.mindspore_ckpt_path
    except (WeightError, ValueError, OSError) as e:
        print(f"convert_weight: error: {e}", file=sys.stderr)
        return 1
    n_bytes = sum(a.nbytes for _, a in out.values())
    print(f"converted {len(out)} tensors, {n_bytes / 1e6:.1f} MB -> {dest} in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
