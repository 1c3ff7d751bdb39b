"""The pytest side of the real Kubernetes control plane (:mod:`bench.harness.control_plane`):
the binaries, built when missing, or a skip.

:func:`k8s_binaries` returns ``.k8s/bin/`` with etcd, kube-apiserver and kube-scheduler, the ones
``scripts/build_k8s.sh`` builds from their Go modules (etcd 3.7.3, kube-apiserver and
kube-scheduler v1.37.2); when one is missing it runs that script (idempotent: seconds once built,
about 13 minutes the first time on 2 cores). Without Go, or when the build fails, the tests that
need the control plane skip with the reason, and under CI (``CI=true``,
:mod:`tests.require_services`) that skip is a failure. :func:`notice` writes a line past pytest's
capture. Imports :mod:`bench.harness` and ``tests.paths``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.control_plane import BINARIES, K8S_BIN
from bench.harness.control_plane import missing_binaries as _missing_binaries
from bench.harness.processes import tail
from fedsched.experiment import kwok
from tests.paths import REPO

__all__ = ["BINARIES", "BUILD_SCRIPT", "K8S_BIN", "k8s_binaries", "kwok_binary", "notice"]

BUILD_SCRIPT = REPO / "scripts" / "build_k8s.sh"


def notice(message: str) -> None:
    """A line on the terminal past pytest's capture (a 13-minute build should not look hung)."""
    print(f"\ntests: {message}", file=sys.__stderr__, flush=True)


def k8s_binaries(with_kwok: bool = False) -> Path:
    """``.k8s/bin`` with etcd, kube-apiserver and kube-scheduler (and kwok with its configurations
    in ``.k8s/share/kwok/`` with ``with_kwok``), built by ``scripts/build_k8s.sh`` when one is
    missing; skips (a failure under CI) with the reason when they cannot be had."""

    def missing_binaries(bin_dir: Path) -> list[str]:
        return [*_missing_binaries(bin_dir), *(kwok.missing() if with_kwok else [])]

    missing = missing_binaries(K8S_BIN)
    if not missing:
        return K8S_BIN
    if shutil.which("go") is None:
        pytest.skip(f"{', '.join(missing)} not in {K8S_BIN} and go is not on PATH to build them "
                    "(bash scripts/build_k8s.sh; Go >= 1.26)")
    log_path = K8S_BIN.parent / "build.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    notice(f"{', '.join(missing)} missing: bash scripts/build_k8s.sh (about 13 minutes the first time "
           f"on 2 cores; log in {log_path})")
    with log_path.open("wb") as log:
        rc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=log, stderr=subprocess.STDOUT,
                            cwd=REPO, check=False).returncode
    missing = missing_binaries(K8S_BIN)
    if rc != 0 or missing:
        pytest.skip(f"bash scripts/build_k8s.sh failed (exit {rc}; missing {missing}): "
                    f"{tail(log_path, 1500)}")
    return K8S_BIN


def kwok_binary() -> Path:
    """``.k8s/bin/kwok`` (and the control plane's binaries), built when missing; a skip (a failure
    under CI) when they cannot be had."""
    return k8s_binaries(with_kwok=True) / "kwok"
