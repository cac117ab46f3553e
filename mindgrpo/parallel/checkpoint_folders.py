"""A checkpoint folder on disk, complete only with its manifest, and the bookkeeping around it.

    <root>/step_00000004/policy.ckpt      policy weights (MindSpore names, loadable by load_model)
    <root>/step_00000004/optimizer.ckpt   AdamW moments
    <root>/step_00000004/reference.ckpt   the reference model, when there is one (beta > 0)
    <root>/step_00000004/state.json       step, optimizer steps, data position, config
    <root>/step_00000004/config.json      the model config (HF format), so policy.ckpt loads alone
    <root>/step_00000004/manifest.json    written last: the step, every other file's size and SHA-256
    <root>/tokenizer/                     the run's tokenizer, written at its start (data/tokenizer.py:
                                          write_run_tokenizer), where generate.py and evaluate.py find it

Saving writes every file into `<root>/.step_00000004.tmp`, flushes each to disk (fsync), then
writes and flushes the manifest and renames the folder (`publish`). A checkpoint is complete when
its manifest is there and every file it lists matches it, so a crash at any moment leaves the
earlier checkpoints complete and at worst a `.step_*.tmp` folder, which the next run removes
(`remove_leftovers`; a folder whose owner process still runs is left alone).

Resuming: the newest complete checkpoint is taken (`newest_complete`), skipping a damaged one (a
truncated or missing file, a garbled or missing state.json or manifest) with a warning naming the
reason; an explicit `--resume_from` checkpoint that is damaged is an error naming the reason. The
manifest and the state are read and checked (`inspect`) before any weight is touched. A run that
resumes at step N (or starts at 0) sets every checkpoint beyond N aside (`set_aside_after`: renamed
`abandoned_step_<N>.<time>`, never deleted, never counted by keep_last_k), so that a later
`--resume` continues this run and not the abandoned one.

Plain Python (no MindSpore): the weights' files are written and loaded by
`mindgrpo/parallel/checkpoints.py` (one process) and `mindgrpo/parallel/sharded_checkpoints.py`
(msrun: every rank its pieces).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step_(\d{8})$")
TMP_DIR = re.compile(r"^\.step_\d{8}\.tmp")
OLD_DIR = re.compile(r"^\.(step_\d{8}|best)\.old$")  # a folder set aside while its replacement is renamed in
BEST = "best"  # rl_config.save_best's checkpoint, beside the step folders (not counted by keep_last_k)
MANIFEST = "manifest.json"
OWNER = "owner.json"  # in a folder being written: who writes it
FORMAT = 1
CHUNK = 8 << 20  # bytes read at a time when hashing
# Tests only: "STEP:FILE" kills the process (SIGKILL) right after FILE of step STEP is written,
# a deterministic crash in the middle of a save (tests/grpo/test_chaos.py); "STEP:published" right after the
# checkpoint of step STEP is complete (one process's saves; tests/parallel/test_separate.py).
CRASH_ENV = "MINDGRPO_TEST_CRASH_IN_SAVE"
PUBLISHED = "published"


class CheckpointError(Exception):
    """A checkpoint that this run cannot resume from: one line naming the folder and the reason."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint that is not complete: `--resume` skips it, `--resume_from` refuses it."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"checkpoint {path} is damaged: {reason}")


# ------------------------------------------------------------------------------ files


def save_folders(root: str, step: int, name: Optional[str] = None) -> Tuple[str, str]:
    """A save's folder (root/step_<step>, or root/<name>: BEST) and the temporary one it is written in first."""
    return (os.path.join(root, name or f"step_{step:08d}"),
            os.path.join(root, f".step_{step:08d}.tmp" + (f"-{name}" if name else "")))


def step_dirs(root: str) -> List[str]:
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, d) for d in os.listdir(root) if STEP_DIR.match(d))


def step_of(path: str) -> int:
    return int(STEP_DIR.match(os.path.basename(os.path.normpath(path))).group(1))


def sha256(path: str) -> str:
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return h.hexdigest()
            h.update(view[:n])  # hashlib releases the GIL on large buffers: saving goes on meanwhile


def fsync_path(path: str) -> None:
    """Flush a file's (or a folder's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_entry(path: str) -> dict:
    """Flushed to disk, then measured: the manifest's record of one file."""
    fsync_path(path)
    return {"bytes": os.path.getsize(path), "sha256": sha256(path)}


def write_json(path: str, obj, **kwargs) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, **kwargs)


def crash_point(step: int, name: str) -> None:
    if os.environ.get(CRASH_ENV) == f"{step}:{name}":
        os.kill(os.getpid(), signal.SIGKILL)


class Recorder:
    """Flushes and hashes written files on a worker thread while the next file is being written."""

    def __init__(self, folder: str):
        self.folder = folder
        self.pool = ThreadPoolExecutor(1)
        self.pending: Dict[str, object] = {}

    def add(self, rel: str) -> None:
        self.pending[rel] = self.pool.submit(file_entry, os.path.join(self.folder, rel))

    def entries(self) -> Dict[str, dict]:
        try:
            return {rel: future.result() for rel, future in self.pending.items()}
        finally:
            self.close()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def begin_folder(path: str) -> None:
    """A fresh folder to write a checkpoint into, marked with its owner (host, pid)."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    write_json(os.path.join(path, OWNER), {"host": socket.gethostname(), "pid": os.getpid()})


def write_manifest(folder: str, step: int, files: Dict[str, dict]) -> None:
    path = os.path.join(folder, MANIFEST)
    with open(path, "w") as f:
        json.dump({"format": FORMAT, "step": step, "files": dict(sorted(files.items()))}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def publish(tmp: str, final: str) -> None:
    """Rename the written folder to its final name, durably. A folder already there (the same step
    saved again, or `best` replaced) is renamed aside first, to `.NAME.old`, and removed once the new
    one is in place: a crash between the two renames leaves the old folder aside, and
    `remove_leftovers` puts it back."""
    os.remove(os.path.join(tmp, OWNER))
    fsync_path(tmp)
    root = os.path.dirname(final)
    old = os.path.join(root, f".{os.path.basename(final)}.old")
    if os.path.exists(final):
        if os.path.exists(old):
            discard(old)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_path(root)
    if os.path.exists(old):
        discard(old)


def discard(path: str) -> None:
    """Remove a checkpoint folder: renamed to a temporary name first, so that a crash while
    deleting leaves a leftover for the next run to remove, not a half checkpoint."""
    trash = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-del-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(root: str, keep_last: int) -> None:
    for old in step_dirs(root)[:-keep_last]:
        discard(old)


def _owner_alive(folder: str) -> bool:
    try:
        with open(os.path.join(folder, OWNER)) as f:
            owner = json.load(f)
        if owner["host"] != socket.gethostname():
            return False
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def remove_leftovers(root: str) -> List[str]:
    """Remove the `.step_*.tmp*` folders of killed saves (not those of a live process) and put back a
    folder that a killed save had renamed aside (`.NAME.old` without NAME), else remove it; returns
    what it removed."""
    removed = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        path = os.path.join(root, name)
        if OLD_DIR.match(name) and os.path.isdir(path):
            final = os.path.join(root, OLD_DIR.match(name).group(1))
            if os.path.exists(final):
                discard(path)
                removed.append(path)
            else:
                os.replace(path, final)
                logger.info("put %s back as %s: a save that replaced it was interrupted", path, final)
            continue
        if TMP_DIR.match(name) and os.path.isdir(path) and not _owner_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            logger.info("removed %s, left by an interrupted save", path)
    return removed


def best_step(path: str) -> int:
    """The step of the checkpoint at `path` by its manifest; -1 when there is none or it is unreadable
    (a damaged `best` is left where it is, for the next better validation to replace)."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            return int(json.load(f)["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def set_aside_after(root: str, step: int, why: str) -> List[str]:
    """Rename the checkpoints beyond `step` to abandoned_step_<N>.<time> (and `best`, when it was saved
    beyond `step`, to abandoned_best.<time>); returns the new paths."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for path in step_dirs(root) + [os.path.join(root, BEST)]:
        if (step_of(path) if STEP_DIR.match(os.path.basename(path)) else best_step(path)) <= step:
            continue
        new = os.path.join(root, f"abandoned_{os.path.basename(path)}.{stamp}")
        n = 1
        while os.path.exists(new):
            new, n = os.path.join(root, f"abandoned_{os.path.basename(path)}.{stamp}-{n}"), n + 1
        os.replace(path, new)
        moved.append(new)
        logger.warning("set aside %s as %s: it is beyond step %d, where %s", path, new, step, why)
    return moved


# ------------------------------------------------------------------------------ checking


def read_manifest(path: str) -> dict:
    if not os.path.isdir(path):
        raise DamagedCheckpoint(path, "no such checkpoint folder")
    file = os.path.join(path, MANIFEST)
    if not os.path.isfile(file):
        raise DamagedCheckpoint(path, f"no {MANIFEST} (its save did not finish, or an older version wrote it)")
    try:
        with open(file) as f:
            manifest = json.load(f)
        files = manifest["files"]
        ok = (manifest["format"] == FORMAT and isinstance(manifest["step"], int) and isinstance(files, dict)
              and all(isinstance(e["bytes"], int) and isinstance(e["sha256"], str) for e in files.values()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedCheckpoint(path, f"{MANIFEST} is garbled ({type(e).__name__}: {e})") from None
    if not ok or "state.json" not in files:
        raise DamagedCheckpoint(path, f"{MANIFEST} is garbled (not a format-{FORMAT} manifest listing state.json)")
    if STEP_DIR.match(os.path.basename(os.path.normpath(path))) and manifest["step"] != step_of(path):
        raise DamagedCheckpoint(path, f"{MANIFEST} is of step {manifest['step']}, not of step {step_of(path)}")
    return manifest


STATE_KEYS = {"step": int, "optimizer_steps": int, "train_prompts": dict, "val_history": list, "bad_steps": dict,
              "config": dict}


def read_state(path: str, manifest: dict) -> dict:
    """state.json, checked against the manifest and for the keys and types resuming needs."""
    check_files(path, manifest, lambda rel: rel == "state.json")
    try:
        with open(os.path.join(path, "state.json")) as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        raise DamagedCheckpoint(path, f"state.json is garbled ({e})") from None
    for key, kind in STATE_KEYS.items():
        if not isinstance(state, dict) or not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            raise DamagedCheckpoint(path, f"state.json has no {kind.__name__} '{key}'")
    for key, fields in (("train_prompts", ("epoch", "index")), ("bad_steps", ("total", "in_a_row"))):
        if not all(isinstance(state[key].get(k), int) for k in fields):
            raise DamagedCheckpoint(path, f"state.json has no {key} {fields}")
    if state["step"] != manifest["step"]:
        raise DamagedCheckpoint(path, f"state.json is of step {state['step']}, its manifest of {manifest['step']}")
    return state


def check_files(path: str, manifest: dict, mine: Callable[[str], bool] = lambda rel: True) -> None:
    """Every file of the manifest that `mine` selects is there, of its size and checksum."""
    for rel, entry in manifest["files"].items():
        if not mine(rel):
            continue
        file = os.path.join(path, rel)
        if not os.path.isfile(file):
            raise DamagedCheckpoint(path, f"{rel} is missing")
        size = os.path.getsize(file)
        if size != entry["bytes"]:
            raise DamagedCheckpoint(path, f"{rel} has {size} bytes, its manifest says {entry['bytes']} (truncated?)")
        if sha256(file) != entry["sha256"]:
            raise DamagedCheckpoint(path, f"{rel} does not match its checksum")


def inspect(path: str, mine: Callable[[str], bool] = lambda rel: True) -> dict:
    """The state of a complete checkpoint (the files `mine` selects checked), else DamagedCheckpoint."""
    manifest = read_manifest(path)
    state = read_state(path, manifest)
    check_files(path, manifest, mine)
    return state


def newest_complete(root: str, check: Callable[[str], dict],
                    candidates: Optional[List[str]] = None) -> Optional[str]:
    """The newest checkpoint under root (or of `candidates`: root's step folders as the ranks agreed on
    them) that `check` accepts; a damaged one is skipped with a warning."""
    for path in reversed(step_dirs(root) if candidates is None else candidates):
        try:
            check(path)
        except DamagedCheckpoint as e:
            logger.warning("skipping %s", e)
            continue
        return path
    return None


def check_model_config(path: str, model_config: dict) -> None:
    """The checkpoint's model is this run's (before any weight is loaded)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise DamagedCheckpoint(path, f"config.json is unreadable ({e})") from None
    differ = [k for k in sorted(set(saved) | set(model_config)) if saved.get(k) != model_config.get(k)]
    if differ:
        k = differ[0]
        raise CheckpointError(f"checkpoint {path} holds another model: {k} {saved.get(k)}, this run's "
                              f"{model_config.get(k)}")
