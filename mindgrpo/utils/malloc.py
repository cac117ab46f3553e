"""jemalloc under MindSpore's graph compiler: a process started with it preloaded (LD_PRELOAD).

    env = with_allocator(os.environ)      # for a child process: LD_PRELOAD names the library when one is found
    reexec_with_allocator()               # at a script's start: run again (same pid and arguments) with it

MindSpore 2.10 compiles a graph on the host with a great many small C++ allocations, and glibc's malloc
spends a fifth of a compile's CPU in its slow paths (`_int_malloc`, `malloc_consolidate`, `unlink_chunk`:
perf on tests/models/test_qwen2_parity.py). With jemalloc preloaded the same work takes ~0.8x the CPU
(a probe, removed: `git show 997488e:benchmarks/malloc.py`). The arithmetic is the same unless a kernel depends on bytes it did not write: MindSpore's
CPU LogSoftmax can, and the package does not call it (DEVELOPERS.md, tests/models/test_junk_fill.py).

Which library: $MINDGRPO_MALLOC if set (a path to a shared library, or `system` for glibc's own malloc),
else the copy `scripts/setup_env.sh` unpacks into the virtual environment (lib/jemalloc/), else the
system's libjemalloc.so.2; none found: glibc's (everything works, compiles are slower).
"""

from __future__ import annotations

import os
import sys
from typing import List, Mapping, Optional

ENV = "MINDGRPO_MALLOC"
LIBRARY = "libjemalloc.so.2"
SYSTEM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def allocator(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The shared library to preload, or None (glibc's malloc)."""
    choice = environ.get(ENV, "")
    if choice == "system":
        return None
    if choice:
        if not os.path.isfile(choice):
            raise ValueError(f"{ENV}={choice}: no such file (a shared library to preload, or 'system')")
        return os.path.abspath(choice)
    for folder in (os.path.join(sys.prefix, "lib", "jemalloc"), *SYSTEM_DIRS):
        path = os.path.join(folder, LIBRARY)
        if os.path.isfile(path):
            return path
    return None


def preloaded(environ: Mapping[str, str] = os.environ) -> List[str]:
    """The libraries LD_PRELOAD names (separated by spaces or colons, as ld.so reads it)."""
    return environ.get("LD_PRELOAD", "").replace(":", " ").split()


def with_allocator(environ: Mapping[str, str] = os.environ) -> dict:
    """A copy of `environ` whose LD_PRELOAD starts with `allocator()` (unchanged when there is none, or when
    it is already there)."""
    env = dict(environ)
    lib = allocator(environ)
    libs = preloaded(env)
    if lib is not None and lib not in libs:
        env["LD_PRELOAD"] = " ".join([lib, *libs])
    return env


def reexec_with_allocator() -> None:
    """Replace this process by the same command with the allocator preloaded (the pid stays: msrun and a
    parent waiting on it see nothing); returns when there is nothing to preload or it already is. Call it
    first thing, before MindSpore is imported."""
    env = with_allocator(os.environ)
    if env.get("LD_PRELOAD") == os.environ.get("LD_PRELOAD"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)  # orig_argv: the interpreter's own options too
