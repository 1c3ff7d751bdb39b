#!/usr/bin/env bash
# Set up (idempotent) and run the main job: a local multi-cluster federated training and
# evaluation on built-in data (Flower simulation of five non-IID member clusters of 40-100 nodes, FedAvg
# and FedProx, INT8 uploads), then print per-cluster results. Pass --quick for a short run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
mkdir -p out
fedsched federate --out out/federate "$@"
