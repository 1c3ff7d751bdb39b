"""Koordinator LoadAware scheduling: refuse hot nodes, prefer the least used ones.

Upstream: koordinator-sh/koordinator pkg/scheduler/plugins/loadaware (load_aware.go ``Filter``,
``filterNodeUsage``, ``Score``, ``loadAwareSchedulingScorer``, ``leastUsedScore``; helper.go
``isNodeMetricExpired``), its estimator package (estimator/default_estimator.go
``estimatedUsedByResource``) and the defaults in pkg/scheduler/apis/config/v1/defaults.go
(``SetDefaults_LoadAwareSchedulingArgs``), validated as in pkg/scheduler/apis/config/validation/
validation_pluginargs.go (``ValidateLoadAwareSchedulingArgs``).

Estimated usage, per resource (CPU in milli-cores, memory in bytes, integers as upstream):
``estimated = node usage + estimate of the incoming pod``; the pod's estimate is
``round(max(request, limit) * scalingFactor / 100)`` (capped at the limit), or 250m CPU /
200 MiB memory when it requests nothing. fedsched pods carry requests only (no limits), so the
estimate is ``round(request * factor / 100)`` with the default factors CPU 85, memory 70.

Filter (``filterNodeUsage``): a node is refused when, for a resource with a threshold > 0,
``round(estimated / allocatable * 100) > threshold`` (defaults CPU 65, memory 95; 0 disables the
resource), and when its metrics are expired: ``age >= nodeMetricExpirationSeconds`` (180).
A node without any metrics (``NotFound``) passes the filter.

Score (``loadAwareSchedulingScorer``): per resource ``leastUsedScore = (cap - used) * 100 / cap``
(integer division; 0 when used > cap or cap = 0), node score = ``(sum_r score_r * w_r +
dominantScore * dominantWeight) / (sum_r w_r + dominantWeight)`` (integer division), where
``dominantScore`` = the smallest per-resource score (only with a dominant weight, the DRF variant).
A node without metrics, or with expired metrics, scores 0.

A score-only port: fedsched's scorer interface has no filter and ``place`` takes the best of the
feasible nodes (finite scores only), so a node the upstream filter refuses gets its upstream
score minus ``REFUSED_OFFSET`` (101): in [-101, -1], below every node the filter keeps (0..100).
It is chosen only when every candidate is refused (upstream then leaves the pod pending), and
then by the same order (least used first).

Measurements: the node usage is the latest measured use, ``state.cpu_used`` / ``mem_used`` (the
replay simulator's usage model; in serving the Prometheus recording rules, see
agent/cluster/telemetry.py; upstream reads koordlet's NodeMetric; the node's requests where
nothing measures it, packing mode and serving without telemetry: ``ClusterState``'s one
definition of real use). The metrics' age is
``state.telemetry.metrics_age_s`` (serving: the age of each node's newest sample at the last
refresh; ``inf`` for a node Prometheus never had); when it is None or NaN (packing, replay) the
metrics are fresh (fedsched.common.schedulers.load_stats).

Not ported: the estimate of pods assigned since the last NodeMetric report (upstream's
podAssignCache adds ``max(0, estimate - measured)`` of recently assigned pods), Prod/Batch
priority classes and their thresholds (``prodUsageThresholds``, ``scoreAccordingProdUsage``),
percentile (``aggregated``) usage, per-node thresholds from node annotations, DaemonSet pods
skipping the filter, ``enableScheduleWhenNodeMetricsExpired`` (false: expired nodes refused)
and the estimator choice (only the default estimator exists upstream).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, check_int
from fedsched.common.schedulers.load_stats import node_age
from fedsched.common.schedulers.target_load_packing import go_round

MAX_NODE_SCORE = 100  # k8s.io/kube-scheduler framework MaxNodeScore
REFUSED_OFFSET = MAX_NODE_SCORE + 1  # a refused node scores below every node the filter keeps
MIB = 1024 * 1024
DEFAULT_MILLI_CPU_REQUEST = 250  # estimator DefaultMilliCPURequest
DEFAULT_MEMORY_REQUEST = 200 * MIB  # estimator DefaultMemoryRequest (bytes)


@dataclass(frozen=True)
class KoordinatorLoadAwareArgs(SchedulerArgs):
    """LoadAware's arguments (upstream ``LoadAwareSchedulingArgs``, CPU and memory entries)."""

    cpu_weight: int = 1
    """resourceWeights[cpu]: weight of CPU in the score; an integer in [0, 100] (0: not scored)"""
    memory_weight: int = 1
    """resourceWeights[memory]: weight of memory in the score; an integer in [0, 100] (0: not scored)"""
    dominant_resource_weight: int = 0
    """dominantResourceWeight: weight of the smallest per-resource score (DRF); an integer in [0, 100]"""
    cpu_usage_threshold: int = 65
    """usageThresholds[cpu]: refuse nodes whose estimated CPU use passes this %; [0, 100] (0: off)"""
    memory_usage_threshold: int = 95
    """usageThresholds[memory]: refuse nodes whose estimated memory use passes this %; [0, 100] (0: off)"""
    cpu_estimated_scaling_factor: int = 85
    """estimatedScalingFactors[cpu]: a pod is estimated to use this % of its CPU request; [1, 100]"""
    memory_estimated_scaling_factor: int = 70
    """estimatedScalingFactors[memory]: a pod is estimated to use this % of its memory request; [1, 100]"""
    node_metric_expiration_seconds: int = 180
    """nodeMetricExpirationSeconds: metrics this old (seconds) are expired; an integer >= 1"""

    def __post_init__(self) -> None:
        check_int(self, "cpu_weight", 0, 100)
        check_int(self, "memory_weight", 0, 100)
        check_int(self, "dominant_resource_weight", 0, 100)
        check_int(self, "cpu_usage_threshold", 0, 100)
        check_int(self, "memory_usage_threshold", 0, 100)
        check_int(self, "cpu_estimated_scaling_factor", 1, 100)
        check_int(self, "memory_estimated_scaling_factor", 1, 100)
        check_int(self, "node_metric_expiration_seconds", 1)
        if self.cpu_weight == self.memory_weight == self.dominant_resource_weight == 0:
            # Upstream cannot express it: empty resourceWeights without a dominant weight are defaulted.
            raise ValueError(f"{type(self).__name__}: cpu_weight, memory_weight and dominant_resource_weight "
                             "are all 0; at least one must be > 0")


def estimate_pod_usage(request: int, factor: int, default: int, limit: int = 0) -> int:
    """Upstream estimatedUsedByResource: ``round(max(request, limit) * factor / 100)``, capped at the
    limit when there is one; ``default`` when the pod neither requests nor limits the resource.
    fedsched pods have no limits (``limit = 0``)."""
    quantity = max(request, limit)
    if quantity <= 0:
        return default
    est = int(go_round(np.array(quantity * factor / 100.0)))
    return limit if 0 < limit < est else est


def least_used_score(used: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Upstream leastUsedScore: ``(cap - used) * 100 / cap`` in integers; 0 if used > cap or cap = 0."""
    used = np.asarray(used, dtype=np.int64)
    cap = np.asarray(capacity, dtype=np.int64)
    safe = np.where(cap > 0, cap, 1)
    return np.where((cap == 0) | (used > cap), 0, (cap - used) * MAX_NODE_SCORE // safe)


def load_aware_score(used: list[np.ndarray], capacity: list[np.ndarray], weights: list[int],
                     dominant_weight: int = 0) -> np.ndarray:
    """Upstream loadAwareSchedulingScorer over the resources (same order in all three lists)."""
    k = len(used[0])
    node = np.zeros(k, dtype=np.int64)
    dominant = np.full(k, MAX_NODE_SCORE if dominant_weight else 0, dtype=np.int64)
    weight_sum = dominant_weight
    for u, c, w in zip(used, capacity, weights, strict=True):
        s = least_used_score(u, c)
        node += s * w
        weight_sum += w
        dominant = np.minimum(dominant, s)
    node += dominant * dominant_weight
    if weight_sum <= 0:
        return np.zeros(k, dtype=np.int64)
    return node // weight_sum


def usage_exceeds(estimated: np.ndarray, allocatable: np.ndarray, threshold: int) -> np.ndarray:
    """Upstream filterNodeUsage for one resource: ``round(estimated / total * 100) > threshold``."""
    est = np.asarray(estimated, dtype=np.float64)
    total = np.asarray(allocatable, dtype=np.float64)
    if threshold == 0:
        return np.zeros(len(est), dtype=bool)
    usage = go_round(np.divide(est, total, out=np.zeros(len(est)), where=total > 0) * 100.0)
    return (total > 0) & (usage > threshold)


class KoordinatorLoadAware(Scheduler):
    name = "koordinator-load-aware"
    Args = KoordinatorLoadAwareArgs
    args: KoordinatorLoadAwareArgs

    def estimated_usage(self, state: ClusterState, pod: Pod, nodes: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        """(CPU milli, memory bytes) estimated on each node with the pod: measured + the pod's estimate."""
        a = self.args
        # Quantity.MilliValue() / Value() round up; the measured use is a float here.
        cpu_used = np.ceil(state.cpu_used[nodes]).astype(np.int64)
        mem_used = np.ceil(state.mem_used[nodes] * MIB).astype(np.int64)
        cpu = cpu_used + estimate_pod_usage(pod.cpu, a.cpu_estimated_scaling_factor,
                                            DEFAULT_MILLI_CPU_REQUEST)
        mem = mem_used + estimate_pod_usage(pod.mem * MIB, a.memory_estimated_scaling_factor,
                                            DEFAULT_MEMORY_REQUEST)
        return cpu, mem

    def refused(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        """The nodes upstream's Filter refuses (usage above a threshold, or expired metrics)."""
        return self._refused(state, nodes, node_age(state, nodes), *self.estimated_usage(state, pod, nodes))

    def _refused(self, state: ClusterState, nodes: np.ndarray, age: np.ndarray, cpu: np.ndarray,
                 mem: np.ndarray) -> np.ndarray:
        a = self.args
        missing = np.isposinf(age)
        expired = ~missing & (age >= a.node_metric_expiration_seconds)
        hot = (usage_exceeds(cpu, state.nodes.cpu[nodes], a.cpu_usage_threshold)
               | usage_exceeds(mem, state.nodes.mem[nodes].astype(np.int64) * MIB, a.memory_usage_threshold))
        return expired | (~missing & hot)

    def upstream_score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        """Upstream Score (0..100): 0 for a node without metrics or with expired metrics."""
        cpu, mem = self.estimated_usage(state, pod, nodes)
        return self._upstream_score(state, nodes, node_age(state, nodes), cpu, mem)

    def _upstream_score(self, state: ClusterState, nodes: np.ndarray, age: np.ndarray, cpu: np.ndarray,
                        mem: np.ndarray) -> np.ndarray:
        a = self.args
        caps = [state.nodes.cpu[nodes].astype(np.int64), state.nodes.mem[nodes].astype(np.int64) * MIB]
        weights = [a.cpu_weight, a.memory_weight]
        score = load_aware_score([cpu, mem], caps, weights, a.dominant_resource_weight)
        stale = np.isposinf(age) | (age >= a.node_metric_expiration_seconds)
        return np.where(stale, 0, score)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        # Filter and Score read the same metrics and estimate: computed once (nothing here writes them).
        age = node_age(state, nodes)
        cpu, mem = self.estimated_usage(state, pod, nodes)
        s = self._upstream_score(state, nodes, age, cpu, mem).astype(np.float64)
        return np.where(self._refused(state, nodes, age, cpu, mem), s - REFUSED_OFFSET, s)
