"""Compile `sgemm.cc` (the matmuls) and `attention.cc` (packed rows' attention, forward) against the OpenBLAS of
the scipy-openblas32 wheel into one shared library.

    python -m mindgrpo.kernels.build        # what scripts/setup_env.sh runs; prints the library's path

The library lands in MINDGRPO_KERNEL_DIR or else `<venv>/lib/mindgrpo` under a name that carries a hash of the
sources and the OpenBLAS version, so an edited source or a new wheel never loads a stale build. Written to a
temporary name, then renamed: a concurrent build or a killed one never leaves a half-written library."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(HERE, name) for name in ("sgemm.cc", "attention.cc"))


def _openblas():
    """The scipy_openblas32 module, or None when the wheel is not installed."""
    try:
        import scipy_openblas32
    except ImportError:
        return None
    return scipy_openblas32


def library_path() -> Optional[str]:
    """Where the library for these sources and this OpenBLAS is (or would be) built; None without the wheel."""
    blas = _openblas()
    if blas is None:
        return None
    digest = hashlib.sha256()
    for source in SOURCES:
        with open(source, "rb") as f:
            digest.update(f.read())
    digest.update(blas.__version__.encode())
    tag = digest.hexdigest()[:12]
    root = os.environ.get("MINDGRPO_KERNEL_DIR") or os.path.join(sys.prefix, "lib", "mindgrpo")
    return os.path.join(root, f"sgemm-{tag}.so")


def build(compiler: str = "g++") -> str:
    """Compile the library (if it is not already there) and return its path; raises RuntimeError with the
    compiler's message when the wheel is missing or the compile fails."""
    blas = _openblas()
    path = library_path()
    if blas is None or path is None:
        raise RuntimeError("mindgrpo.kernels.build: scipy-openblas32 is not installed (pip install scipy-openblas32)")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lib_dir = blas.get_lib_dir()
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    cmd = [compiler, "-O2", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", f"-I{blas.get_include_dir()}", "-o", tmp, *SOURCES,
           f"-L{lib_dir}", f"-l{blas.get_library()}", f"-Wl,-rpath,{lib_dir}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"mindgrpo.kernels.build: {' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"mindgrpo.kernels.build: {compiler} could not run: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


if __name__ == "__main__":
    try:
        print(build())
    except RuntimeError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
