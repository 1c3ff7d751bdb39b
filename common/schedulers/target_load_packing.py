"""Trimaran TargetLoadPacking: pack nodes up to a target CPU utilisation.

Upstream: kubernetes-sigs/scheduler-plugins pkg/trimaran/targetloadpacking (target
``T = 40`` %). Predicted node CPU% ``U = 100 * (measured + pod prediction) / capacity``,
pod prediction = CPU limit, else ``request * 1.5``, else 1000m (pods here carry requests
only). Score = ``round((100 - T) * U / T + T)`` if ``U <= T``;
``round(T * (100 - U) / (100 - T))`` if ``T < U <= 100``; 0 if ``U > 100``. ``round`` is
Go's ``math.Round`` (half away from zero). "Measured" is the node's real CPU use from the
simulator's usage model (replay mode) or from Prometheus (serving); in packing mode the
simulator has no usage model and real use equals requests.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerContext

DEFAULT_TARGET_PERCENT = 40.0
REQUESTS_MULTIPLIER = 1.5
DEFAULT_REQUEST_MILLI = 1000.0


def go_round(x: np.ndarray) -> np.ndarray:
    """Go's math.Round: half away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def pod_cpu_prediction(pod: Pod) -> float:
    """Upstream PredictUtilisation: ``int64(math.Round(request * 1.5))``, else 1000m."""
    return float(go_round(np.array(pod.cpu * REQUESTS_MULTIPLIER))) if pod.cpu > 0 else DEFAULT_REQUEST_MILLI


def target_load_packing_score(used_milli: np.ndarray, cap_milli: np.ndarray, pod_pred: float,
                              target: float = DEFAULT_TARGET_PERCENT) -> np.ndarray:
    u = 100.0 * (used_milli + pod_pred) / cap_milli
    below = go_round((100.0 - target) * u / target + target)
    above = go_round(target * (100.0 - u) / (100.0 - target))
    return np.where(u > 100.0, 0.0, np.where(u <= target, below, above))


class TargetLoadPacking(Scheduler):
    name = "target-load-packing"

    def __init__(self, ctx: SchedulerContext | None = None,
                 target_percent: float = DEFAULT_TARGET_PERCENT) -> None:
        super().__init__(ctx)
        self.target = target_percent

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return target_load_packing_score(state.cpu_used[nodes], state.nodes.cpu[nodes].astype(float),
                                         pod_cpu_prediction(pod), self.target)
