#!/usr/bin/env bash
# Set up fedsched on a fresh machine: a virtualenv in .venv with the CPU build of torch
# (pinned first so nothing pulls a CUDA build, see README) and fedsched itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
. .venv/bin/activate
log=.venv/setup.log
step() {  # run a pip step quietly; show its log only if it fails
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: failed: $*" >&2
    exit 1
  fi
}
echo "setup: installing torch==2.13.0 (CPU) and fedsched into .venv" >&2
step python -m pip install --upgrade pip
# torch must be pinned before anything that depends on it: a bare "torch" pulls a CUDA build.
step python -m pip install "torch==2.13.0"
step python -m pip install -e ".[dev]"
