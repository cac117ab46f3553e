"""Python code in a sandboxed child process: the `python` tool's interpreter.

    result = run_python("print(sum(range(10)))", SandboxLimits(wall_s=5.0))
    result.status, result.output     # "ok", "45\n"  ("error": an exception, a limit; "timeout": wall clock)

The child is a fresh interpreter (`python -I`: no site-packages of the user, no PYTHON* variables) in its own
session, started in a new scratch directory that is removed afterwards whatever happens. Before the code runs
it limits itself:
- CPU seconds, address space (memory), the size of any file it writes, no core files (setrlimit);
- no network: a new network namespace (only a loopback that is down) where the kernel allows one (root, or
  unprivileged user namespaces); everywhere a Python audit hook refuses sockets as well;
- the audit hook also refuses opening files for writing, and creating, removing, renaming or changing files
  anywhere outside the scratch directory, starting processes, and loading C libraries (ctypes).
The parent reads at most `output_bytes` of its output, and kills the child's process group on a wall-clock
timeout or when the output is too long. The audit hook is a best effort inside the interpreter (it cannot stop
code that gets to raw system calls some other way); the limits, the namespace and the wall clock are the
kernel's.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

_BOOTSTRAP = r'''
import ctypes, os, resource, sys, traceback
cpu_s, mem_mb, file_mb, scratch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), os.path.realpath(sys.argv[4])
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL: never outlive the tool worker
isolated = libc.unshare(0x40000000) == 0 or libc.unshare(0x10000000 | 0x40000000) == 0  # CLONE_NEWNET (+NEWUSER)
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
code = sys.stdin.read()
sys.stdin = open(os.devnull)
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def inside(path):
    if isinstance(path, int):
        return True  # an open descriptor: it was checked when opened
    path = os.fsdecode(path)
    return os.path.realpath(path).startswith(scratch + os.sep) or os.path.realpath(path) == scratch
def guard(event, args):
    if event.startswith("socket.") or event in ("ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.system",
            "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen", "pty.spawn",
            "os.kill", "os.killpg"):
        raise PermissionError(f"the sandbox does not allow {event}")
    if event == "open":
        path, mode, flags = args
        writes = (mode is not None and any(c in mode for c in "wax+")) or (mode is None and flags & WRITE)
        if writes and not inside(path):
            raise PermissionError(f"the sandbox writes only inside its scratch directory, not to {path!r}")
    elif event in ("os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.chmod",
                   "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"):
        paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
        if not all(inside(p) for p in paths):
            raise PermissionError(f"the sandbox changes files only inside its scratch directory ({event} {paths})")
sys.addaudithook(guard)
del ctypes, libc
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(code, "<code>", "exec"), namespace)
except SystemExit:
    raise
except BaseException as error:  # the traceback of the code only, without the sandbox's own frames
    report = traceback.TracebackException.from_exception(error)
    report.stack = traceback.StackSummary.from_list([f for f in report.stack if f.filename != "<string>"])
    sys.stdout.flush()
    sys.stderr.write("".join(report.format()))
    sys.exit(1)
'''


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU: SIGKILL after)
    wall_s: float = 10.0  # wall-clock seconds, then the process group is killed
    memory_mb: int = 1024  # address space (RLIMIT_AS); the interpreter alone maps ~30 MB
    file_mb: int = 16  # the largest file it may write in its scratch directory
    output_bytes: int = 65536  # stdout + stderr read; more kills the child


@dataclass(frozen=True)
class SandboxResult:
    status: str  # "ok" | "error" (an exception, a signal, a limit) | "timeout" (wall clock)
    output: str  # stdout then stderr, at most output_bytes of it
    seconds: float


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), scratch_root: str = None) -> SandboxResult:
    """Run `code` in a sandboxed interpreter (see the module docstring); never raises for what the code does."""
    start = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="mindgrpo-python-", dir=scratch_root)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOTSTRAP, str(limits.cpu_s), str(limits.memory_mb), str(limits.file_mb),
             scratch], cwd=scratch, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, env={"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
                                         "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"})
        try:
            status, output = _communicate(proc, code, limits, start)
        finally:
            _kill_group(proc)
        return SandboxResult(status, output, time.monotonic() - start)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _communicate(proc: subprocess.Popen, code: str, limits: SandboxLimits, start: float):
    try:
        proc.stdin.write(code.encode("utf-8", "replace"))
        proc.stdin.close()
    except BrokenPipeError:
        pass
    out, size, fd = [], 0, proc.stdout.fileno()
    deadline = start + limits.wall_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout", _text(out) + f"\n[killed: no result within {limits.wall_s:g} s]"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out.append(chunk)
        size += len(chunk)
        if size > limits.output_bytes:
            return "error", _text(out)[:limits.output_bytes] + f"\n[killed: output over {limits.output_bytes} bytes]"
    code_ = proc.wait(max(0.0, deadline - time.monotonic()) + 1.0)
    text = _text(out)
    if code_ == 0:
        return "ok", text
    if code_ < 0:
        name = signal.Signals(-code_).name
        why = {"SIGKILL": " (CPU time or memory limit)", "SIGXCPU": " (CPU time limit)",
               "SIGXFSZ": " (file size limit)", "SIGSEGV": " (a crash)"}.get(name, "")
        return "error", text + f"\n[the interpreter died of {name}{why}]"
    return "error", text + ("" if text.endswith("\n") or not text else "\n") + f"[exit code {code_}]"


def _text(chunks) -> str:
    return b"".join(chunks).decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen) -> None:
    """The child and whatever it started (its session's process group) end here."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
