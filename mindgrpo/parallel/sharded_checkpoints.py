"""Checkpoints of a distributed run: every rank writes its pieces, rank 0 the rest, one rename.

    <root>/step_00000004/state.json                  rank 0: step, optimizer steps, data position, config
    <root>/step_00000004/config.json                 rank 0: the model config (HF format)
    <root>/step_00000004/train_strategy.ckpt         rank 0: the training layout (MindSpore strategy file)
    <root>/step_00000004/policy/rank_<k>/policy.ckpt        every rank: its pieces
    <root>/step_00000004/optimizer/rank_<k>/optimizer.ckpt  every rank: its AdamW moments
    <root>/step_00000004/reference/rank_<k>/reference.ckpt  when the reference is synced

Each group folder is MindSpore's sharded layout, so
`scripts/transform_checkpoint.py --src_checkpoint STEP/policy --src_strategy STEP/train_strategy.ckpt
--dst_checkpoint FULL.ckpt` merges the policy into one full checkpoint (loadable by load_model),
and a run in the same layout loads `STEP/policy` as per-rank shards (`--sft_path_train STEP/policy`,
`mindgrpo.parallel.placement`).

The step is written under `<root>/.step_00000004.tmp` and renamed by rank 0 once every rank is
done (barriers around), so `checkpoints.latest` never sees a half-written step. Needs a file
system every rank sees (as MindSpore's own checkpoints of a multi-node job do).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Dict, Sequence

import mindspore as ms

from mindgrpo.parallel import checkpoints
from mindgrpo.parallel.comm import Comm


def save_sharded(comm: Comm, root: str, step: int, groups: Dict[str, Sequence[ms.Parameter]], state: dict,
                 model_config: dict, keep_last: int, write_strategy) -> str:
    """write_strategy(path): rank 0 writes the training layout's strategy file there."""
    final = os.path.join(root, f"step_{step:08d}")
    tmp = os.path.join(root, f".step_{step:08d}.tmp")
    if comm.rank == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    comm.barrier()
    for name, params in groups.items():
        folder = os.path.join(tmp, name, f"rank_{comm.rank}")
        os.makedirs(folder, exist_ok=True)
        ms.save_checkpoint([{"name": p.name, "data": p} for p in params], os.path.join(folder, f"{name}.ckpt"))
    comm.barrier()
    if comm.rank == 0:
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state, f, indent=2, sort_keys=True)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(model_config, f, indent=2)
        write_strategy(os.path.join(tmp, "train_strategy.ckpt"))
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in checkpoints.step_dirs(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    comm.barrier()
    return final


def load_sharded(comm: Comm, path: str, groups: Dict[str, Sequence[ms.Parameter]]) -> dict:
    """Load this rank's pieces of the named groups (same layout as when saved); returns state.json."""
    for name, params in groups.items():
        file = os.path.join(path, name, f"rank_{comm.rank}", f"{name}.ckpt")
        if not os.path.exists(file):
            raise FileNotFoundError(f"{path}: no {name}/rank_{comm.rank} (saved by a run with another world size?)")
        checkpoints.load_params(file, params, hint=" (saved in another layout?)")
    with open(os.path.join(path, "state.json")) as f:
        return json.load(f)


class ShardedCheckpoints:
    """The trainer's checkpoint part under msrun: every rank its pieces, rank 0 the rest.
    write_strategy(path) writes the training layout's strategy file (rank 0)."""

    def __init__(self, comm: Comm, root: str, keep_last: int, write_strategy):
        self.comm, self.root, self.keep_last, self.write_strategy = comm, root, keep_last, write_strategy

    def save(self, step: int, groups: Dict[str, Sequence[ms.Parameter]], state: dict, model_config: dict) -> str:
        return save_sharded(self.comm, self.root, step, groups, state, model_config, self.keep_last,
                            self.write_strategy)

    def load(self, path: str, groups: Dict[str, Sequence[ms.Parameter]]) -> dict:
        return load_sharded(self.comm, path, groups)
