"""A cluster's *profile*: what kind of cluster a node inventory is (``web``, ``gpu``, ``edge``).

The serving agent's roll-out gate judges a policy on the evidence of the clusters of its
profile, and a federated member labels its own validation figures with its profile, so both
infer it the same way here:

- :func:`cluster_profile`, the one label of a cluster: GPUs on any node -> ``gpu``; every node
  at most :data:`EDGE_MAX_CORES` cores -> ``edge``; otherwise ``web``.
- :func:`cluster_profiles`, every profile a *mixed* cluster must be judged on: ``gpu`` where
  any node has GPUs, and the profile of its CPU-only nodes (``edge`` when each has at most
  :data:`EDGE_MAX_CORES` cores, ``web`` otherwise) where those hold at least
  :data:`MIXED_CPU_SHARE` of the cluster's cores. A GPU cluster's few CPU-only nodes (the GPU
  profile's validation clusters have them too) leave it ``gpu``; 50 GPU nodes beside 150 web
  nodes make it ``gpu`` and ``web``, and the gate asks for a policy proven on both.

May import: numpy, the standard library and ``fedsched.common.model``.
"""

from __future__ import annotations

from fedsched.common.model.cluster import NodeTable

PROFILES = ("web", "gpu", "edge")
EDGE_MAX_CORES = 8  # an edge cluster's nodes have at most this many CPU cores each
MIXED_CPU_SHARE = 0.25  # CPU-only nodes holding this share of the cores are judged as their own profile


def cluster_profile(nodes: NodeTable) -> str:
    """The profile of a node inventory (module docstring)."""
    if len(nodes) and int(nodes.gpu.sum()) > 0:
        return "gpu"
    if len(nodes) and int(nodes.cpu.max()) <= EDGE_MAX_CORES * 1000:
        return "edge"
    return "web"


def cluster_profiles(nodes: NodeTable) -> tuple[str, ...]:
    """Every profile a (possibly mixed) node inventory is judged on, in :data:`PROFILES` order."""
    if not len(nodes):
        return ("web",)
    gpu = nodes.gpu > 0
    if not gpu.any():
        return (cluster_profile(nodes),)
    cpu_only = ~gpu
    share = float(nodes.cpu[cpu_only].sum()) / max(float(nodes.cpu.sum()), 1.0)
    if not cpu_only.any() or share < MIXED_CPU_SHARE:
        return ("gpu",)
    small = int(nodes.cpu[cpu_only].max()) <= EDGE_MAX_CORES * 1000
    other = "edge" if small else "web"
    return tuple(p for p in PROFILES if p in ("gpu", other))
