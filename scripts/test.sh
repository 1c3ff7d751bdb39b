#!/usr/bin/env bash
# Set up (idempotent) and run the linter and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Services the integration tests start themselves (Debian packages): nginx and stunnel4 for the
# mutual-TLS test, prometheus for the telemetry test, chromium and chromium-driver for the check of
# the main job's HTML report in a headless browser; without them those tests skip and say why.
# The prometheus package may start its own service on :9090; the tests do not use it (they run
# their own server on a free port), so it is stopped again.
if ! command -v nginx >/dev/null 2>&1 || ! command -v stunnel4 >/dev/null 2>&1 \
    || ! command -v prometheus >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "test: installing missing Debian packages (nginx, stunnel4, prometheus, chromium)" >&2
    (apt-get update -qq \
      && if ! command -v nginx >/dev/null 2>&1 || ! command -v stunnel4 >/dev/null 2>&1; then
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx stunnel4
         fi \
      && if ! command -v prometheus >/dev/null 2>&1; then
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
             && { invoke-rc.d prometheus stop || true; }
         fi \
      && if ! command -v chromedriver >/dev/null 2>&1; then
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
         fi) \
      >.venv/apt.log 2>&1 || echo "test: could not install nginx/stunnel4/prometheus/chromium (see .venv/apt.log)" >&2
  fi
fi
# checkov (the Helm chart tests' security scan) in its own virtualenv: its pins (packaging<24,
# networkx<2.7) conflict with Flower's, so it cannot share .venv. The tests find it there.
CHECKOV_VERSION=3.3.30
if ! .venv/checkov/bin/checkov --version 2>/dev/null | grep -qx "$CHECKOV_VERSION"; then
  echo "test: installing checkov==$CHECKOV_VERSION into .venv/checkov" >&2
  (rm -rf .venv/checkov && "${PYTHON:-python3}" -m venv .venv/checkov \
    && .venv/checkov/bin/python -m pip install -q "checkov==$CHECKOV_VERSION") \
    >.venv/checkov-setup.log 2>&1 || echo "test: could not install checkov (see .venv/checkov-setup.log)" >&2
fi
# etcd, kube-apiserver and kube-scheduler for the tests on a real control plane (tests/agent/k8s),
# built from their Go modules into .k8s/bin: about 13 minutes the first time on 2 cores, seconds
# after (idempotent). Without them those tests skip and say why (under CI: fail).
bash scripts/build_k8s.sh \
  || echo "test: scripts/build_k8s.sh failed; the real control-plane tests skip (fail under CI)" >&2
# The Go Score plugin: its kube-scheduler binary (the plugin's end-to-end tests) and its Go tests'
# packages, compiled with the build's settings (no cgo, -trimpath) without running a test
# (-run '^$'); the suite's `go test` then finds every package in the Go build cache. About five
# minutes on 2 cores the first time (kube-scheduler's framework packages), seconds after.
if command -v go >/dev/null 2>&1; then
  bash agent/scoreplugin/build.sh \
    || echo "test: agent/scoreplugin/build.sh failed; the Score plugin e2e tests skip (fail under CI)" >&2
  (cd agent/scoreplugin && CGO_ENABLED=0 nice -n 19 go test -p 2 -count=1 -trimpath -run '^$' ./... >/dev/null) \
    || echo "test: compiling the Score plugin's Go tests failed; pytest runs them and shows why" >&2
fi
. .venv/bin/activate
ruff check .
# Two workers (pytest-xdist): each test file is one unit of work, and the files that run real
# services are one group that runs on one worker, file after file (tests/conftest.py).
python -m pytest -n 2 --dist loadfile "$@"
