#!/usr/bin/env bash
# Reproduce common/data/policies/online.pt, the shipped online (replay-mode) node-scoring policy:
# credit regression on 80,000 decisions of an exploring behaviour policy over 16 randomised
# member clusters (web, gpu, edge, openb slices), node credit over a 30-minute horizon, then
# validation on held-out clusters beside kube-default and the oracle (figures in the checkpoint's
# metadata), the policy scored with kube-default's score beside its logits (--kube-weight 2, kept
# in the checkpoint). The roll-out gate reads the evidence `fedsched evidence learned-online
# --write` adds. About 12 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
out=${1:-runs/online-policy}
# --scale small --credit-weights fixed --workers 1 --no-size-buckets: the recipe online.pt was
# trained with (the module's defaults train at realistic scale with trouble-priced credit, which
# measured worse on the roll-out gate's validation clusters: see common/data/policies/README.md).
python -m fedsched.agent.learning.online --out "$out" --method credit --samples 80000 --epochs 10 \
  --clusters-per-profile 4 --target-loads 0.85,0.95,1.0 --seed 1 \
  --scale small --credit-weights fixed --workers 1 --no-size-buckets --kube-weight 2
cp "$out/checkpoint.pt" common/data/policies/online.pt
echo "wrote common/data/policies/online.pt"
