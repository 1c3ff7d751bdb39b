"""A cluster's *profile*: what kind of cluster a node inventory is (``web``, ``gpu``, ``edge``).

The serving agent's roll-out gate judges a policy on the validation figures of the clusters of
its profile, and a federated member labels its own validation figures with its profile, so both
infer it the same way here (:func:`cluster_profile`): GPUs on any node -> ``gpu``; every node
at most :data:`EDGE_MAX_CORES` cores -> ``edge``; otherwise ``web``.

May import: numpy, the standard library and ``fedsched.common.model``.
"""

from __future__ import annotations

from fedsched.common.model.cluster import NodeTable

PROFILES = ("web", "gpu", "edge")
EDGE_MAX_CORES = 8  # an edge cluster's nodes have at most this many CPU cores each


def cluster_profile(nodes: NodeTable) -> str:
    """The profile of a node inventory (module docstring)."""
    if len(nodes) and int(nodes.gpu.sum()) > 0:
        return "gpu"
    if len(nodes) and int(nodes.cpu.max()) <= EDGE_MAX_CORES * 1000:
        return "edge"
    return "web"
