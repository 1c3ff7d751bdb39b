"""Shared fixtures (the openb cluster and pods); array builders live in tests/builders.py."""

from __future__ import annotations

import pytest

from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods

pytest_plugins = ["tests.require_services", "pytester"]


@pytest.fixture(scope="session")
def openb_gpu_nodes() -> NodeTable:
    return load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))


@pytest.fixture(scope="session")
def openb_default_pods(openb_gpu_nodes) -> PodTable:
    return load_pods(builtin_trace("openb_pod_list_default.csv"), openb_gpu_nodes)
