"""Convert Qwen2/Qwen2.5/Qwen3 weights between Hugging Face safetensors and a MindSpore checkpoint.

HF -> MindSpore:
    python scripts/convert_weight.py --torch_ckpt_dir HF_DIR --mindspore_ckpt_path OUT.ckpt [--dtype fp32|bf16]
MindSpore -> HF (safetensors + config.json):
    python scripts/convert_weight.py --reverse --mindspore_ckpt_path IN.ckpt --torch_ckpt_dir OUT_DIR \
        [--config CONFIG] [--dtype fp32|bf16]
A LoRA adapter merged into its base -> HF (W + s B A, as PEFT's merge_and_unload):
    python scripts/convert_weight.py --merge_lora ADAPTER_DIR --torch_ckpt_dir OUT_DIR [--base BASE] [--dtype ...]
  ADAPTER_DIR is a PEFT adapter folder (a LoRA checkpoint's adapter/); BASE an HF folder or a .ckpt with its
  config beside it, by default the adapter's base_model_name_or_path (our checkpoints write their base's path).

Reward models (HF's Qwen2/Qwen3ForSequenceClassification with one label: the decoder and `score.weight`,
no lm_head; or Qwen2ForRewardModel's two-layer head `score.0.*`, `score.2.*`, as Qwen2.5-Math-RM) convert the same
way, recognised by their head's tensors (`mindgrpo/models/reward_model.py`);
MindSpore -> HF from a model YAML writes the architecture `*ForSequenceClassification` and `num_labels: 1`.

The name map is `mindgrpo/models/convert.py:NAME_TABLE`. Every tensor is checked against the
model config (names and shapes) before anything is written. With no --dtype the source dtype is
kept, so a round trip is bit-exact. The HF config.json is copied beside the MindSpore checkpoint so
the checkpoint loads on its own.

An existing output is refused unless --overwrite: OUT.ckpt, or a config.json beside it that differs
from the model's; OUT_DIR holding model files (config.json, *.safetensors, their index, PyTorch
weights; `convert.is_hf_model_file`). The output is written in a folder beside it and moved into
place when complete: OUT.ckpt and its config.json each by one rename; OUT_DIR as a whole folder
swapped in (mindgrpo/utils/staging.py), so no shard or index of the model it replaces survives and
a crash leaves the old or the new model. Other files of OUT_DIR (tokenizer, README, ...) are
kept: hard-linked into the new folder before the swap. The folder of a killed conversion is
removed by the next conversion to the same output.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import sys
import time
from typing import Optional

import numpy as np

from mindgrpo.models.checkpoint import find_config, read_model_state, read_ms_checkpoint, save_ms_checkpoint
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import (WeightError, bf16_to_f32, check_state, f32_to_bf16, head_of, hf_to_ms_state,
                                     is_hf_model_file, ms_to_hf_name, read_hf_state, write_safetensors)
from mindgrpo.models.lora import merge_state
from mindgrpo.models.lora_files import CONFIG_FILE, read_adapter
from mindgrpo.utils.staging import carry_over, replace_dir, staging_dir

DTYPES = {"fp32": "F32", "bf16": "BF16", None: None}
OVERWRITE_HINT = "pass --overwrite to replace it"


def cast(item, target):
    dtype, arr = item
    if target is None or target == dtype:
        return item
    f32 = bf16_to_f32(arr) if dtype == "BF16" else arr.astype("float32")
    return (target, f32_to_bf16(f32) if target == "BF16" else f32)


def check_ckpt_output(out: str, cfg_path: str, overwrite: bool) -> None:
    """Refuse OUT.ckpt, or a config.json beside it that is not the model's, unless overwrite."""
    if os.path.isdir(out):
        raise WeightError(f"{out}: is a folder; --mindspore_ckpt_path names the .ckpt file to write")
    beside = os.path.join(os.path.dirname(os.path.abspath(out)), "config.json")
    if overwrite:
        return
    if os.path.lexists(out):
        raise FileExistsError(f"{out} already exists ({OVERWRITE_HINT})")
    if os.path.exists(beside) and not filecmp.cmp(beside, cfg_path, shallow=False):
        raise FileExistsError(f"{beside} already exists and describes another model ({OVERWRITE_HINT})")


def check_hf_output(out_dir: str, overwrite: bool) -> None:
    """Refuse a folder that holds model files, unless overwrite."""
    if not os.path.lexists(out_dir):
        return
    if not os.path.isdir(out_dir):
        raise WeightError(f"{out_dir}: exists and is not a folder")
    existing = sorted(f for f in os.listdir(out_dir) if is_hf_model_file(f))
    if existing and not overwrite:
        shown = ", ".join(existing[:3]) + (", ..." if len(existing) > 3 else "")
        raise FileExistsError(f"{out_dir} already holds a model ({shown}); pass --overwrite to replace its "
                              "model files (its other files are kept)")


def hf_to_ms(hf_dir: str, out: str, dtype, overwrite: bool = False) -> dict:
    cfg_path = os.path.join(hf_dir, "config.json")
    if not os.path.exists(cfg_path):
        raise WeightError(f"{hf_dir}: no config.json")
    check_ckpt_output(out, cfg_path, overwrite)
    cfg = Qwen2Config.load(cfg_path)
    state = hf_to_ms_state(read_hf_state(hf_dir), hf_dir)
    head = head_of(state)
    check_state({k: a for k, (_, a) in state.items()}, cfg, hf_dir, head, hf_names=True)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {k: cast(v, dtype) for k, v in state.items()}
    stage = staging_dir(out)
    try:
        staged = os.path.join(stage, os.path.basename(out))
        save_ms_checkpoint(state, staged)
        shutil.copyfile(cfg_path, os.path.join(stage, "config.json"))
        os.replace(os.path.join(stage, "config.json"), os.path.join(os.path.dirname(os.path.abspath(out)), "config.json"))
        os.replace(staged, out)  # last: the checkpoint appears only beside its config
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return state


def ms_to_hf(ckpt: str, out_dir: str, config: str, dtype, overwrite: bool = False) -> dict:
    check_hf_output(out_dir, overwrite)
    cfg = Qwen2Config.load(config)
    state = read_ms_checkpoint(ckpt)
    head = head_of(state)
    check_state({k: a for k, (_, a) in state.items()}, cfg, ckpt, head)
    return write_hf({k: cast(v, dtype) for k, v in state.items()}, cfg, config, out_dir, head)


def write_hf(state: dict, cfg: Qwen2Config, config: str, out_dir: str, head: str = "lm_head") -> dict:
    """state (our names -> (dtype, array)) as an HF folder: model.safetensors and config.json (the user's own
    when `config` is a .json), swapped in whole. head "score": a reward model's config (HF's sequence
    classifier with one label)."""
    tensors = {ms_to_hf_name(k): v for k, v in state.items()}
    hf_cfg = cfg.to_hf_dict()
    if head == "score":  # HF's sequence classifier with one label: a reward model
        arch = hf_cfg["architectures"][0].replace("ForCausalLM", "ForSequenceClassification")
        hf_cfg.update(architectures=[arch], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    elif head == "score_mlp":  # Qwen2.5-Math-RM's architecture (its modeling code ships with the model)
        hf_cfg.update(architectures=["Qwen2ForRewardModel"], num_labels=1)
    if config.endswith(".json"):  # keep the user's HF config as it is
        with open(config) as f:
            hf_cfg = json.load(f)
    stage = staging_dir(out_dir)
    try:
        write_safetensors(os.path.join(stage, "model.safetensors"), tensors, {"format": "pt"})
        with open(os.path.join(stage, "config.json"), "w") as f:
            json.dump(hf_cfg, f, indent=2)
        if os.path.isdir(out_dir):
            carry_over(out_dir, stage, keep=lambda name: not is_hf_model_file(name))
        replace_dir(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # gone already when the swap succeeded
    return tensors


def merge_lora(adapter_dir: str, base: Optional[str], out_dir: str, dtype, overwrite: bool = False) -> dict:
    """The base with the adapter merged (`lora.merge_state`), written as an HF folder like `ms_to_hf`."""
    spec, adapters = read_adapter(adapter_dir)
    if base is None:
        with open(os.path.join(adapter_dir, CONFIG_FILE)) as f:
            base = json.load(f).get("base_model_name_or_path")
        if not base:
            raise WeightError(f"{adapter_dir}/{CONFIG_FILE}: no base_model_name_or_path; pass --base")
    check_hf_output(out_dir, overwrite)
    config = find_config(base)
    cfg = Qwen2Config.load(config)
    state = read_model_state(base, cfg)
    unknown = sorted(n for n in adapters if n.rsplit(".", 1)[0] + ".weight" not in state)
    if unknown:
        raise WeightError(f"{adapter_dir}: {unknown[0]} has no projection in the base {base}")
    merged = merge_state(state, adapters, spec.scaling)
    return write_hf({k: cast(("F32", np.ascontiguousarray(v, np.float32)), dtype) for k, v in merged.items()},
                    cfg, config, out_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch_ckpt_dir", required=True,
                    help="HF model directory (input, or output with --reverse and --merge_lora)")
    ap.add_argument("--mindspore_ckpt_path", help="MindSpore .ckpt (output, or input with --reverse)")
    ap.add_argument("--merge_lora", metavar="ADAPTER_DIR", help="merge this PEFT LoRA adapter into its base -> HF")
    ap.add_argument("--base", help="with --merge_lora: the base weights (default: the adapter's base_model_name_or_path)")
    ap.add_argument("--reverse", action="store_true", help="MindSpore -> HF")
    ap.add_argument("--config", help="model config for --reverse (default: config.json/yaml beside the .ckpt)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="output dtype (default: keep)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an existing output's model files (an HF folder's other files are kept)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.merge_lora:
            out = merge_lora(args.merge_lora, args.base, args.torch_ckpt_dir, DTYPES[args.dtype], args.overwrite)
            dest = args.torch_ckpt_dir
        elif not args.mindspore_ckpt_path:
            raise WeightError("--mindspore_ckpt_path is needed (unless --merge_lora)")
        elif args.reverse:
            from mindgrpo.models.checkpoint import find_config
            config = args.config or find_config(args.mindspore_ckpt_path)
            out = ms_to_hf(args.mindspore_ckpt_path, args.torch_ckpt_dir, config, DTYPES[args.dtype], args.overwrite)
            dest = args.torch_ckpt_dir
        else:
            out = hf_to_ms(args.torch_ckpt_dir, args.mindspore_ckpt_path, DTYPES[args.dtype], args.overwrite)
            dest = args.mindspore_ckpt_path
    except (WeightError, ValueError, OSError) as e:
        print(f"convert_weight: error: {e}", file=sys.stderr)
        return 1
    n_bytes = sum(a.nbytes for _, a in out.values())
    print(f"converted {len(out)} tensors, {n_bytes / 1e6:.1f} MB -> {dest} in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
