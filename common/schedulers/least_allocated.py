"""NodeResourcesFit with the LeastAllocated strategy (kube-scheduler's default).

Upstream: kubernetes/pkg/scheduler/framework/plugins/noderesources/least_allocated.go.
Per resource ``(cap - req) * 100 / cap`` (0 when ``req > cap``), integer arithmetic;
node score = ``sum(s_r * w_r) / sum(w_r)`` with cpu and memory weight 1. ``req`` is what
the node already has requested plus the pod, both as non-zero requests (a container
without requests counts 100m CPU / 200 MiB).

Arguments: the resource weights of upstream ``NodeResourcesFitArgs.scoringStrategy.resources``
(default cpu 1, memory 1; kube's ``validateResources`` allows integer weights in (0, 100]).
fedsched models cpu and memory only, so those are the two weights; the node score is the
integer ``(s_cpu * w_cpu + s_mem * w_mem) // (w_cpu + w_mem)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, check_int

MAX_RESOURCE_WEIGHT = 100  # kube's validateResources: weight in (0, 100]


@dataclass(frozen=True)
class ResourceWeightsArgs(SchedulerArgs):
    """NodeResourcesFit's scoring-strategy resource weights (shared by Least/MostAllocated)."""

    cpu_weight: int = 1
    """weight of the cpu score in the node's weighted mean; an integer in [1, 100]"""
    memory_weight: int = 1
    """weight of the memory score in the node's weighted mean; an integer in [1, 100]"""

    def __post_init__(self) -> None:
        check_int(self, "cpu_weight", 1, MAX_RESOURCE_WEIGHT)
        check_int(self, "memory_weight", 1, MAX_RESOURCE_WEIGHT)


def weighted_mean(cpu: np.ndarray, mem: np.ndarray, w: ResourceWeightsArgs) -> np.ndarray:
    """Upstream ``sum(score * weight) / sum(weight)`` over cpu and memory, integer arithmetic."""
    return (cpu * w.cpu_weight + mem * w.memory_weight) // (w.cpu_weight + w.memory_weight)


@dataclass(frozen=True)
class LeastAllocatedArgs(ResourceWeightsArgs):
    """LeastAllocated's arguments (upstream ``NodeResourcesFitArgs``, type LeastAllocated)."""


def least_allocated_scores(cap: np.ndarray, req: np.ndarray) -> np.ndarray:
    """Integer per-resource score: ``(cap - req) * 100 // cap``, 0 if over capacity."""
    return np.where((req > cap) | (cap == 0), 0, (cap - req) * 100 // np.maximum(cap, 1))


DEFAULT_WEIGHTS = LeastAllocatedArgs()


def least_allocated(state: ClusterState, pod: Pod, nodes: np.ndarray,
                    args: ResourceWeightsArgs = DEFAULT_WEIGHTS) -> np.ndarray:
    cpu = least_allocated_scores(state.nodes.cpu[nodes], state.cpu_req_nz[nodes] + pod.cpu_nonzero)
    mem = least_allocated_scores(state.nodes.mem[nodes], state.mem_req_nz[nodes] + pod.mem_nonzero)
    return weighted_mean(cpu, mem, args)


class LeastAllocated(Scheduler):
    name = "least-allocated"
    Args = LeastAllocatedArgs
    args: LeastAllocatedArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return least_allocated(state, pod, nodes, self.args).astype(np.float64)
