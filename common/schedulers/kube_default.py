"""kube-scheduler's default profile in a resource-only simulation, as Kubernetes v1.37.2 scores.

The project pins Kubernetes v1.37.2 (``scripts/build_k8s.sh``); every reference below is a file
of the module ``k8s.io/kubernetes@v1.37.2`` (``$(go env GOMODCACHE)``), under
``pkg/scheduler/``.

**Which plugins, which weights.** ``apis/config/v1/default_plugins.go`` (``getDefaultPlugins``)
enables, with score weights: TaintToleration 3, NodeAffinity 2, NodeResourcesFit 1,
PodTopologySpread 2, InterPodAffinity 2, NodeResourcesBalancedAllocation 1, ImageLocality 1
(the feature-gated additions, DynamicResources 2 and PodGroupPodsCount 1, score nothing here).
In a cluster without taints, affinities, spread constraints, owners or images all but two are
constant over the nodes or skip themselves in PreScore (TaintToleration normalises to 100 on
every node, ImageLocality is 0), so the ranking is decided by
``1 * NodeResourcesFit + 1 * NodeResourcesBalancedAllocation``. ``apis/config/v1/defaults.go``
(``SetDefaults_NodeResourcesFitArgs``, ``SetDefaults_NodeResourcesBalancedAllocationArgs``):
both score ``cpu`` and ``memory``, weight 1 each; Fit's strategy is ``LeastAllocated``; GPUs
(``nvidia.com/gpu``, an extended resource) are not in either list. Neither plugin has a
NormalizeScore (``ScoreExtensions() == nil``); ``framework/runtime/framework.go``
(``normalizeScores``) sums ``score * weight`` over the plugins, and ``schedule_one.go``
(``prioritizeNodes``, ``framework/sorted_nodes.go``) takes the best total, ties broken at random
(here :func:`~fedsched.common.schedulers.base.place`). :meth:`KubeDefault.score` returns that
total minus the node-independent constants, so its range is 50..200.

**NodeResourcesFit, LeastAllocated** (``framework/plugins/noderesources/least_allocated.go``
``leastResourceScorer`` / ``leastRequestedScore``; the inputs from ``resource_allocation.go``
``calculateNodeAllocatableRequest`` with ``useRequested == false``)::

    req_r = NonZeroRequested_r(node) + nonzero_request_r(pod)
    s_r   = (cap_r - req_r) * 100 / cap_r        (0 if req_r > cap_r), integer division
    fit   = (s_cpu * 1 + s_mem * 1) / (1 + 1)    integer division; a resource whose
                                                 allocatable is 0 is left out of both sums
                                                 (0 if none is left)

Non-zero requests: a container with no cpu / memory request counts
``schedutil.DefaultMilliCPURequest`` = 100 m and ``DefaultMemoryRequest`` = 200 MiB
(``util/pod_resources.go``; ``framework/types.go`` ``getNonMissingContainerRequests`` for the
node's ``NonZeroRequested``). Only a *missing* request is replaced; fedsched's pod model has no
"explicit 0", a 0 is missing (``Pod.cpu_nonzero``, and ``pod_to_json`` omits it).

**NodeResourcesBalancedAllocation** (``framework/plugins/noderesources/balanced_allocation.go``
``balancedResourceScorer`` / ``balancedResourceScore``; ``useRequested == true``: the *actual*
requests, no 100 m / 200 MiB defaults). Since Kubernetes 1.36 it scores the change in balance
that the pod causes::

    f_r(x)     = min(x_r / cap_r, 1)               float64; resources with cap_r == 0 left out
    std(x)     = |f_cpu(x) - f_mem(x)| / 2          (two resources; 0 with fewer)
    balance(x) = int64((1 - std(x)) * 100)          truncation, in 50..100
    with    = balance(Requested(node) + request(pod))
    without = balance(Requested(node))
    balanced = 50 + (50 + with - without) / 2       integer division (the operand is 0..100)

A best-effort pod (cpu and memory requests both 0) is skipped in PreScore (``isBestEffortPod``,
kubernetes#129138): the plugin adds 0 on every node. The classic form of 1.23-1.35 was
``balance(Requested(node) + request(pod))`` alone (50..100); fedsched's ``balanced-allocation``
baseline (:mod:`fedsched.common.schedulers.balanced_allocation`) still implements that one.

Units: fedsched counts memory in MiB and kube in bytes; both formulas only use ratios of
integers (exact under the power-of-two scale) and 200 MiB is exact, so the numbers are kube's.

Not modelled: OpportunisticBatching's reuse of the previous cycle's ranking for consecutive
identical pods (``framework/runtime/batch.go``), DRA-backed extended resources, pod-level
resources and the other plugins' scores beyond the constants above.

GPUs are an extended resource the default profile does not score; a sharing pod's GPU is the
best-fitting one (:meth:`Scheduler.select_gpus`).

Arguments: none (an empty ``KubeDefaultArgs``). This is the *default* profile: plugin weights
1 and 1 and NodeResourcesFit's default cpu / memory weights (1, 1). Other fit weights are
``least-allocated`` with ``LeastAllocatedArgs``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, SchedulerContext
from fedsched.common.schedulers.kube_default_kernel import top_kernel

MAX_NODE_SCORE = 100  # fwk.MaxNodeScore
FIT_WEIGHT = 1  # default_plugins.go: NodeResourcesFit
BALANCED_ALLOCATION_WEIGHT = 1  # default_plugins.go: NodeResourcesBalancedAllocation
CPU_WEIGHT = MEMORY_WEIGHT = 1  # defaults.go: defaultResourceSpec


def _least_requested(cap: np.ndarray, req: np.ndarray) -> np.ndarray:
    """``leastRequestedScore``: ``(cap - req) * 100 / cap``, 0 if ``req > cap`` or ``cap == 0``."""
    return np.maximum(cap - req, 0) * MAX_NODE_SCORE // np.maximum(cap, 1)


def fit_least_allocated(state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    """NodeResourcesFit's LeastAllocated score (int64, 0..100), ``leastResourceScorer``."""
    cap_cpu, cap_mem = state.nodes.cpu[nodes], state.nodes.mem[nodes]
    s_cpu = _least_requested(cap_cpu, state.cpu_req_nz[nodes] + pod.cpu_nonzero)
    s_mem = _least_requested(cap_mem, state.mem_req_nz[nodes] + pod.mem_nonzero)
    score = (s_cpu * CPU_WEIGHT + s_mem * MEMORY_WEIGHT) // (CPU_WEIGHT + MEMORY_WEIGHT)  # all >= 0
    no_cpu, no_mem = cap_cpu == 0, cap_mem == 0
    if no_cpu.any() or no_mem.any():  # left out of both sums; none left: 0 (s_cpu = s_mem = 0)
        score = np.where(no_cpu, s_mem, np.where(no_mem, s_cpu, score))
    return score


def balanced_resource_score(req_cpu: np.ndarray, req_mem: np.ndarray, cap_cpu: np.ndarray,
                            cap_mem: np.ndarray) -> np.ndarray:
    """``balancedResourceScore``: ``int64((1 - |f_cpu - f_mem| / 2) * 100)``, int64 50..100.

    ``f = min(req / cap, 1)`` in float64; a resource with ``cap == 0`` is left out, and with fewer
    than two fractions the deviation is 0 (score 100)."""
    f_cpu = np.minimum(req_cpu / np.maximum(cap_cpu, 1), 1.0)
    f_mem = np.minimum(req_mem / np.maximum(cap_mem, 1), 1.0)
    std = np.abs(f_cpu - f_mem) / 2
    missing = (cap_cpu == 0) | (cap_mem == 0)
    if missing.any():
        std = np.where(missing, 0.0, std)
    return ((1 - std) * float(MAX_NODE_SCORE)).astype(np.int64)


def balanced_allocation_v137(state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    """NodeResourcesBalancedAllocation of Kubernetes 1.36+ (``balancedResourceScorer``): int64,
    ``50 + (50 + with_pod - without_pod) // 2`` (50..100); 0 everywhere for a best-effort pod."""
    if pod.cpu == 0 and pod.mem == 0:
        return np.zeros(len(nodes), dtype=np.int64)
    cpu, mem = state.cpu_req[nodes], state.mem_req[nodes]
    # Row 0 with the pod, row 1 without: one vectorised pass for both.
    with_pod, without = balanced_resource_score(
        np.stack((cpu + pod.cpu, cpu)), np.stack((mem + pod.mem, mem)),
        state.nodes.cpu[nodes], state.nodes.mem[nodes])
    half = MAX_NODE_SCORE // 2
    return half + (half + with_pod - without) // 2  # the operand is in 0..100: Go's / is //


def kube_default_scores(state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    """The default profile's weighted sum (int64, 50..200; 0..100 for a best-effort pod)."""
    return (FIT_WEIGHT * fit_least_allocated(state, pod, nodes)
            + BALANCED_ALLOCATION_WEIGHT * balanced_allocation_v137(state, pod, nodes))


def _least_requested_one(cap: int, req: int) -> int:
    return max(cap - req, 0) * MAX_NODE_SCORE // max(cap, 1)


def _balance_one(req_cpu: int, req_mem: int, cap_cpu: int, cap_mem: int) -> int:
    if cap_cpu == 0 or cap_mem == 0:
        return MAX_NODE_SCORE
    std = abs(min(req_cpu / cap_cpu, 1.0) - min(req_mem / cap_mem, 1.0)) / 2
    return int((1 - std) * float(MAX_NODE_SCORE))


def kube_default_score_one(cap_cpu: int, cap_mem: int, cpu_req: int, mem_req: int, cpu_req_nz: int,
                           mem_req_nz: int, pod: Pod) -> float:
    """:func:`kube_default_scores` of one node from its totals, in Python scalars: the same
    operations on the same IEEE doubles and integers (ints below 2**53 convert exactly, ``/`` is
    correctly rounded either way, ``int()`` truncates as ``astype(int64)``), so the same value
    (``tests/common/schedulers/test_sched_kube_default.py`` checks it against the vector form)."""
    s_cpu = _least_requested_one(cap_cpu, cpu_req_nz + pod.cpu_nonzero)
    s_mem = _least_requested_one(cap_mem, mem_req_nz + pod.mem_nonzero)
    if cap_cpu == 0:
        fit = s_mem
    elif cap_mem == 0:
        fit = s_cpu
    else:
        fit = (s_cpu * CPU_WEIGHT + s_mem * MEMORY_WEIGHT) // (CPU_WEIGHT + MEMORY_WEIGHT)
    if pod.cpu == 0 and pod.mem == 0:
        return float(FIT_WEIGHT * fit)
    half = MAX_NODE_SCORE // 2
    with_pod = _balance_one(cpu_req + pod.cpu, mem_req + pod.mem, cap_cpu, cap_mem)
    without = _balance_one(cpu_req, mem_req, cap_cpu, cap_mem)
    return float(FIT_WEIGHT * fit + BALANCED_ALLOCATION_WEIGHT * (half + (half + with_pod - without) // 2))


@dataclass(frozen=True)
class KubeDefaultArgs(SchedulerArgs):
    """kube-default has no knobs: the default profile is fixed by definition."""


SCORE_CACHE_SIZE = 1024  # (state, pod shape) entries a KubeDefault keeps (cleared when full) ...
SCORE_CACHE_BYTES = 32 << 20  # ... and no more than this many bytes of them (16 bytes a node)
SCALAR_MAX = 12  # up to this many nodes to score again: the scalar form, else the vector form


class KubeDefault(Scheduler):
    """The default profile (module docstring). A node's score is a function of that node's
    requests and capacity and of the pod's requests alone, so the scores over all nodes are
    kept per (state, pod request shape) and only nodes whose ``ClusterState.version`` moved are
    scored again: elementwise the same operations on the same operands, the same bits.

    :meth:`top_nodes` (``place``'s shortcut over all nodes) keeps, per (state, pod fit shape),
    one array holding each node's score where the pod fits and ``-inf`` where it does not, kept
    the same way: the best alive nodes are then a max and a comparison over it."""

    name = "kube-default"
    Args = KubeDefaultArgs

    def __init__(self, ctx: SchedulerContext | None = None, args: SchedulerArgs | None = None) -> None:
        super().__init__(ctx, args)
        self._cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._top_cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def __getstate__(self) -> dict[str, object]:
        # State serials are unique within one process only: a copy or a pickle (another
        # process) starts with an empty cache.
        return {**self.__dict__, "_cache": {}, "_top_cache": {}}

    def __setstate__(self, d: dict[str, object]) -> None:
        self.__dict__.update({"_top_cache": {}, **d})  # a pickle from before _top_cache existed

    def top_nodes(self, state: ClusterState, pod: Pod) -> np.ndarray:
        """The alive nodes where ``pod`` fits with the highest score, ids ascending (empty when
        it fits nowhere): the nodes :func:`~fedsched.common.schedulers.base.rank` over all nodes
        ties between, from the same scores (:meth:`score`'s values, ``ClusterState.fits``'s
        answers). One compiled pass over the nodes (``kube_default_kernel``) when numba is
        there, the numpy form otherwise."""
        n = len(state.nodes)
        key = (state.serial, n, *state.fit_key(pod))
        cache = self._top_cache
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= min(SCORE_CACHE_SIZE, max(1, SCORE_CACHE_BYTES // (16 * max(n, 1)))):
                cache.clear()
            hit = cache[key] = (np.empty(n), np.full(n, -1, dtype=np.int64))  # versions are >= 0
        eff, seen = hit
        if top_kernel is not None:
            nt = state.nodes
            out = np.empty(n, dtype=np.int64)
            k = top_kernel(eff, seen, state.version, state.alive, nt.cpu, nt.mem, state.cpu_req,
                           state.mem_req, state.cpu_req_nz, state.mem_req_nz, state.gpu_free, nt.model,
                           pod.cpu, pod.mem, pod.num_gpu, pod.gpu_milli, pod.spec_mask, out)
            return out[:k]
        version = state.version
        # Each node's version is read before it is recomputed (as in score()).
        stale = np.flatnonzero(seen != version)
        if len(stale) > SCALAR_MAX:
            v = version[stale]
            eff[stale] = np.where(state.fits(pod, stale),
                                  kube_default_scores(state, pod, stale).astype(np.float64), -np.inf)
            seen[stale] = v
        elif len(stale):
            nt = state.nodes
            for i in stale.tolist():
                v = version[i]
                eff[i] = kube_default_score_one(
                    int(nt.cpu[i]), int(nt.mem[i]), int(state.cpu_req[i]), int(state.mem_req[i]),
                    int(state.cpu_req_nz[i]), int(state.mem_req_nz[i]), pod,
                ) if state.fits_one(pod, i) else -np.inf
                seen[i] = v
        alive = state.alive
        if not alive.all():
            eff = np.where(alive, eff, -np.inf)
        best = eff.max()
        if best == -np.inf:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(eff == best)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        key = (state.serial, len(state.nodes), pod.cpu, pod.mem, pod.cpu_nonzero, pod.mem_nonzero)
        hit = self._cache.get(key)
        # Each node's version is read before its score is computed: a score computed while an
        # allocate moves the node is kept under the older version and computed again next time.
        if hit is None:
            n = len(state.nodes)
            if len(self._cache) >= min(SCORE_CACHE_SIZE, max(1, SCORE_CACHE_BYTES // (16 * max(n, 1)))):
                self._cache.clear()
            seen = state.version.copy()
            hit = self._cache[key] = (kube_default_scores(state, pod, np.arange(n)).astype(np.float64), seen)
        else:
            scores, seen = hit
            stale = np.flatnonzero(seen != state.version)
            if len(stale) > SCALAR_MAX:
                v = state.version[stale]
                scores[stale] = kube_default_scores(state, pod, stale)
                seen[stale] = v
            elif len(stale):  # a few nodes (one bind, a departure): Python scalars beat numpy calls
                nt = state.nodes
                for n in stale.tolist():
                    v = state.version[n]
                    scores[n] = kube_default_score_one(
                        int(nt.cpu[n]), int(nt.mem[n]), int(state.cpu_req[n]), int(state.mem_req[n]),
                        int(state.cpu_req_nz[n]), int(state.mem_req_nz[n]), pod)
                    seen[n] = v
        return hit[0][nodes]
