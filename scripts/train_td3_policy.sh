#!/usr/bin/env bash
# Train the replay-mode TD3 weight policy whose figures the TD3 issue note reports
# (about 13 minutes on 2 cores): behaviour cloning of kube-default into the weight actor,
# then TD3 in replay mode (openb default trace on 200-node slices of the 1523-node cluster,
# durations scaled to 40% load, time compressed 10x), selected on held-out overload events.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
out=${1:-runs/td3-replay}
replay=(--mode replay --nodes builtin:openb_node_list_all_node.csv --replay-load 0.4 --time-compression 10
        --start-quantile 0.01 --slice-nodes 200 --eval-nodes 300 --seed 1
        --replay-allow-unreachable-load)
fedsched train --algo bc --policy-kind weights --teacher kube-default "${replay[@]}" \
  --bc-samples 8000 --bc-epochs 6 --out "$out/bc"
fedsched train --algo td3 --init "$out/bc/checkpoint.pt" "${replay[@]}" --lr 1e-4 \
  --eval-every 5 --checkpoint-every 5 --steps 400000 --time-budget 12 --out "$out/td3"
echo "policies: $out/bc/checkpoint.pt (BC of kube-default) and $out/td3/best.pt (TD3)"
