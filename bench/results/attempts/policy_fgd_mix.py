"""Attempt (issue 24, gpu's failed pods): the shipped ``learned-online`` with FGD's score beside it.

On the gpu validation cluster every failed pod asks for 4+ GPUs (``failed_pod_sizes.txt``): GPU
fragmentation, which FGD (``fgd``, the packing benchmark's best heuristic) scores. ``pol-fgd[L]``
ranks by ``policy score + L * s * fgd score`` (``policy_mix.py``: ``L`` = 1 gives FGD the
policy's own spread over the candidates). Run on the roll-out gate's validation
clusters in the evidence's form (``compare_evidence.py`` pairs it with the shipped policy's)::

    python bench/results/attempts/policy_fgd_mix.py --policy "pol-fgd[1]" --profiles gpu --seeds 60 \\
        --json bench/results/attempts/evidence_pol_fgd1.json
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers import Scheduler, SchedulerContext, make_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_history_validation import main
from policy_mix import PolicyMix


class PolicyFgd(PolicyMix):
    name = "pol-fgd"

    def __init__(self, ctx: SchedulerContext, weight: float) -> None:
        super().__init__(ctx, weight)
        self.fgd = make_scheduler("fgd", ctx)

    def term(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return self.fgd.score(state, pod, nodes)


def resolve(name: str, ctx: SchedulerContext) -> Scheduler | None:
    m = re.fullmatch(r"pol-fgd\[([0-9]+(?:\.[0-9]+)?)\]", name)
    return PolicyFgd(ctx, float(m.group(1))) if m else None


if __name__ == "__main__":
    sys.exit(main(resolve, default="pol-fgd[1]"))
