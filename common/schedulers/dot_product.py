"""DotProd (Tetris-style alignment) as in the FGD paper's simulator.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/dot_product_score.go
(dimExtMethod=merge, normMethod=max). Node vector ``[cpuLeft / 128000, gpuLeft / 8000]``,
pod vector ``[cpu / 128000, gpu / 8000]``; ``score = int(100 * (1 - dot / 2))``: the
node whose free vector aligns least with the demand (the fullest fitting node) wins.
A sharing pod takes the tightest-fitting GPU.

Arguments: none (an empty ``DotProductArgs``). Upstream's GpuPluginCfg selects
``dimExtMethod`` / ``normMethod``; fedsched implements only merge / max, so they are not
knobs here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs
from fedsched.common.schedulers.best_fit import MAX_SPEC_CPU, MAX_SPEC_GPU


@dataclass(frozen=True)
class DotProductArgs(SchedulerArgs):
    """dot-product has no knobs (only upstream dimExtMethod=merge, normMethod=max is implemented)."""


class DotProduct(Scheduler):
    name = "dot-product"
    Args = DotProductArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        cpu_left = (state.nodes.cpu[nodes] - state.cpu_req[nodes]).astype(np.float64)
        gpu_left = state.gpu_free[nodes].sum(axis=1).astype(np.float64)
        dot = (cpu_left / MAX_SPEC_CPU) * (pod.cpu_nonzero / MAX_SPEC_CPU) + (
            gpu_left / MAX_SPEC_GPU) * (pod.gpu_request / MAX_SPEC_GPU)
        return np.where(cpu_left < pod.cpu_nonzero, 0.0, np.trunc(100.0 * (1.0 - dot / 2.0)))
