"""kube-scheduler's default profile in a resource-only simulation.

Reference section 3: with no taints, affinities, spread constraints or images, the
default profile's scores reduce to NodeResourcesFit (LeastAllocated, weight 1) plus
NodeResourcesBalancedAllocation (weight 1); the framework sums ``score * weight`` and
``selectHost`` picks the best node at random among ties. GPUs are an extended resource
the default profile does not score; a sharing pod's GPU is the best-fitting one.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.balanced_allocation import balanced_allocation
from fedsched.common.schedulers.base import Scheduler
from fedsched.common.schedulers.least_allocated import least_allocated


class KubeDefault(Scheduler):
    name = "kube-default"

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return (least_allocated(state, pod, nodes) + balanced_allocation(state, pod, nodes)).astype(
            np.float64)
