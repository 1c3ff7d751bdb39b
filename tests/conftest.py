"""Shared fixtures (the openb cluster and pods); array builders live in tests/builders.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods

pytest_plugins = ["tests.require_services", "pytester"]


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread for a module of small forward passes: on a busy machine a
    pool of threads spins against itself, and a call can take hundreds of milliseconds (use:
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def run_cache_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The commands a test starts (``fedsched evidence``, the benchmarks) cache baselines' runs in
    a directory of the test session, never in the user's ``~/.cache``."""
    path = tmp_path_factory.mktemp("run-cache")
    before = os.environ.get("FEDSCHED_RUN_CACHE")
    os.environ["FEDSCHED_RUN_CACHE"] = str(path)
    yield path
    if before is None:
        os.environ.pop("FEDSCHED_RUN_CACHE", None)
    else:
        os.environ["FEDSCHED_RUN_CACHE"] = before


@pytest.fixture(scope="session")
def openb_gpu_nodes() -> NodeTable:
    return load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))


@pytest.fixture(scope="session")
def openb_default_pods(openb_gpu_nodes) -> PodTable:
    return load_pods(builtin_trace("openb_pod_list_default.csv"), openb_gpu_nodes)


# Under pytest-xdist (``bash scripts/test.sh`` runs ``-n 2 --dist loadfile``) each test file is one
# unit of work, so its module fixtures run once; the files that run real services (the Kubernetes
# control plane and kwok, Flower's runtime and Ray, the hub and its gateway, the Helm-rendered
# federation) are one unit together: one worker runs them file after file, as a serial run does,
# so they never compete with each other for the machine, fixed ports or Ray's local cluster. (Done
# by the scheduler below, which reads node ids only: xdist's own ``loadgroup`` writes a group into
# each test's node id, which pytest 9.2's node ids no longer take, pytest-xdist issue #1386.)
SERVICE_FILES = (
    "tests/agent/k8s/",
    "tests/agent/federation/test_client_app.py",
    "tests/agent/learning/test_credit_regression.py",
    "tests/charts/test_chart_federation.py",
    "tests/coordinator/test_download.py",
    "tests/coordinator/test_federation.py",
    "tests/coordinator/test_mtls.py",
    "tests/experiment/test_federate.py",
    "tests/experiment/test_fleet.py",
    "tests/experiment/test_kwok.py",
)


def xdist_group_of(nodeid: str) -> str:
    """The unit of work of a test under ``--dist loadfile``: its file, or ``services``."""
    path = nodeid.split("::", 1)[0]
    return "services" if path.startswith(SERVICE_FILES) else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown to pytest without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with the service files as one unit (see :func:`xdist_group_of`)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ServiceGroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    return ServiceGroupScheduling(config, log)
