"""A kube-scheduler stand-in that drives the real HTTP extender the way kube-scheduler does.

One scheduling cycle (:meth:`KubeSchedulerStandIn.schedule`): its filter plugins
(NodeResourcesFit and the GPU checks, on its own copy of the cluster), kube-scheduler's sampling
of the feasible nodes (``percentageOfNodesToScore``, :func:`num_feasible_nodes_to_find`), then
the extender's filter verb, then its score plugins (the default profile's NodeResourcesFit
LeastAllocated + BalancedAllocation, weight 1 each) plus ``extender score * weight * 10`` with
the weight of the shipped KubeSchedulerConfiguration, ``selectHost`` (the best total, ties at
random), and the bind verb.

Sampling (kubernetes pkg/scheduler/schedule_one.go, ``numFeasibleNodesToFind`` and
``findNodesThatPassFilters``): below 100 nodes every node; else ``percentage`` of all nodes
(0 = adaptive: ``50 - nodes/125``, at least 5), at least 100. The filter plugins run over the
nodes in order from a rotating start index and stop once that many feasible nodes are found;
the next cycle starts after the last node examined. The extender sees only those nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import yaml

from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.common.model.cluster import USE_REQUESTS, ClusterState, Pod
from fedsched.common.schedulers.kube_default import KubeDefault

MIN_FEASIBLE_NODES_TO_FIND = 100  # schedule_one.go minFeasibleNodesToFind
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5  # minFeasibleNodesPercentageToFind
BASE_PERCENTAGE_OF_NODES_TO_SCORE = 50  # config.DefaultPercentageOfNodesToScore's adaptive base


def num_feasible_nodes_to_find(percentage: int, num_all_nodes: int) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind`` (``percentage`` 0: the adaptive default)."""
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    if percentage == 0:
        percentage = BASE_PERCENTAGE_OF_NODES_TO_SCORE - num_all_nodes // 125
        percentage = max(percentage, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    n = num_all_nodes * percentage // 100
    return max(n, MIN_FEASIBLE_NODES_TO_FIND)


def shipped_profile() -> dict:
    """The ``fedsched`` profile of the shipped sample KubeSchedulerConfiguration."""
    (prof,) = [p for p in shipped_config()["profiles"] if p["schedulerName"] == "fedsched"]
    return prof


def shipped_config() -> dict:
    path = resources.files("fedsched.agent").joinpath("deploy", "kube-scheduler-config.yaml")
    return yaml.safe_load(path.read_text())


def extender_weight() -> int:
    (ext,) = shipped_config()["extenders"]
    return int(ext["weight"])


@dataclass
class Cycle:
    """What one scheduling cycle saw and did."""

    node: int  # the node bound, -1 if the pod fits nowhere
    sampled: list[str] = field(default_factory=list)  # what kube-scheduler sent the extender's filter
    passed: list[str] = field(default_factory=list)  # what the extender's filter kept
    failed: dict[str, str] = field(default_factory=dict)  # what it refused, with the reasons


class KubeSchedulerStandIn:
    """Filter -> sample -> extender filter -> plugin scores + extender scores -> selectHost -> bind."""

    def __init__(self, client, nodes, select_gpus, weight: int, seed: int, percentage: int = 100) -> None:
        self.client = client
        self.state = ClusterState(nodes, use_source=USE_REQUESTS)  # the scheduler's own cache
        self.names = nodes.names
        self.index = {n: i for i, n in enumerate(nodes.names)}
        self.models = nodes.models
        self.select_gpus = select_gpus  # the GPU device plugin's rule (fedsched binds with the same)
        self.weight = weight
        self.rng = np.random.default_rng(seed)
        self.plugins = KubeDefault()
        self.percentage = percentage
        self.next_start = 0  # nextStartNodeIndex
        self.bound: dict[str, tuple[int, Pod, tuple[int, ...]]] = {}

    def sample(self, pod: Pod) -> np.ndarray:
        """The feasible nodes kube-scheduler's filter stage hands on (sampled, in its order)."""
        feasible = self.state.feasible(pod)
        n = len(feasible)
        want = num_feasible_nodes_to_find(self.percentage, n)
        order = (self.next_start + np.arange(n)) % n
        hits = np.flatnonzero(feasible[order])
        if len(hits) > want:
            hits = hits[:want]
            processed = int(hits[-1]) + 1
        else:
            processed = n
        self.next_start = (self.next_start + processed) % n if n else 0
        return order[hits]

    def prioritize(self, pod_json: dict, names: list[str]) -> list[int]:
        status, prio = self.client.post("prioritize", {"Pod": pod_json, "NodeNames": names, "Nodes": None})
        assert status == 200 and [h["Host"] for h in prio] == names
        return [h["Score"] for h in prio]

    def schedule(self, pod: Pod, uid: str, bind: bool = True) -> Cycle:
        sampled = self.sample(pod)
        if not len(sampled):
            return Cycle(-1)
        pod_json = pod_to_json(pod, uid, self.models, uid=uid)
        names = [self.names[i] for i in sampled]
        status, out = self.client.post("filter", {"Pod": pod_json, "NodeNames": names, "Nodes": None})
        assert status == 200 and out["Error"] == ""
        passed = out["NodeNames"] or []
        if not passed:
            return Cycle(-1, names, [], out["FailedNodes"])
        ids = np.array([self.index[n] for n in passed])
        ext = np.array(self.prioritize(pod_json, passed))
        total = self.plugins.score(self.state, pod, ids) + ext * self.weight * 10
        best = np.flatnonzero(total == total.max())
        node = int(ids[best[self.rng.integers(len(best))]])
        if bind:
            self.bind(pod, uid, node)
        return Cycle(node, names, passed, out["FailedNodes"])

    def bind(self, pod: Pod, uid: str, node: int) -> None:
        status, out = self.client.post(
            "bind", {"PodName": uid, "PodNamespace": "default", "PodUID": uid, "Node": self.names[node]}
        )
        assert (status, out) == (200, {"Error": ""})
        gpus = self.select_gpus(self.state, pod, node)
        self.state.allocate(node, pod, gpus)
        self.bound[uid] = (node, pod, gpus)

    def forget(self, uid: str) -> None:
        """The pod ended or was evicted (kube-scheduler's cache sees it through its informer)."""
        node, pod, gpus = self.bound.pop(uid)
        self.state.release(node, pod, gpus)
