"""Checkpoints of a distributed run: every rank writes its pieces, rank 0 the rest and the manifest.

    <root>/step_00000004/state.json                  rank 0: step, optimizer steps, data position, config
    <root>/step_00000004/config.json                 rank 0: the model config (HF format)
    <root>/step_00000004/train_strategy.ckpt         rank 0: the training layout (MindSpore strategy file)
    <root>/step_00000004/policy/rank_<k>/policy.ckpt        every rank: its pieces
    <root>/step_00000004/optimizer/rank_<k>/optimizer.ckpt  every rank: its AdamW moments
    <root>/step_00000004/reference/rank_<k>/reference.ckpt  when the reference is synced
    <root>/step_00000004/adapter/rank_<k>/adapter.ckpt      LoRA (in place of policy/): every rank its adapters'
                                                            pieces; optimizer/ their moments' pieces
    <root>/step_00000004/adapter/adapter_model.safetensors  LoRA, rank 0: the adapters whole in PEFT's layout
    <root>/step_00000004/manifest.json               rank 0, last: the step, every file's size and SHA-256

Each group folder is MindSpore's sharded layout, so
`scripts/transform_checkpoint.py --src_checkpoint STEP/policy --src_strategy STEP/train_strategy.ckpt
--dst_checkpoint FULL.ckpt` merges the policy into one full checkpoint (loadable by load_model),
and a run in the same layout loads `STEP/policy` as per-rank shards (`--sft_path_train STEP/policy`,
`mindgrpo.parallel.placement`).

The step is written under `<root>/.step_00000004.tmp`: every rank writes, flushes and hashes its
own files (in parallel) and records them in `manifest.rank_<k>.json`; rank 0 then writes its
files, merges the ranks' records into the manifest, flushes it and renames the folder (barriers
around), so a crash leaves no step folder without a complete manifest. Resuming, every rank
checks the manifest, the state and its own files of a candidate, and the ranks agree on the
newest checkpoint complete on all of them (`mindgrpo/parallel/checkpoint_folders.py` for the rules).

Needs a file system every rank sees (as MindSpore's own checkpoints of a multi-node job do), and checks
it: at start-up (`clean`) rank 0 writes a token file that every rank must read back (`check_shared`), and
before resuming the ranks agree on the list of step folders they see (`agreed_steps`): a folder that is
local to each node, or a shared one whose listing lags on some node, fails on every rank in one line
naming the ranks, instead of the ranks checking different candidates and waiting on each other forever.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import mindspore as ms

from mindgrpo.parallel import checkpoint_folders as folders
from mindgrpo.parallel import checkpoints as ckpt
from mindgrpo.parallel.comm import Comm

logger = logging.getLogger(__name__)


SHARED_TOKEN = ".ranks_see_this.json"  # written by rank 0 at start-up, read back by every rank
LISTED = 64  # newest step folders compared across ranks (a longer history is compared by its count)


def rank_part(rank: int) -> str:
    return f"manifest.rank_{rank}.json"


def save_sharded(comm: Comm, root: str, step: int, groups: Dict[str, Sequence[ms.Parameter]], state: dict,
                 model_config: dict, keep_last: int, write_strategy, name: Optional[str] = None,
                 extra: Optional[Callable[[str], List[str]]] = None) -> str:
    """write_strategy(path): rank 0 writes the training layout's strategy file there. Into
    root/step_<step>, or root/<name> (checkpoint_folders.BEST). extra(folder), called on every rank after its
    pieces (it may gather over the ranks), writes more files into the folder and returns their paths relative to
    it (LoRA's PEFT adapter, written whole by rank 0), which the manifest lists."""
    final, tmp = folders.save_folders(root, step, name)
    if comm.rank == 0:
        os.makedirs(root, exist_ok=True)
        folders.begin_folder(tmp)
    comm.barrier()
    record = folders.Recorder(tmp)
    for name in ckpt.largest_first(groups):
        rel = os.path.join(name, f"rank_{comm.rank}", f"{name}.ckpt")
        os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
        ckpt.save_params(groups[name], os.path.join(tmp, rel))
        record.add(rel)
        folders.crash_point(step, f"{name}.ckpt")
    for rel in extra(tmp) if extra is not None else ():
        record.add(rel)
    folders.write_json(os.path.join(tmp, rank_part(comm.rank)), record.entries())
    folders.fsync_path(os.path.join(tmp, rank_part(comm.rank)))
    comm.barrier()
    if comm.rank == 0:
        folders.write_json(os.path.join(tmp, "state.json"), state, indent=2, sort_keys=True)
        folders.write_json(os.path.join(tmp, "config.json"), model_config, indent=2)
        write_strategy(os.path.join(tmp, "train_strategy.ckpt"))
        files = {rel: folders.file_entry(os.path.join(tmp, rel))
                 for rel in ("state.json", "config.json", "train_strategy.ckpt")}
        for rank in range(comm.world):
            with open(os.path.join(tmp, rank_part(rank))) as f:
                files.update(json.load(f))
            os.remove(os.path.join(tmp, rank_part(rank)))
        folders.write_manifest(tmp, step, files)
        folders.crash_point(step, folders.MANIFEST)
        folders.publish(tmp, final)
        folders.prune(root, keep_last)
    comm.barrier()
    return final


def mine(rank: int):
    """The manifest's files a rank checks: the shared ones and its own pieces."""
    return lambda rel: "/rank_" not in rel or f"/rank_{rank}/" in rel


def agree(comm: Comm, error: Optional[folders.CheckpointError], path: str) -> None:
    """Every rank raises when any rank found an error: its own, or one naming the other ranks
    (a DamagedCheckpoint when theirs was one), so that no rank goes on alone."""
    flags = np.zeros((2, comm.world), np.float32)
    if error is not None:
        flags[int(isinstance(error, folders.DamagedCheckpoint)), comm.rank] = 1
    flags = comm.host_sum(flags, comm.group(range(comm.world)))
    if error is not None:
        raise error
    ranks = [int(r) for r in np.flatnonzero(flags.sum(0))]
    if flags[1].any():
        raise folders.DamagedCheckpoint(path, f"rank(s) {ranks} found their files damaged (see their logs)")
    if ranks:
        raise folders.CheckpointError(f"checkpoint {path}: rank(s) {ranks} cannot load it (see their logs)")


def ranks_differing(comm: Comm, row: np.ndarray) -> tuple:
    """Every rank's `row` (same length on all, values < 2**24) gathered; returns (rank 0's row, the ranks
    whose row differs from it)."""
    table = np.zeros((comm.world, row.size), np.float32)
    table[comm.rank] = row
    table = comm.host_sum(table, comm.group(range(comm.world)))
    return table[0], [r for r in range(comm.world) if not np.array_equal(table[r], table[0])]


def check_shared(comm: Comm, root: str) -> None:
    """Every rank sees the token rank 0 writes under root, else CheckpointError on every rank naming
    the ranks that do not (their checkpoint folder is not rank 0's: not on a shared file system)."""
    token = np.zeros(1, np.float32)
    path = os.path.join(root, SHARED_TOKEN)
    if comm.rank == 0:
        os.makedirs(root, exist_ok=True)
        token[0] = 1 + secrets.randbelow((1 << 24) - 1)
        tmp = f"{path}.tmp"
        folders.write_json(tmp, {"token": int(token[0])})
        folders.fsync_path(tmp)
        os.replace(tmp, path)
    token = comm.host_sum(token, comm.group(range(comm.world)))  # rank 0's token on every rank
    try:
        with open(path) as f:
            seen = json.load(f)["token"] == int(token[0])
    except (OSError, ValueError, KeyError, TypeError):
        seen = False
    _, blind = ranks_differing(comm, np.ones(1, np.float32) * seen)
    comm.barrier()  # every rank has read it
    if comm.rank == 0:
        os.remove(path)
    if blind:
        raise folders.CheckpointError(
            f"checkpoint folder {root}: rank(s) {blind} do not see the file rank 0 wrote there: every node must "
            "see it on one shared file system (rl_config.output_dir on a shared path)")


def agreed_steps(comm: Comm, root: str) -> List[str]:
    """The step folders under root, the same on every rank, else CheckpointError on every rank."""
    paths = folders.step_dirs(root)
    row = np.zeros(1 + LISTED, np.float32)
    row[0] = len(paths)
    newest = [folders.step_of(p) for p in paths[-LISTED:]]
    row[1:1 + len(newest)] = newest
    first, differ = ranks_differing(comm, row)
    if differ:
        seen = [int(s) for s in first[1:1 + min(int(first[0]), LISTED)]]
        raise folders.CheckpointError(
            f"checkpoint folder {root}: rank(s) {differ} see other step folders than rank 0 (steps {seen}): every "
            "node must see it on one shared file system, with no node's listing lagging")
    return paths


def check_everywhere(comm: Comm, path: str) -> dict:
    """The state of `path` when it is complete for every rank, else DamagedCheckpoint on all ranks."""
    state, damaged = None, None
    try:
        state = folders.inspect(path, mine(comm.rank))
    except folders.DamagedCheckpoint as e:
        damaged = e
    agree(comm, damaged, path)
    return state


def load_sharded(comm: Comm, path: str, groups: Dict[str, Sequence[ms.Parameter]], model_config: dict,
                 checked: bool = False) -> dict:
    """Check the checkpoint (manifest, state, this rank's files unless `checked`, model), then load
    this rank's pieces of the named groups (same layout as when saved); returns state.json."""
    state = check_everywhere(comm, path) if not checked else None
    error = None
    try:
        manifest = folders.read_manifest(path)
        state = state or folders.read_state(path, manifest)
        for name in groups:
            rel = os.path.join(name, f"rank_{comm.rank}", f"{name}.ckpt")
            if rel not in manifest["files"]:
                raise folders.CheckpointError(f"checkpoint {path} has no {rel} (saved by a run with another world "
                                           "size, or without this group: another beta?)")
        folders.check_model_config(path, model_config)
    except folders.CheckpointError as e:
        error = e
    agree(comm, error, path)  # before any weight is touched
    try:
        for name, params in groups.items():
            ckpt.load_params(os.path.join(path, name, f"rank_{comm.rank}", f"{name}.ckpt"), params,
                             hint=" (saved in another layout?)")
    except folders.CheckpointError as e:
        error = e
    agree(comm, error, path)
    return state


class ShardedCheckpoints:
    """The trainer's checkpoint part under msrun: every rank its pieces, rank 0 the rest.
    write_strategy(path) writes the training layout's strategy file (rank 0)."""

    def __init__(self, comm: Comm, root: str, keep_last: int, write_strategy):
        self.comm, self.root, self.keep_last, self.write_strategy = comm, root, keep_last, write_strategy
        self.checked: Optional[str] = None

    def clean(self) -> List[str]:
        """Check that every rank sees the folder (`check_shared`), then remove killed saves' leftovers."""
        check_shared(self.comm, self.root)
        removed = folders.remove_leftovers(self.root) if self.comm.rank == 0 else []
        self.comm.barrier()
        return removed

    def find(self, path: Optional[str] = None) -> Optional[str]:
        if path is not None:
            check_everywhere(self.comm, path)
        else:
            candidates = agreed_steps(self.comm, self.root)
            path = folders.newest_complete(self.root, lambda p: check_everywhere(self.comm, p), candidates)
        self.checked = path
        return path

    def set_aside_after(self, step: int, why: str) -> List[str]:
        moved = folders.set_aside_after(self.root, step, why) if self.comm.rank == 0 else []
        self.comm.barrier()
        return moved

    def save(self, step: int, groups: Dict[str, Sequence[ms.Parameter]], state: dict, model_config: dict,
             name: Optional[str] = None, extra: Optional[Callable[[str], List[str]]] = None) -> str:
        return save_sharded(self.comm, self.root, step, groups, state, model_config, self.keep_last,
                            self.write_strategy, name, extra)

    def load(self, path: str, groups: Dict[str, Sequence[ms.Parameter]], model_config: dict) -> dict:
        return load_sharded(self.comm, path, groups, model_config, checked=path == self.checked)

