"""Training checkpoints of one process: the policy, the AdamW moments, the reference and the
trainer state, each group in one .ckpt, into a folder that is complete only with its manifest
(`mindgrpo/parallel/checkpoint_folders.py`: the layout, the manifest, resuming, leftovers, the
checkpoints set aside). `load_params` is every .ckpt load into parameters.

The msrun version (every rank writes its pieces) is `mindgrpo/parallel/sharded_checkpoints.py`.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Callable, Dict, List, Optional, Sequence

import mindspore as ms
import numpy as np

from mindgrpo.models.ckpt_codec import read_ckpt
from mindgrpo.models.convert import WeightError, bf16_to_f32
from mindgrpo.parallel.checkpoint_folders import (MANIFEST, PUBLISHED, CheckpointError, Recorder, begin_folder,
                                                  check_model_config, crash_point, inspect, newest_complete, prune,
                                                  publish, read_manifest, read_state, remove_leftovers,
                                                  save_folders, set_aside_after, write_json, write_manifest)


def save_params(params: Sequence[ms.Parameter], path: str) -> None:
    ms.save_checkpoint([{"name": p.name, "data": p} for p in params], path)


def largest_first(groups: Dict[str, Sequence[ms.Parameter]]) -> List[str]:
    """The order to write groups in: the largest first, so that hashing it overlaps the writing of
    the others and only the smallest one's hash is left at the end."""
    return sorted(groups, key=lambda name: -sum(p.size * p.itemsize for p in groups[name]))


# MindSpore's op-by-op executor (ops.assign outside a graph) is not safe from several threads at once: the tests'
# ranks as threads load together
_ASSIGN = threading.Lock()


def load_params(file: str, params: Sequence[ms.Parameter], hint: str = "") -> None:
    """Load a .ckpt into params, checking every name and shape first.

    The file is memory-mapped and each parameter written in place from its bytes (`ops.assign`), one parameter's
    copy at a time; bf16 parameters get a new tensor (`set_data`: the CPU's Assign kernel has no bf16). Loading with
    `ms.load_checkpoint` and `set_data` left a resumed process 1.3 GB above a fresh one at the 0.5B shape at 2
    layers (5.48 against 4.18 GB at every step after it: the policy's and the reference's embeddings held twice);
    in place, 4.16. A caller keeping `p.asnumpy()` (a view) across a load sees the loaded values."""
    try:
        saved = read_ckpt(file)
    except WeightError as e:
        raise CheckpointError(str(e)) from None
    for p in params:
        if p.name not in saved:
            raise CheckpointError(f"{file}: missing parameter {p.name!r}")
        if tuple(saved[p.name][1].shape) != tuple(p.shape):
            raise CheckpointError(f"{file}: parameter {p.name!r} has shape {tuple(saved[p.name][1].shape)}, "
                                  f"expected {tuple(p.shape)}{hint}")
    for p in params:
        dtype, arr = saved[p.name]
        if dtype == "BFloat16":  # its raw bits; exact in fp32
            value = ms.Tensor(bf16_to_f32(arr)).astype(ms.bfloat16)
        else:
            value = ms.Tensor(np.ascontiguousarray(arr))  # a copy: the map is read-only
        value = value if value.dtype == p.dtype else value.astype(p.dtype)
        if p.dtype == ms.bfloat16:
            p.set_data(value)
        else:
            with _ASSIGN:
                ms.ops.assign(p, value)
        del arr, value


# ------------------------------------------------------------------------------ one process


def save(root: str, step: int, groups: Dict[str, Sequence[ms.Parameter]], state: dict, model_config: dict,
         keep_last: int, name: Optional[str] = None, extra: Optional[Callable[[str], List[str]]] = None) -> str:
    """Into root/step_<step>, or root/<name> (BEST). extra(folder) writes more files into the folder before its
    manifest (LoRA's PEFT adapter) and returns their paths relative to it, which the manifest lists."""
    os.makedirs(root, exist_ok=True)
    final, tmp = save_folders(root, step, name)
    begin_folder(tmp)
    record = Recorder(tmp)
    try:
        for group in largest_first(groups):
            save_params(groups[group], os.path.join(tmp, f"{group}.ckpt"))
            record.add(f"{group}.ckpt")
            crash_point(step, f"{group}.ckpt")
        for rel in extra(tmp) if extra is not None else ():
            record.add(rel)
        write_json(os.path.join(tmp, "state.json"), state, indent=2, sort_keys=True)
        write_json(os.path.join(tmp, "config.json"), model_config, indent=2)
        record.add("state.json")
        record.add("config.json")
        write_manifest(tmp, step, record.entries())
        crash_point(step, MANIFEST)
        publish(tmp, final)
    except BaseException:
        record.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(root, keep_last)
    crash_point(step, PUBLISHED)
    return final


def load(path: str, groups: Dict[str, Sequence[ms.Parameter]], model_config: dict, checked: bool = False) -> dict:
    """Check the checkpoint (manifest, state, files unless `checked` already, model), then load the
    named groups into their parameters (names and shapes must match); returns state.json."""
    manifest = read_manifest(path)
    state = read_state(path, manifest) if checked else inspect(path)
    missing = [f"{name}.ckpt" for name in groups if f"{name}.ckpt" not in manifest["files"]]
    if missing:
        raise CheckpointError(f"checkpoint {path} has no {missing[0]} (saved by a run without it: another beta?)")
    check_model_config(path, model_config)
    for name, params in groups.items():
        load_params(os.path.join(path, f"{name}.ckpt"), params)
    return state


def checkpoint_root(cfg, output_dir: str) -> str:
    """Where a run's checkpoints go: actor_config.checkpoint_dir, else <output_dir>/checkpoints."""
    return cfg.actor_config.checkpoint_dir or os.path.join(output_dir, "checkpoints")


class LocalCheckpoints:
    """The trainer's checkpoint part for one process: every group in one file under root."""

    def __init__(self, root: str, keep_last: int):
        self.root, self.keep_last = root, keep_last
        self.checked: Optional[str] = None  # what find last checked whole, so that load need not hash again

    def clean(self) -> List[str]:
        return remove_leftovers(self.root)

    def find(self, path: Optional[str] = None) -> Optional[str]:
        """`path` if it is complete (else DamagedCheckpoint), or the newest complete one under root."""
        if path is not None:
            inspect(path)
        self.checked = path if path is not None else newest_complete(self.root, inspect)
        return self.checked

    def set_aside_after(self, step: int, why: str) -> List[str]:
        return set_aside_after(self.root, step, why)

    def save(self, step: int, groups: Dict[str, Sequence[ms.Parameter]], state: dict, model_config: dict,
             name: Optional[str] = None, extra: Optional[Callable[[str], List[str]]] = None) -> str:
        return save(self.root, step, groups, state, model_config, self.keep_last, name, extra)

    def load(self, path: str, groups: Dict[str, Sequence[ms.Parameter]], model_config: dict) -> dict:
        return load(path, groups, model_config, checked=path == self.checked)
