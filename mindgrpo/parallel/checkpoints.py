"""Training checkpoints: weights, optimizer state, trainer state; atomic, keeping the last K.

    <dir>/step_00000004/policy.ckpt      policy weights (MindSpore names, loadable by load_model)
    <dir>/step_00000004/optimizer.ckpt   AdamW moments
    <dir>/step_00000004/reference.ckpt   the reference model, when there is one (beta > 0)
    <dir>/step_00000004/state.json       step, optimizer steps, data position, config
    <dir>/step_00000004/config.json      the model config (HF format), so policy.ckpt loads alone

A checkpoint is written into a temporary folder beside its final name and renamed when
complete, so a crash never leaves a half checkpoint under a step name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Dict, List, Optional, Sequence

import mindspore as ms

STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dirs(root: str) -> List[str]:
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, d) for d in os.listdir(root) if STEP_DIR.match(d))


def latest(root: str) -> Optional[str]:
    dirs = step_dirs(root)
    return dirs[-1] if dirs else None


def _save_params(params: Sequence[ms.Parameter], path: str) -> None:
    ms.save_checkpoint([{"name": p.name, "data": p} for p in params], path)


def save(root: str, step: int, groups: Dict[str, Sequence[ms.Parameter]], state: dict, model_config: dict,
         keep_last: int) -> str:
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step_{step:08d}")
    tmp = tempfile.mkdtemp(prefix=f".step_{step:08d}.", dir=root)
    try:
        for name, params in groups.items():
            _save_params(params, os.path.join(tmp, f"{name}.ckpt"))
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state, f, indent=2, sort_keys=True)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(model_config, f, indent=2)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in step_dirs(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_params(file: str, params: Sequence[ms.Parameter], hint: str = "") -> None:
    """Load a .ckpt into params (by name), checking every name and shape first; hint ends the
    shape error (what a mismatch suggests). Every checkpoint and shard load goes through here."""
    saved = ms.load_checkpoint(file)
    for p in params:
        if p.name not in saved:
            raise KeyError(f"{file}: missing parameter {p.name!r}")
        if tuple(saved[p.name].shape) != tuple(p.shape):
            raise ValueError(f"{file}: parameter {p.name!r} has shape {tuple(saved[p.name].shape)}, "
                             f"expected {tuple(p.shape)}{hint}")
    for p in params:
        p.set_data(saved[p.name].astype(p.dtype))


def load(path: str, groups: Dict[str, Sequence[ms.Parameter]]) -> dict:
    """Load the named groups into their parameters (names must match); returns state.json."""
    for name, params in groups.items():
        file = os.path.join(path, f"{name}.ckpt")
        if not os.path.exists(file):
            raise FileNotFoundError(f"{path}: checkpoint has no {name}.ckpt")
        load_params(file, params)
    with open(os.path.join(path, "state.json")) as f:
        return json.load(f)


def checkpoint_root(cfg, output_dir: str) -> str:
    """Where a run's checkpoints go: actor_config.checkpoint_dir, else <output_dir>/checkpoints."""
    return cfg.actor_config.checkpoint_dir or os.path.join(output_dir, "checkpoints")


class LocalCheckpoints:
    """The trainer's checkpoint part for one process: every group in one file under root."""

    def __init__(self, root: str, keep_last: int):
        self.root, self.keep_last = root, keep_last

    def save(self, step: int, groups: Dict[str, Sequence[ms.Parameter]], state: dict, model_config: dict) -> str:
        return save(self.root, step, groups, state, model_config, self.keep_last)

    def load(self, path: str, groups: Dict[str, Sequence[ms.Parameter]]) -> dict:
        return load(path, groups)
