"""The member clusters of the federation.

- :func:`member_cluster`: which cluster a simulated member runs, by partition id:
  0 an openb GPU training slice (the openb default pods' train part), 1 a CPU web cluster
  with diurnal synthetic load, 2 a small edge cluster, then the three profiles again with
  other seeds, so any number of non-IID members can be simulated.
- :func:`member_from_node_config`: a deployed member's own cluster from its node config
  (its node inventory and recent pods as openb-schema CSVs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.model.traces import (
    builtin_trace,
    fits_somewhere,
    load_nodes,
    load_pods,
    slice_cluster,
    split_by_hash,
)

PROFILES = ("gpu-openb", "web", "edge")


@dataclass
class Member:
    """A member cluster: its nodes, its training pods and its held-out pods."""

    name: str
    nodes: NodeTable
    train: PodTable  # the member's training pods
    test: PodTable  # its held-out pods (evaluation only)


def member_cluster(partition_id: int, openb_nodes: int = 120) -> Member:
    """The simulated member cluster of a partition (see the module docstring)."""
    kind = PROFILES[partition_id % len(PROFILES)]
    seed = 1000 + partition_id
    if kind == "gpu-openb":
        nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
        nodes = slice_cluster(nodes, openb_nodes, seed)
        pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
        pods = fits_somewhere(pods, nodes)
    else:
        nodes, pods = generate_cluster(kind, seed=seed)
    train, test = split_by_hash(pods, 0.3)
    return Member(f"{kind}-{partition_id}", nodes, train, test)


def member_from_node_config(node_config) -> Member | None:
    """A deployed member's own cluster, from its SuperNode's ``--node-config``:
    ``cluster-name``, ``nodes-csv`` and ``pods-csv`` (openb schema: its node inventory and its
    recent pods, e.g. exported from the API server). None in simulation (no ``nodes-csv``)."""
    nodes_csv = node_config.get("nodes-csv") if node_config else None
    if not nodes_csv:
        return None
    pods_csv = node_config.get("pods-csv")
    if not pods_csv:
        raise ValueError("node config: nodes-csv needs pods-csv (the member's recent pods)")
    nodes = load_nodes(str(nodes_csv))
    pods = load_pods(str(pods_csv), nodes, allow_oversized=True)
    train, test = split_by_hash(fits_somewhere(pods, nodes), 0.3)
    return Member(str(node_config.get("cluster-name", Path(str(nodes_csv)).stem)), nodes, train, test)
