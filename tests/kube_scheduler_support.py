"""A kube-scheduler stand-in that drives the real HTTP extender the way kube-scheduler v1.37.2 does.

One scheduling cycle (:meth:`KubeSchedulerStandIn.schedule`, after ``schedulePod`` in
``pkg/scheduler/schedule_one.go``): its filter plugins on its own copy of the cluster, the
sampling of the feasible nodes (``percentageOfNodesToScore``, :func:`num_feasible_nodes_to_find`),
the extender's filter verb; if exactly one node is left, that node without any scoring;
otherwise its score plugins plus ``extender score * weight * 10`` (``prioritizeNodes``; the weight
of the shipped KubeSchedulerConfiguration), ``selectHost`` (the best total, ties at random), and
the bind verb.

What it models:

- **Filters** (``kube_filters=True``, what the real one does): NodeResourcesFit's filter as the
  real scheduler sees the Pod objects ``pod_to_json`` writes: cpu and memory requests
  (not the non-zero defaults) against allocatable, the ``pods`` allocatable ``node_to_json``
  sets (110), and whole GPUs as the extended resource ``nvidia.com/gpu`` (a count per node,
  booked by whole-GPU pods only). GPU shares (``alibabacloud.com/gpu-milli``, an annotation)
  and GPU models (``alibabacloud.com/gpu-card-model``, an annotation) are unknown to it: a sharing pod
  passes any node with cpu and memory room, GPU-less or full ones included, and it is the
  extender's filter that refuses them. ``kube_filters=False`` (the default, for tests that
  compare the candidate sets with ``ClusterState.feasible``) filters with the agent's own
  accounting instead (``ClusterState.feasible``: shares and models as well), so the extender
  is only offered nodes the pod fits.
- **Sampling** (kubernetes ``numFeasibleNodesToFind`` and ``findNodesThatPassFilters``): below
  100 nodes every node; else ``percentage`` of all nodes (0 = adaptive: ``50 - nodes/125``, at
  least 5), at least 100. The filter plugins run over the nodes in order from a rotating start
  index and stop once that many feasible nodes are found; the next cycle starts after the last
  node examined. The extender sees only those nodes.
- **One node left** (``skip_single_node=True``, what the real one does): when the extender's
  filter leaves exactly one node, ``schedulePod`` returns it at once: no score plugins and no
  extender prioritize call (:attr:`Cycle.prioritized` is False). ``skip_single_node=False``
  (the default, for tests that expect one prioritize call per bound pod) prioritizes anyway;
  the pick is the same node either way.
- **Scores**: the default profile through :class:`~fedsched.common.schedulers.kube_default.
  KubeDefault` (NodeResourcesFit LeastAllocated + NodeResourcesBalancedAllocation as v1.37.2
  scores them, weight 1 each; that module's docstring has the formulas), on the stand-in's
  requests; the other default plugins are constant in these clusters.

What it does not model: the scheduling queue (backoff, retries, activeQ order: a pod that fits
nowhere just gets ``node == -1``), preemption (PostFilter), the other filter plugins (taints,
affinity, ports, volumes, unschedulable nodes beyond ``ClusterState.alive``), OpportunisticBatching
(the reuse of the previous cycle's ranking for identical pods), the parallel filter's
nondeterministic node order, the informer lag (a bind updates its cache at once), extender
errors and timeouts (``ignorable``), and binding through the API server (the bind verb is called
directly).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import yaml

from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.common.model.cluster import MAX_GPUS_PER_NODE, USE_REQUESTS, ClusterState, Pod
from fedsched.common.schedulers.kube_default import KubeDefault

MIN_FEASIBLE_NODES_TO_FIND = 100  # schedule_one.go minFeasibleNodesToFind
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5  # minFeasibleNodesPercentageToFind
BASE_PERCENTAGE_OF_NODES_TO_SCORE = 50  # config.DefaultPercentageOfNodesToScore's adaptive base
POD_CAPACITY = 110  # the ``pods`` allocatable of node_to_json's Node objects


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
    prioritized: bool = False  # whether scores (and the extender's prioritize verb) were asked


class KubeSchedulerStandIn:
    """Filter -> sample -> extender filter -> [one node: it] plugin scores + extender scores ->
    selectHost -> bind."""

    def __init__(self, client, nodes, select_gpus, weight: int, seed: int, percentage: int = 100, *,
                 kube_filters: bool = False, skip_single_node: bool = False) -> None:
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
        self.kube_filters = kube_filters  # filter as the real kube-scheduler (module docstring)
        self.skip_single_node = skip_single_node  # one node left: no scoring (module docstring)
        self.next_start = 0  # nextStartNodeIndex
        self.bound: dict[str, tuple[int, Pod, tuple[int, ...]]] = {}

    def feasible(self, pod: Pod) -> np.ndarray:
        """Mask of the nodes its filter plugins pass (``kube_filters``: the module docstring)."""
        s = self.state
        if not self.kube_filters:
            return s.feasible(pod)
        pods = np.bincount([node for node, _, _ in self.bound.values()], minlength=len(self.names))
        ok = s.alive & (s.cpu_free >= pod.cpu) & (s.mem_free >= pod.mem) & (pods < POD_CAPACITY)
        if pod.num_gpu and not pod.is_gpu_share:  # nvidia.com/gpu: whole GPUs booked per node
            whole = s.gpu_tag_pods[:, 1:] @ np.arange(1, MAX_GPUS_PER_NODE + 1)
            ok &= whole + pod.num_gpu <= s.nodes.gpu
        return ok

    def sample(self, pod: Pod) -> np.ndarray:
        """The feasible nodes kube-scheduler's filter stage hands on (sampled, in its order)."""
        feasible = self.feasible(pod)
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
        prioritized = not (self.skip_single_node and len(ids) == 1)
        if prioritized:
            ext = np.array(self.prioritize(pod_json, passed))
            total = self.plugins.score(self.state, pod, ids) + ext * self.weight * 10
            best = np.flatnonzero(total == total.max())
            node = int(ids[best[self.rng.integers(len(best))]])
        else:  # schedulePod: "When only one node after predicate, just use it."
            node = int(ids[0])
        if bind:
            self.bind(pod, uid, node)
        return Cycle(node, names, passed, out["FailedNodes"], prioritized)

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
