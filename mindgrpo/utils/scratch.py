"""A temporary folder that goes with its process, however the process ends.

    folder = ScratchFolder("mindgrpo-tools-")   # tempfile.mkdtemp's folder, and its keeper process
    folder.path                                 # put the workers' scratch folders under it
    folder.close()                              # removed now (idempotent)

close() removes the folder; a process that ends without running it (the collective watchdog's os._exit, SIGKILL,
the out-of-memory killer) would leave the folder behind. So a keeper, a fresh `python -I -S` that imports nothing of
ours, reads a pipe whose write end only this process holds: the pipe closes at close() or when this process ends,
whatever ends it, and the keeper then removes the folder (again, for up to KEEP_TRYING_S, while something still
writes into it: the workers die with this process, a moment later) and exits. It ignores SIGINT and SIGTERM: a
Ctrl-C or a SIGTERM to the whole process group must not stop it before it has done its work.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

KEEP_TRYING_S = 30.0  # the keeper's removals after this process ended: its children have died by then
_KEEPER = r"""
import os, shutil, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
path, keep_trying = sys.argv[1], float(sys.argv[2])
while os.read(0, 4096):
    pass
end = time.monotonic() + keep_trying
while os.path.lexists(path) and time.monotonic() < end:
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        time.sleep(0.1)
"""


class ScratchFolder:
    """A folder made with tempfile.mkdtemp(prefix=prefix), removed at close() or when this process ends (module
    docstring)."""

    def __init__(self, prefix: str):
        self.path = tempfile.mkdtemp(prefix=prefix)
        read, self._pipe = os.pipe()  # non-inheritable: the workers started later do not hold the write end
        try:
            self._keeper: Optional[subprocess.Popen] = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _KEEPER, self.path, str(KEEP_TRYING_S)], stdin=read,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            os.close(self._pipe)
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        finally:
            os.close(read)
        self.keeper_pid = self._keeper.pid

    def close(self) -> None:
        """The folder removed, the keeper ended and reaped."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._keeper is not None:
            os.close(self._pipe)
            self._keeper.wait()
            self._keeper = None
