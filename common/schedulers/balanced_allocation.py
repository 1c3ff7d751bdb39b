"""NodeResourcesBalancedAllocation, the classic form (Kubernetes <= 1.35).

Upstream: kubernetes/pkg/scheduler/framework/plugins/noderesources/balanced_allocation.go.
Fractions ``f_r = min(req_r / alloc_r, 1)`` for cpu and memory (non-zero requests, pod
included), ``std = |f_cpu - f_mem| / 2`` (the population standard deviation of two
values), score ``int((1 - std) * 100)``. Kubernetes 1.36 scores the *change* in balance
instead; fedsched implements the classic form, which the published baselines used.
"""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterState, Pod
from .base import Scheduler


def balanced_allocation(state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    f_cpu = np.minimum((state.cpu_req_nz[nodes] + pod.cpu_nonzero) / state.nodes.cpu[nodes], 1.0)
    f_mem = np.minimum((state.mem_req_nz[nodes] + pod.mem_nonzero) / state.nodes.mem[nodes], 1.0)
    std = np.abs(f_cpu - f_mem) / 2
    return ((1.0 - std) * 100).astype(np.int64)


class BalancedAllocation(Scheduler):
    name = "balanced-allocation"

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return balanced_allocation(state, pod, nodes).astype(np.float64)
