"""GpuClustering as in the FGD paper's simulator: keep sharing and whole-GPU pods apart.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/gpu_clustering_score.go.
A pod's tag is "share-gpu" (one GPU, gpu_milli < 1000) or "k-gpu" for k whole GPUs (one
tag per GPU count, ``pkg/type/open-gpu-share/utils/pod.go``); CPU-only pods score 0
everywhere. With ``base = 25 * (8000 - gpuLeft) // 8000``: +75 when the node
runs only pods of this tag, +50 when it runs this tag among others, +25 when it runs no
GPU pods, +0 when it runs only the other tag. A sharing pod takes the tightest-fitting GPU.

Arguments: none (an empty ``GpuClusteringArgs``): upstream's plugin takes no configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs


@dataclass(frozen=True)
class GpuClusteringArgs(SchedulerArgs):
    """gpu-clustering has no knobs (upstream GpuClusteringScorePlugin takes no configuration)."""


class GpuClustering(Scheduler):
    name = "gpu-clustering"
    Args = GpuClusteringArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        if pod.num_gpu == 0:
            return np.zeros(len(nodes))
        gpu_left = state.gpu_free[nodes].sum(axis=1)
        base = 25 * (8000 - gpu_left) // 8000
        tags = state.gpu_tag_pods[nodes]
        same = tags[:, pod.gpu_tag]
        other = tags.sum(axis=1) - same
        bonus = np.where(same > 0, np.where(other > 0, 50, 75), np.where(other > 0, 0, 25))
        return (base + bonus).astype(np.float64)
