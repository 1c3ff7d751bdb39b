"""NodeResourcesBalancedAllocation, the classic form (Kubernetes 1.23 .. 1.35).

Upstream: kubernetes/pkg/scheduler/framework/plugins/noderesources/balanced_allocation.go.
Fractions ``f_r = min(req_r / alloc_r, 1)`` for cpu and memory over the *actual* requests
(``useRequested: true`` since kubernetes#105845: no 100m / 200 MiB defaults), pod included;
``std = |f_cpu - f_mem| / 2`` (the population standard deviation of two values), score
``int((1 - std) * 100)``. A pod with no requests at all is not scored (kubernetes#130260):
every node gets 0, so the plugin does not influence the choice. Kubernetes 1.36 scores the
*change* in balance instead; fedsched implements the classic form.

Arguments: none (an empty ``BalancedAllocationArgs``). Upstream
``NodeResourcesBalancedAllocationArgs`` only lists the resources to balance, each with a weight
that must be 1 (``ValidateNodeResourcesBalancedAllocationArgs``); fedsched models cpu and memory
only, the default list, so nothing is left to set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs


def balanced_allocation(state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    if pod.cpu == 0 and pod.mem == 0:
        return np.zeros(len(nodes), dtype=np.int64)
    f_cpu = np.minimum((state.cpu_req[nodes] + pod.cpu) / state.nodes.cpu[nodes], 1.0)
    f_mem = np.minimum((state.mem_req[nodes] + pod.mem) / state.nodes.mem[nodes], 1.0)
    std = np.abs(f_cpu - f_mem) / 2
    return ((1.0 - std) * 100).astype(np.int64)


@dataclass(frozen=True)
class BalancedAllocationArgs(SchedulerArgs):
    """balanced-allocation has no knobs (upstream weights must be 1; cpu and memory are fixed)."""


class BalancedAllocation(Scheduler):
    name = "balanced-allocation"
    Args = BalancedAllocationArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return balanced_allocation(state, pod, nodes).astype(np.float64)
