"""Random: every feasible node equally likely.

Upstream (FGD simulator): pkg/simulator/plugin/random_score.go gives one uniformly drawn
feasible node score 100 and the others 0, i.e. a uniform choice; a sharing pod then lands
on a uniformly random fitting GPU (gpuSelMethod "random"), whole-GPU pods on the
lowest-indexed free GPUs.

Arguments: none (an empty ``RandomScoreArgs``). Upstream's plugin takes no configuration and
draws from Go's global ``math/rand``; fedsched draws from ``SchedulerContext.rng``, the run's
seeded generator (run state shared with the caller, not a setting), so the run's seed alone
fixes Random's choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs


@dataclass(frozen=True)
class RandomScoreArgs(SchedulerArgs):
    """random has no knobs: its randomness is the run generator ``SchedulerContext.rng``."""


class RandomScore(Scheduler):
    name = "random"
    Args = RandomScoreArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return self.ctx.rng.random(len(nodes))

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        if pod.is_gpu_share:
            fitting = np.flatnonzero(state.gpu_free[node] >= pod.gpu_milli)
            return (int(fitting[self.ctx.rng.integers(len(fitting))]),)
        return super().select_gpus(state, pod, node)
