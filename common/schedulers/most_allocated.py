"""NodeResourcesFit with the MostAllocated strategy.

Upstream: kubernetes/pkg/scheduler/framework/plugins/noderesources/most_allocated.go.
Per resource ``min(req, cap) * 100 / cap`` (integer), node score = weighted mean with
cpu and memory weight 1; requests are non-zero requests as for LeastAllocated.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler


def most_allocated_scores(cap: np.ndarray, req: np.ndarray) -> np.ndarray:
    return np.where(cap == 0, 0, np.minimum(req, cap) * 100 // np.maximum(cap, 1))


class MostAllocated(Scheduler):
    name = "most-allocated"

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        cpu = most_allocated_scores(state.nodes.cpu[nodes], state.cpu_req_nz[nodes] + pod.cpu_nonzero)
        mem = most_allocated_scores(state.nodes.mem[nodes], state.mem_req_nz[nodes] + pod.mem_nonzero)
        return ((cpu + mem) // 2).astype(np.float64)
