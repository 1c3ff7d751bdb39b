#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the built-in openb trace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
mkdir -p out
fedsched evaluate --mode packing --target-load 1.3 --seeds 3 \
  --policy learned --policy kube-default --policy best-fit --policy fgd --policy random \
  --json out/evaluate.json --plot out/evaluate.png "$@"
