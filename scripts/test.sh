#!/usr/bin/env bash
# Set up (idempotent) and run the test suite plus the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .
python -m pytest "$@"
