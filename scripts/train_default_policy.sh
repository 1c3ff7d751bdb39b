#!/usr/bin/env bash
# Reproduce the shipped policy agent/policies/default.pt (about 5 minutes on 2 cores).
#
# Behaviour cloning of FGD on the openb default workload's *train* part (60% of pods by a
# stable hash of their names), on four 200-node slices of the openb GPU cluster; 20,000
# logged teacher decisions, 8 epochs, seed 1. PPO fine-tuning from this checkpoint was
# tried and did not improve the held-out allocation within 20 minutes (see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
out=${1:-runs/default-policy}
fedsched train --algo bc --teacher fgd --seed 1 --num-envs 4 --slice-nodes 200 \
  --bc-samples 20000 --bc-epochs 8 --out "$out"
cp "$out/checkpoint.pt" agent/policies/default.pt
echo "wrote agent/policies/default.pt"
