"""Attempt (issue 24, gpu's failed pods): the shipped ``learned-online`` with FGD's score beside it.

On the gpu validation cluster every failed pod asks for 4+ GPUs (``failed_pod_sizes.txt``): GPU
fragmentation, which FGD (``fgd``, the packing benchmark's best heuristic) scores. ``pol-fgd[L]``
ranks by ``policy score + L * s * fgd score``, ``s`` the ratio of the two scores' mean spreads
(standard deviations over the candidates) over the run's first decisions (so ``L`` = 1 gives FGD
the policy's own spread; measured, never fitted on outcomes). Run on the roll-out gate's validation
clusters in the evidence's form (``compare_evidence.py`` pairs it with the shipped policy's)::

    python bench/results/attempts/policy_fgd_mix.py --policy "pol-fgd[1]" --profiles gpu --seeds 60 \\
        --json bench/results/attempts/evidence_pol_fgd1.json
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from fedsched.common.learning.scorers import scheduler_from_checkpoint
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers import Scheduler, SchedulerContext, default_policy_path, make_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_history_validation import main

SCALE_DECISIONS = 200  # decisions whose score spreads set the scale s


class PolicyFgd(Scheduler):
    name = "pol-fgd"

    def __init__(self, ctx: SchedulerContext, weight: float) -> None:
        super().__init__(ctx)
        self.policy = scheduler_from_checkpoint(default_policy_path("learned-online"), ctx)
        self.fgd = make_scheduler("fgd", ctx)
        self.weight = weight
        self.spreads: list[tuple[float, float]] = []
        self.scale: float | None = None

    def select_gpus(self, *args, **kwargs):
        return self.policy.select_gpus(*args, **kwargs)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        p = np.asarray(self.policy.score(state, pod, nodes), dtype=np.float64)
        f = np.asarray(self.fgd.score(state, pod, nodes), dtype=np.float64)
        if self.scale is None and len(nodes) > 1:
            self.spreads.append((float(np.std(p)), float(np.std(f))))
            if len(self.spreads) >= SCALE_DECISIONS:
                sp, sf = np.mean(self.spreads, axis=0)
                self.scale = sp / sf if sf > 0 else 0.0
        s = self.scale if self.scale is not None else 0.0
        return p + self.weight * s * f


def resolve(name: str, ctx: SchedulerContext) -> Scheduler | None:
    m = re.fullmatch(r"pol-fgd\[([0-9.]+)\]", name)
    return PolicyFgd(ctx, float(m.group(1))) if m else None


if __name__ == "__main__":
    sys.exit(main(resolve, default="pol-fgd[1]"))
