"""Length-prefixed pickled frames over pipes: how the trainer talks to its worker processes (rewards, tools).

    send_frame(fd, obj)      # blocks until the whole frame is written
    obj = recv_frame(fd)     # None at end of file (the other side closed its end or died)
    close_and_reap(proc, (tasks, results), grace_s)   # a worker's pipes closed, the worker waited for or killed
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
from typing import Iterable, Optional

_HEADER = struct.Struct(">Q")  # frame length in bytes


def send_frame(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int) -> Optional[bytes]:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None  # the other side closed its end (or died)
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(fd: int):
    """The next object from fd, or None at end of file."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    data = _read_exactly(fd, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


def close_and_reap(proc: subprocess.Popen, fds: Iterable[int], grace_s: float = 0.0) -> None:
    """Close a worker's pipe ends (it exits at end of file); SIGKILL it if it is still there after grace_s."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
