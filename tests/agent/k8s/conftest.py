"""The real control plane for the tests in this folder (see :mod:`bench.harness.control_plane`; the
binaries from :func:`tests.k8s_support.k8s_binaries`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.harness.control_plane import ControlPlane, control_plane
from tests.k8s_support import k8s_binaries


@pytest.fixture(scope="session")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver v1.37.2 on loopback for the whole session (built by
    ``scripts/build_k8s.sh`` when missing; a skip, failing under CI, when they cannot be had)."""
    bin_dir = k8s_binaries()
    with control_plane(tmp_path_factory.mktemp("k8s-control-plane"), bin_dir) as cp:
        yield cp
