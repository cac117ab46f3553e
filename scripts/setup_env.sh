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
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if [ "${1:-}" = "dev" ]; then
  .venv/bin/python -m pip install -q -r requirements-dev.txt
else
  .venv/bin/python -m pip install -q -r requirements.txt
fi
.venv/bin/python -m pip install -q --no-deps -e .
