"""BestFit as in the FGD paper's simulator: the node with the smallest leftover wins.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/best_fit_score.go.
``score = int((1 - [0.5 * (cpuLeft - cpu) / 128000 + 0.5 * (gpuLeft - gpu) / 8000]) * 100)``
with ``MaxSpecCpu = 128000`` milli and ``MaxSpecGpu = 8000`` milli-GPU, ``cpu`` the pod's
non-zero CPU request and ``gpu = num_gpu * gpu_milli``. Upstream min-max normalises the
integer scores afterwards, which does not change the best node. A sharing pod takes the
tightest-fitting GPU.

Arguments: none (an empty ``BestFitArgs``): upstream's BestFitScorePlugin takes no
configuration (the weights 0.5 and the max specs are constants).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs

MAX_SPEC_CPU = 128000.0
MAX_SPEC_GPU = 8000.0


@dataclass(frozen=True)
class BestFitArgs(SchedulerArgs):
    """best-fit has no knobs (upstream BestFitScorePlugin takes no configuration)."""


class BestFit(Scheduler):
    name = "best-fit"
    Args = BestFitArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        cpu_left = (state.nodes.cpu[nodes] - state.cpu_req[nodes]).astype(np.float64)
        gpu_left = state.gpu_free[nodes].sum(axis=1).astype(np.float64)
        waste = (0.5 * (cpu_left - pod.cpu_nonzero) / MAX_SPEC_CPU
                 + 0.5 * (gpu_left - pod.gpu_request) / MAX_SPEC_GPU)
        return np.trunc((1.0 - waste) * 100.0)
