"""The shipped ``learned-online`` with one more score beside it, for the attempts that try a term
next to the shipped scoring (``policy_fgd_mix.py``, ``policy_mem_mix.py``): ``policy score + L * s *
term``, ``s`` the ratio of the two scores' mean spreads (standard deviations over the candidates)
over the run's first decisions (so ``L`` = 1 gives the term the policy's own spread; measured,
never fitted on outcomes). A subclass says what the term is (:meth:`PolicyMix.term`) and may
shape it after its spread set the scale (:meth:`PolicyMix.shape`: a hinge acts only past a level).
"""

from __future__ import annotations

import numpy as np

from fedsched.common.learning.scorers import scheduler_from_checkpoint
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers import Scheduler, SchedulerContext, default_policy_path

SCALE_DECISIONS = 200  # decisions whose score spreads set the scale s


class PolicyMix(Scheduler):
    """``learned-online``'s score plus ``weight`` times the scaled :meth:`term`."""

    def __init__(self, ctx: SchedulerContext, weight: float) -> None:
        super().__init__(ctx)
        self.policy = scheduler_from_checkpoint(default_policy_path("learned-online"), ctx)
        self.weight = weight
        self.spreads: list[tuple[float, float]] = []
        self.scale: float | None = None

    def term(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        """The score put beside the policy's, per candidate (higher is better)."""
        raise NotImplementedError

    def shape(self, term: np.ndarray) -> np.ndarray:
        """The term as added, after its spread set the scale (default: as it is)."""
        return term

    def select_gpus(self, *args, **kwargs):
        return self.policy.select_gpus(*args, **kwargs)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        p = np.asarray(self.policy.score(state, pod, nodes), dtype=np.float64)
        t = np.asarray(self.term(state, pod, nodes), dtype=np.float64)
        if self.scale is None and len(nodes) > 1:
            self.spreads.append((float(np.std(p)), float(np.std(t))))
            if len(self.spreads) >= SCALE_DECISIONS:
                sp, st = np.mean(self.spreads, axis=0)
                self.scale = sp / st if st > 0 else 0.0
        s = self.scale if self.scale is not None else 0.0
        return p + self.weight * s * self.shape(t)
