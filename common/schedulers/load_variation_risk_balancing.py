"""Trimaran LoadVariationRiskBalancing: balance the risk of load variation across nodes.

Upstream: kubernetes-sigs/scheduler-plugins pkg/trimaran/loadvariationriskbalancing
(analysis.go ``computeScore``, loadvariationriskbalancing.go ``Score``) and pkg/trimaran/
resourcestats.go (``CreateResourceStats``, ``GetMuSigma``). Per resource r in (CPU, memory), from
the windowed mean ``avg`` and standard deviation ``std`` of the node's measured use, the pod's
request ``req`` and the capacity ``cap`` (all absolute; upstream clamps req >= 0 and avg, std to
[0, cap]):

    mu    = clamp((avg + req) / cap, 0, 1)             # the pod's request added to the mean
    sigma = clamp(std / cap, 0, 1) ** (1 / sensitivity)   # only when sensitivity >= 0
    sigma = clamp(margin * sigma, 0, 1)
    risk  = (mu + sigma) / 2
    score_r = (1 - risk) * MaxNodeScore                # 0 when cap <= 0

node score = ``round(min(score_cpu, score_mem))`` = ``round((1 - max risk) * 100)``, ``round``
being Go's ``math.Round`` (half away from zero). A node without metrics scores MinNodeScore (0).
The pod's request is its raw request (``GetResourceRequested``: no non-zero defaults).

Measurements: upstream reads them from load-watcher, whose library client asks for the
15-minute window (``GetLatestWatcherMetrics(FifteenMinutes)``), with the Prometheus provider
``avg_over_time(instance:node_cpu:ratio[15m])`` / ``stddev_over_time(...[15m])`` and the same
for ``instance:node_memory_utilisation:ratio``. fedsched takes them from ``state.telemetry``
(``cpu_mean``, ``cpu_std``, ``mem_mean``, ``mem_std``, fractions of capacity; serving fills them
with those queries, see agent/cluster/telemetry.py). Where they are missing (packing mode, the
replay simulator, serving without telemetry, or a node Prometheus has no value for) the mean is
the node's current ``state.cpu_used / capacity`` (``mem_used`` for memory) and the deviation 0
(fedsched.common.schedulers.load_stats). A node whose ``metrics_age_s`` is ``inf`` (the source
has never had a sample of it) is a node without metrics: score 0, as upstream. Upstream scores
only the resources it has metrics for (the max of the scores when one is missing); with the
fallback fedsched always has both and takes the min.

Arguments (upstream ``LoadVariationRiskBalancingArgs``, apis/config/v1/defaults.go):
``safeVarianceMargin`` (1) and ``safeVarianceSensitivity`` (1; the README recommends 2). Upstream
defaulting silently replaces a negative value by 1 (``SetDefaults_LoadVariationRiskBalancingArgs``);
fedsched refuses a negative value. Both accept 0: a margin of 0 ignores the variation, a
sensitivity of 0 raises sigma to the power +inf (Go's ``math.Pow``: 0 unless sigma = 1). The
watcher / metric-provider address is a serving concern, not an argument here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, check_float
from fedsched.common.schedulers.load_stats import node_load
from fedsched.common.schedulers.target_load_packing import go_round

MAX_NODE_SCORE = 100  # k8s.io/kube-scheduler framework MaxNodeScore
DEFAULT_SAFE_VARIANCE_MARGIN = 1.0  # upstream DefaultSafeVarianceMargin
DEFAULT_SAFE_VARIANCE_SENSITIVITY = 1.0  # upstream DefaultSafeVarianceSensitivity


@dataclass(frozen=True)
class LoadVariationRiskBalancingArgs(SchedulerArgs):
    """LoadVariationRiskBalancing's arguments (upstream ``LoadVariationRiskBalancingArgs``)."""

    safe_variance_margin: float = DEFAULT_SAFE_VARIANCE_MARGIN
    """multiplier of the (rooted) standard deviation in the risk; a number >= 0"""
    safe_variance_sensitivity: float = DEFAULT_SAFE_VARIANCE_SENSITIVITY
    """root power of the standard deviation in the risk; a number >= 0"""

    def __post_init__(self) -> None:
        check_float(self, "safe_variance_margin", 0)
        check_float(self, "safe_variance_sensitivity", 0)


def _clamp(x: np.ndarray, lo: np.ndarray | float, hi: np.ndarray | float) -> np.ndarray:
    return np.maximum(np.minimum(x, hi), lo)


def risk_score(used_avg: np.ndarray, used_std: np.ndarray, req: np.ndarray | float,
               capacity: np.ndarray, margin: float = DEFAULT_SAFE_VARIANCE_MARGIN,
               sensitivity: float = DEFAULT_SAFE_VARIANCE_SENSITIVITY) -> np.ndarray:
    """Upstream computeScore per resource: ``(1 - risk) * 100``, unrounded (0 where cap <= 0).

    Absolute quantities like upstream's ``ResourceStats`` (any unit, the same for all four).
    Any margin and sensitivity are taken as upstream's function takes them (a negative margin
    clamps sigma to 0, a negative sensitivity skips the root); the Args refuse negative ones.
    """
    cap = np.asarray(capacity, dtype=np.float64)
    ok = cap > 0
    safe_cap = np.where(ok, cap, 1.0)
    req = np.maximum(np.asarray(req, dtype=np.float64), 0.0)
    avg = _clamp(np.asarray(used_avg, dtype=np.float64), 0.0, cap)
    std = _clamp(np.asarray(used_std, dtype=np.float64), 0.0, cap)
    mu = _clamp((avg + req) / safe_cap, 0.0, 1.0)
    sigma = _clamp(std / safe_cap, 0.0, 1.0)
    if sensitivity >= 0:
        sigma = np.power(sigma, math.inf if sensitivity == 0 else 1.0 / sensitivity)
    sigma = _clamp(sigma * margin, 0.0, 1.0)
    risk = (mu + sigma) / 2.0
    return np.where(ok, (1.0 - risk) * MAX_NODE_SCORE, 0.0)


class LoadVariationRiskBalancing(Scheduler):
    name = "load-variation-risk-balancing"
    Args = LoadVariationRiskBalancingArgs
    args: LoadVariationRiskBalancingArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        a = self.args
        load = node_load(state, nodes)
        cap_cpu = state.nodes.cpu[nodes].astype(np.float64)
        cap_mem = state.nodes.mem[nodes].astype(np.float64)
        m, s = a.safe_variance_margin, a.safe_variance_sensitivity
        cpu = risk_score(load.cpu_mean * cap_cpu, load.cpu_std * cap_cpu, pod.cpu, cap_cpu, m, s)
        mem = risk_score(load.mem_mean * cap_mem, load.mem_std * cap_mem, pod.mem, cap_mem, m, s)
        score = go_round(np.minimum(cpu, mem))
        return np.where(np.isposinf(load.age_s), 0.0, score)
