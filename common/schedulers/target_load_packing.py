"""Trimaran TargetLoadPacking: pack nodes up to a target CPU utilisation.

Upstream: kubernetes-sigs/scheduler-plugins pkg/trimaran/targetloadpacking (target
``T = 40`` %). Predicted node CPU% ``U = 100 * (measured + pod prediction) / capacity``,
pod prediction = CPU limit, else ``request * 1.5``, else 1000m (pods here carry requests
only). Score = ``round((100 - T) * U / T + T)`` if ``U <= T``;
``round(T * (100 - U) / (100 - T))`` if ``T < U <= 100``; 0 if ``U > 100``. ``round`` is
Go's ``math.Round`` (half away from zero). "Measured" is the node's real CPU use from the
simulator's usage model (replay mode) or from Prometheus (serving); in packing mode and in
serving without telemetry real use equals requests (``ClusterState``'s one definition).

Arguments (upstream ``TargetLoadPackingArgs``, apis/config/v1/defaults.go): ``targetUtilization``
(40), ``defaultRequests`` cpu (1000m) and ``defaultRequestsMultiplier`` ("1.5"). The watcher /
metric-provider address is a serving concern, not an argument here. Upstream silently
replaces a target <= 0 by 40; fedsched refuses any target outside (0, 100): the score divides
by ``T`` and by ``100 - T`` (with T = 0 a node at U = 0 scores NaN and every other node 0; with
T = 100 every node up to U = 100 scores 100).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, check_float, check_int

DEFAULT_TARGET_PERCENT = 40  # upstream DefaultTargetUtilizationPercent
REQUESTS_MULTIPLIER = 1.5  # upstream DefaultRequestsMultiplier
DEFAULT_REQUEST_MILLI = 1000  # upstream DefaultRequestsMilliCores


@dataclass(frozen=True)
class TargetLoadPackingArgs(SchedulerArgs):
    """TargetLoadPacking's arguments (upstream ``TargetLoadPackingArgs``)."""

    target_utilization: int = DEFAULT_TARGET_PERCENT
    """target CPU utilisation % the nodes are packed up to; an integer in (0, 100), exclusive"""
    default_requests_milli_cores: int = DEFAULT_REQUEST_MILLI
    """predicted CPU (milli) of a pod without a CPU request (best effort); an integer >= 0"""
    default_requests_multiplier: float = REQUESTS_MULTIPLIER
    """a requesting pod is predicted to use its request times this; a number > 0"""

    def __post_init__(self) -> None:
        check_int(self, "target_utilization", 0, 100, lo_open=True, hi_open=True)
        check_int(self, "default_requests_milli_cores", 0)
        check_float(self, "default_requests_multiplier", 0, lo_open=True)


def go_round(x: np.ndarray) -> np.ndarray:
    """Go's math.Round: half away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def pod_cpu_prediction(pod: Pod, multiplier: float = REQUESTS_MULTIPLIER,
                       default_milli: float = DEFAULT_REQUEST_MILLI) -> float:
    """Upstream PredictUtilisation: ``int64(math.Round(request * multiplier))``, else the default."""
    return float(go_round(np.array(pod.cpu * multiplier))) if pod.cpu > 0 else float(default_milli)


def target_load_packing_score(used_milli: np.ndarray, cap_milli: np.ndarray, pod_pred: float,
                              target: float = DEFAULT_TARGET_PERCENT) -> np.ndarray:
    """Scores from the predicted utilisation; ``target`` in (0, 100) (it divides by T and 100 - T)."""
    if not 0 < target < 100:
        raise ValueError(f"target = {target!r} is out of range: must be in (0, 100)")
    u = 100.0 * (used_milli + pod_pred) / cap_milli
    below = go_round((100.0 - target) * u / target + target)
    above = go_round(target * (100.0 - u) / (100.0 - target))
    return np.where(u > 100.0, 0.0, np.where(u <= target, below, above))


class TargetLoadPacking(Scheduler):
    name = "target-load-packing"
    Args = TargetLoadPackingArgs
    args: TargetLoadPackingArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        a = self.args
        pred = pod_cpu_prediction(pod, a.default_requests_multiplier, a.default_requests_milli_cores)
        return target_load_packing_score(state.cpu_used[nodes], state.nodes.cpu[nodes].astype(float),
                                         pred, a.target_utilization)
