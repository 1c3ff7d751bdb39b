"""NodeResourcesFit with the LeastAllocated strategy (kube-scheduler's default).

Upstream: kubernetes/pkg/scheduler/framework/plugins/noderesources/least_allocated.go.
Per resource ``(cap - req) * 100 / cap`` (0 when ``req > cap``), integer arithmetic;
node score = ``sum(s_r * w_r) / sum(w_r)`` with cpu and memory weight 1. ``req`` is what
the node already has requested plus the pod, both as non-zero requests (a container
without requests counts 100m CPU / 200 MiB).
"""

from __future__ import annotations

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler


def least_allocated_scores(cap: np.ndarray, req: np.ndarray) -> np.ndarray:
    """Integer per-resource score: ``(cap - req) * 100 // cap``, 0 if over capacity."""
    return np.where((req > cap) | (cap == 0), 0, (cap - req) * 100 // np.maximum(cap, 1))


def least_allocated(state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    cpu = least_allocated_scores(state.nodes.cpu[nodes], state.cpu_req_nz[nodes] + pod.cpu_nonzero)
    mem = least_allocated_scores(state.nodes.mem[nodes], state.mem_req_nz[nodes] + pod.mem_nonzero)
    return (cpu + mem) // 2


class LeastAllocated(Scheduler):
    name = "least-allocated"

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return least_allocated(state, pod, nodes).astype(np.float64)
