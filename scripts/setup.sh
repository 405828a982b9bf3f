#!/usr/bin/env bash
# One-shot set-up on a fresh machine: a virtualenv in .venv with varbench and its test tools.
# torch 2.14.1 + torchvision 0.29.1 is the pair open_clip/timm import with (CPU or CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install -q -e ".[vision,test,skipvar,slurm,quant]"
echo "varbench installed in $(pwd)/.venv"
