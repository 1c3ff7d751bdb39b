#!/usr/bin/env bash
# Set up fedsched on a fresh machine: a virtualenv in .venv with the CPU build of torch
# (pinned first so nothing pulls a CUDA build, see README) and fedsched itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch must be pinned before anything that depends on it: a bare "torch" pulls a CUDA build.
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[dev]"
