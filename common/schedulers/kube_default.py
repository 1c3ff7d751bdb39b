"""kube-scheduler's default profile in a resource-only simulation.

Reference section 3: with no taints, affinities, spread constraints or images, the
default profile's scores reduce to NodeResourcesFit (LeastAllocated, weight 1) plus
NodeResourcesBalancedAllocation (weight 1); the framework sums ``score * weight`` and
``selectHost`` picks the best node at random among ties. GPUs are an extended resource
the default profile does not score; a sharing pod's GPU is the best-fitting one.

Arguments: none (an empty ``KubeDefaultArgs``). This is the *default* profile: plugin weights
1 and 1 and NodeResourcesFit's default cpu / memory weights (1, 1). Other fit weights are
``least-allocated`` with ``LeastAllocatedArgs``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.balanced_allocation import balanced_allocation
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs
from fedsched.common.schedulers.least_allocated import least_allocated


@dataclass(frozen=True)
class KubeDefaultArgs(SchedulerArgs):
    """kube-default has no knobs: the default profile is fixed by definition."""


class KubeDefault(Scheduler):
    name = "kube-default"
    Args = KubeDefaultArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return (least_allocated(state, pod, nodes) + balanced_allocation(state, pod, nodes)).astype(
            np.float64)
