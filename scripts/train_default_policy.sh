#!/usr/bin/env bash
# Reproduce the shipped packing policy common/data/policies/default.pt (about 35 minutes on 2 cores).
#
# Behaviour cloning of FGD on the openb default workload's *train* part (60% of pods by a
# stable hash of their names), on four 200-node slices of the openb GPU cluster; 20,000
# logged teacher decisions, 8 epochs, seed 1; then rollout-based policy improvement from that
# policy on 100-node slices, selected on a 200-node validation slice of the validation pods
# (PPO fine-tuning from the BC policy was tried and ended below it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
out=${1:-runs/default-policy}
# 1. behaviour cloning of FGD on 200-node slices (about 10 minutes on 2 cores)
fedsched train --algo bc --teacher fgd --seed 1 --num-envs 4 --slice-nodes 200 \
  --bc-samples 20000 --bc-epochs 8 --out "$out/bc"
# 2. rollout-based policy improvement from it (agent/learning/rollout_improve.py): look-ahead of the
#    top candidates with the current policy, distilled; the best validation iteration is kept
#    (20 minutes of budget; the shipped one is iteration 1 of a run from the BC policy of e09ab07)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
python -m fedsched.agent.learning.rollout_improve --out "$out/rollout" --init "$out/bc/checkpoint.pt" \
  --slice-nodes 100 --num-clusters 4 --val-nodes 200 --val-seeds 4 --top-k 3 --teacher fgd \
  --horizon 300 --decisions-per-iter 300 --sample-prob 0.05 --iterations 8 --distill-epochs 4 \
  --learning-rate 3e-4 --margin 0.3 --time-budget-s 1200
cp "$out/rollout/best.pt" common/data/policies/default.pt
echo "wrote common/data/policies/default.pt"
# 3. judged on the full openb GPU cluster (test pods, 10 seeds) beside FGD
python bench/packing_improvement.py --policy common/data/policies/default.pt --seeds 10 --variants default
