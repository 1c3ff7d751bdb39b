#!/usr/bin/env bash
# Set up (idempotent) and run the linter and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Services the mutual-TLS integration test starts itself (Debian packages); without them
# that test skips and says why.
if ! command -v nginx >/dev/null 2>&1 || ! command -v stunnel4 >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "test: installing nginx and stunnel4 (Debian packages)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx stunnel4) \
      >.venv/apt.log 2>&1 || echo "test: could not install nginx/stunnel4 (see .venv/apt.log)" >&2
  fi
fi
. .venv/bin/activate
ruff check .
python -m pytest "$@"
