"""NodeResourcesFit with the MostAllocated strategy.

Upstream: kubernetes/pkg/scheduler/framework/plugins/noderesources/most_allocated.go.
Per resource ``min(req, cap) * 100 / cap`` (integer), node score = weighted mean with
cpu and memory weight 1; requests are non-zero requests as for LeastAllocated.

Arguments: the cpu and memory weights of upstream ``NodeResourcesFitArgs`` (type
MostAllocated), as for LeastAllocated: integers in [1, 100], default 1 each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler
from fedsched.common.schedulers.least_allocated import ResourceWeightsArgs, weighted_mean


@dataclass(frozen=True)
class MostAllocatedArgs(ResourceWeightsArgs):
    """MostAllocated's arguments (upstream ``NodeResourcesFitArgs``, type MostAllocated)."""


def most_allocated_scores(cap: np.ndarray, req: np.ndarray) -> np.ndarray:
    return np.where(cap == 0, 0, np.minimum(req, cap) * 100 // np.maximum(cap, 1))


class MostAllocated(Scheduler):
    name = "most-allocated"
    Args = MostAllocatedArgs
    args: MostAllocatedArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        cpu = most_allocated_scores(state.nodes.cpu[nodes], state.cpu_req_nz[nodes] + pod.cpu_nonzero)
        mem = most_allocated_scores(state.nodes.mem[nodes], state.mem_req_nz[nodes] + pod.mem_nonzero)
        return weighted_mean(cpu, mem, self.args).astype(np.float64)
