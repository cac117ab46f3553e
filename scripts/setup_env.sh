#!/usr/bin/env bash
# Create (or reuse) the virtual environment at .venv in the repo root and install mindgrpo.
#   bash scripts/setup_env.sh        # runtime: mindspore 2.10 (CPU), numpy, pyyaml, tokenizers, safetensors, matplotlib
#   bash scripts/setup_env.sh dev    # + pytest, torch 2.13 (CPU), transformers, trl, math-verify, tensorboard
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# pip upgrades itself only when older than 23 (Python 3.11's venv brings 23.2): the upgrade is a
# download and an install on every fresh clone, and what follows needs nothing newer
if ! .venv/bin/python -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 23)'; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
fi
if [ "${1:-}" = "dev" ]; then
  .venv/bin/python -m pip install -q -r requirements-dev.txt
else
  .venv/bin/python -m pip install -q -r requirements.txt
fi
.venv/bin/python -m pip install -q --no-deps -e .
# jemalloc for MindSpore's graph compiler (mindgrpo/utils/malloc.py: compiles take ~0.8x the CPU with it):
# the system's if it has one, else Debian's package unpacked into .venv/lib/jemalloc; without it glibc's malloc
if [ ! -e .venv/lib/jemalloc/libjemalloc.so.2 ] && ! .venv/bin/python -c 'import sys
from mindgrpo.utils.malloc import allocator
sys.exit(allocator() is None)' 2>/dev/null; then
  tmp=$(mktemp -d)
  if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
      && (cd "$tmp" && apt-get download -q libjemalloc2 >/dev/null 2>&1) \
      && dpkg-deb -x "$tmp"/libjemalloc2_*.deb "$tmp/x"; then
    mkdir -p .venv/lib/jemalloc  # a temporary name, then a rename: never a half-copied library to preload
    cp "$tmp"/x/usr/lib/*/libjemalloc.so.2 .venv/lib/jemalloc/libjemalloc.so.2.tmp
    mv .venv/lib/jemalloc/libjemalloc.so.2.tmp .venv/lib/jemalloc/libjemalloc.so.2
  else
    echo "setup_env.sh: no jemalloc (apt-get download libjemalloc2 failed): graph compiles will take longer" >&2
  fi
  rm -rf "$tmp"
fi
# our CPU matmul kernel (mindgrpo/kernels: OpenBLAS's sgemm as MindSpore Custom ops, the model's projections and
# head at many rows; docs/cpu_kernels.md): a second's g++ compile into .venv/lib/mindgrpo; without it (no
# scipy-openblas32, no g++) the model uses MindSpore's MatMul and logs one line saying so
if .venv/bin/python -c 'import scipy_openblas32' 2>/dev/null; then
  .venv/bin/python -m mindgrpo.kernels.build >/dev/null \
    || echo "setup_env.sh: the CPU kernel library did not build (is g++ installed?): MindSpore's MatMul is used" >&2
fi
