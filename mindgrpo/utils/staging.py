"""Outputs staged in a folder beside their final path and moved into place when complete.

    stage = staging_dir(final)            # .NAME.tmp-HOST-PID-XXXXXXXX beside final
    ... write the output's files into stage ...
    replace_dir(stage, final)             # or move single files out of stage with os.replace

A folder's name records the host and the process that owns it. A writer that is killed leaves its
folder behind; `staging_dir` first removes the stale folders of earlier writers to the same final
path (`remove_stale`), so the next write cleans up after a killed one. A folder is stale when

- its host is this one and its process is no longer running, or
- nothing in it has changed for STALE_AFTER_S (a day): folders of other hosts on a shared
  filesystem, and folders named without an owner.

A running writer's folder is therefore never removed (a process id reused since is taken as
running: the folder waits for the next run or for a day).

`replace_dir` swaps a complete folder in: the old folder is renamed aside (.NAME.old-HOST-PID-...),
the new one renamed in, the old one removed. A writer killed between the two renames leaves no
folder at the final path and the old one aside: `remove_stale` renames it back, so a crash leaves
either the old or the new output.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from typing import Callable, Optional, Tuple

STALE_AFTER_S = 24 * 3600
_KINDS = ("tmp", "old")


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"


def _split(final: str) -> Tuple[str, str]:
    parent, name = os.path.split(os.path.abspath(final))
    return parent, name


def _new_folder(final: str, kind: str) -> str:
    parent, name = _split(final)
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}.{kind}-{_host()}-{os.getpid()}-", dir=parent)


def staging_dir(final: str) -> str:
    """A new empty folder beside `final` to write its output into, after removing stale ones."""
    remove_stale(final)
    return _new_folder(final, "tmp")


def _owner(suffix: str) -> Tuple[Optional[str], Optional[int]]:
    """(host, pid) from the part of a folder name after `.NAME.KIND-`; (None, None) when absent."""
    parts = suffix.rsplit("-", 2)  # the host may hold dashes; mkdtemp's random part holds none
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return None, None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _last_change(path: str) -> float:
    """The newest modification time of the folder and everything in it."""
    newest = os.lstat(path).st_mtime
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def is_stale(path: str, suffix: str) -> bool:
    host, pid = _owner(suffix)
    if host == _host() and pid is not None:
        return not _running(pid)
    return time.time() - _last_change(path) > STALE_AFTER_S


def remove_stale(final: str) -> list:
    """Remove the folders beside `final` left by writers that are gone; an old folder set aside by a
    writer killed mid-swap is renamed back to `final` when `final` is missing. Returns what it removed."""
    parent, name = _split(final)
    if not os.path.isdir(parent):
        return []
    removed = []
    for kind in ("old", "tmp"):  # restore an old folder before any new one is removed
        prefix = f".{name}.{kind}-"
        for entry in sorted(os.listdir(parent)):
            path = os.path.join(parent, entry)
            if not entry.startswith(prefix) or not os.path.isdir(path) or not is_stale(path, entry[len(prefix):]):
                continue
            if kind == "old" and not os.path.lexists(final):
                os.rename(path, final)
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a filesystem without hard links
        shutil.copy2(src, dst)


def carry_over(src_dir: str, dst_dir: str, keep: Callable[[str], bool]) -> list:
    """Hard-link (or copy) the entries of src_dir whose name `keep` accepts into dst_dir; returns their names."""
    carried = []
    for entry in sorted(os.scandir(src_dir), key=lambda e: e.name):
        if not keep(entry.name):
            continue
        dst = os.path.join(dst_dir, entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), dst)
        elif entry.is_dir():
            shutil.copytree(entry.path, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry.path, dst)
        carried.append(entry.name)
    return carried


def replace_dir(new: str, final: str) -> None:
    """Move the complete folder `new` to `final`, replacing a folder there (see the module docstring)."""
    if not os.path.lexists(final):
        os.rename(new, final)
        return
    if not os.path.isdir(final) or os.path.islink(final):
        raise NotADirectoryError(f"{final} exists and is not a folder")
    aside = _new_folder(final, "old")
    os.rename(final, aside)  # replaces the empty folder just made
    os.rename(new, final)
    shutil.rmtree(aside, ignore_errors=True)


def write_text(final: str, text: str) -> None:
    """Write `text` to the file `final` whole or not at all: into a staging folder beside it, flushed
    to disk, then renamed over it (a killed write leaves the old file, or none, and a folder that the
    next write to `final` removes)."""
    stage = staging_dir(final)
    try:
        tmp = os.path.join(stage, os.path.basename(final))
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
