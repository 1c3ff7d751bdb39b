"""GpuPacking as in the FGD paper's simulator: fill used GPUs, then used nodes.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/gpu_packing_score.go.
CPU-only pods score 0 everywhere (a random feasible node). Otherwise with ``f`` the node's
fully free GPUs and ``G`` its GPU count:

- no GPU in use (``f == G``): ``max(33 - f, f)``;
- else take, in ascending order of free share, the GPUs that fit until ``num_gpu`` are
  taken; ``u`` of them fully free: ``max(50 - u, 33)`` if ``u > 0``, else with
  ``r = sum(free * 100 // 1000)`` over the taken GPUs, ``max(100 - r // 10, 50)``.

So a partly used GPU beats a used node's free GPU, which beats an untouched node (and
among untouched nodes the smaller wins). A sharing pod takes the tightest-fitting GPU.

Arguments: none (an empty ``GpuPackingArgs``): upstream's plugin takes no configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import MILLI_PER_GPU, ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs


@dataclass(frozen=True)
class GpuPackingArgs(SchedulerArgs):
    """gpu-packing has no knobs (upstream GpuPackingScorePlugin takes no configuration)."""


class GpuPacking(Scheduler):
    name = "gpu-packing"
    Args = GpuPackingArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        if pod.num_gpu == 0:
            return np.zeros(len(nodes))
        free = state.gpu_free[nodes]
        full = (free >= MILLI_PER_GPU).sum(axis=1)
        untouched = full == state.nodes.gpu[nodes]
        s_untouched = np.maximum(33 - full, full)
        if pod.is_gpu_share:
            tight = np.where(free >= pod.gpu_milli, free, MILLI_PER_GPU + 1).min(axis=1)
            r = tight * 100 // MILLI_PER_GPU
            s_used = np.where(tight >= MILLI_PER_GPU, 49, np.maximum(100 - r // 10, 50))
        else:  # whole GPUs: every taken GPU is fully free
            s_used = np.full(len(nodes), max(50 - pod.num_gpu, 33))
        return np.where(untouched, s_untouched, s_used).astype(np.float64)
