"""Attempt (issue 24, web's OOM gap): the shipped ``learned-online`` beside the observable form of
the oracle's rule (``app-history-now`` of ``app_history_probe.py``: each application's use per
request as its running pods show it, a node's load the sum over its bound pods of request x their
application's ratio). Names it adds:

- ``ah-guard``: the policy's ranking, except that nodes whose estimated memory after the placement
  passes the oracle's guard (85%) rank below every node that keeps it (the oracle's memory rule on
  the estimates; the policy's order inside each group);
- ``ah-guard[T]``: the same with the guard at estimated memory fraction ``T`` (a higher ``T``: only
  the nodes the estimates say would overflow most surely);
- ``ah-mix[L]``: the guard as above, and inside each group ``policy score + L * (-cpu_risk) / s``,
  where ``s`` is the ratio of the two scores' spreads over the candidates measured on the first
  decisions of the run (so ``L`` = 1 gives the oracle's CPU term the policy's own spread; the scale
  is measured, never fitted on outcomes);
- ``ah-kube[W]``: ``app-history-now`` with fill 0 (water-filling the estimated CPU use) beside
  kube-default, as the shipped policy keeps it beside its logits: each score divided by its mean
  spread over the candidates of the run's first decisions, kube-default's times ``W``; the rule's
  memory guard kept;
- ``ah-fill[F]``: ``app-history-now`` alone with the oracle's fill weight ``F`` (default 0.5): how
  much of the node's free requests its CPU risk projects at the workload's use per request (1: the
  node counted as if full, which favours nodes with less room left: fewer stranded large pods?).

Run on the roll-out gate's validation clusters (``fedsched evidence``'s, never the benchmark's),
in the evidence's form (``compare_evidence.py`` pairs it with the shipped policy's evidence)::

    python bench/results/attempts/app_history_mix.py --policy ah-guard --profiles web --seeds 60 \\
        --json bench/results/attempts/evidence_ah_guard.json

A probe, not a scheduler: it reads the replay's usage model through private attributes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from fedsched.common.learning.scorers import scheduler_from_checkpoint
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers import Scheduler, SchedulerContext, default_policy_path, make_scheduler
from fedsched.common.sim.replay import ReplaySimulator
from fedsched.common.sim.replay.oracle import GUARD_OFFSET, OracleArgs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_history_probe import AppHistory
from app_history_validation import main

SCALE_DECISIONS = 200  # decisions whose score spreads set the scale s


class AppHistoryMix(Scheduler):
    name = "ah-mix"

    def __init__(self, ctx: SchedulerContext, weight: float | None) -> None:
        super().__init__(ctx)
        self.policy = scheduler_from_checkpoint(default_policy_path("learned-online"), ctx)
        self.ah = AppHistory(ctx, tau=1.0, every=60.0)
        self.weight = weight  # None: the guard alone
        self.spreads: list[tuple[float, float]] = []
        self.scale: float | None = None
        self.changed = 0
        self.decisions = 0

    def attach_simulator(self, sim: ReplaySimulator) -> None:
        self.ah.attach_simulator(sim)

    def select_gpus(self, *args, **kwargs):
        return self.policy.select_gpus(*args, **kwargs)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        p = np.asarray(self.policy.score(state, pod, nodes), dtype=np.float64)
        a = np.asarray(self.ah.score(state, pod, nodes), dtype=np.float64)
        guarded = a <= -GUARD_OFFSET + 1e-9  # past the memory guard (score -1000 - mem_after)
        out = p.copy()
        if self.weight is not None:
            risk = np.where(guarded, 0.0, -a)
            if self.scale is None and len(nodes) > 1:
                self.spreads.append((float(np.std(p)), float(np.std(risk[~guarded])) if (~guarded).sum() > 1
                                     else 0.0))
                if len(self.spreads) >= SCALE_DECISIONS:
                    sp, sr = np.mean(self.spreads, axis=0)
                    self.scale = sp / sr if sr > 0 else 0.0
            s = self.scale if self.scale is not None else 0.0
            out = out - self.weight * s * risk
        span = float(np.ptp(out)) if len(out) else 0.0
        out = np.where(guarded, out - 2.0 * span - 1.0, out)  # below every kept node, the order kept
        self.decisions += 1
        self.changed += int(len(nodes) > 0 and np.argmax(out) != np.argmax(p))
        return out


class AppHistoryKube(Scheduler):
    """``app-history-now`` with fill 0 beside kube-default: ``-risk / s_r + W * kube / s_k``, the two
    scales the mean spreads (standard deviations over the candidates) of each score over the run's
    first decisions (measured, never fitted on outcomes); nodes past the rule's memory guard rank
    below every other node, as in the rule."""

    name = "ah-kube"

    def __init__(self, ctx: SchedulerContext, weight: float) -> None:
        super().__init__(ctx)
        self.ah = AppHistory(ctx, tau=1.0, every=60.0)
        self.ah.args = OracleArgs(fill=0.0)
        self.kube = make_scheduler("kube-default", ctx)
        self.weight = weight
        self.spreads: list[tuple[float, float]] = []
        self.scale: tuple[float, float] | None = None

    def attach_simulator(self, sim: ReplaySimulator) -> None:
        self.ah.attach_simulator(sim)

    def select_gpus(self, *args, **kwargs):
        return self.kube.select_gpus(*args, **kwargs)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        a = np.asarray(self.ah.score(state, pod, nodes), dtype=np.float64)
        k = np.asarray(self.kube.score(state, pod, nodes), dtype=np.float64)
        guarded = a <= -GUARD_OFFSET + 1e-9
        if self.scale is None:
            if (~guarded).sum() > 1:
                self.spreads.append((float(np.std(a[~guarded])), float(np.std(k[~guarded]))))
            if len(self.spreads) >= SCALE_DECISIONS:
                sr, sk = np.mean(self.spreads, axis=0)
                self.scale = (sr if sr > 0 else 1.0, sk if sk > 0 else 1.0)
        sr, sk = self.scale if self.scale is not None else (1.0, 1.0)
        out = np.where(guarded, 0.0, a) / sr + self.weight * k / sk
        span = float(np.ptp(out)) if len(out) else 0.0
        return np.where(guarded, out - 2.0 * span - 1.0, out)


def resolve(name: str, ctx: SchedulerContext) -> Scheduler | None:
    if name == "ah-guard":
        return AppHistoryMix(ctx, None)
    m = re.fullmatch(r"ah-guard\[([0-9.]+)\]", name)
    if m:  # the guard at estimated memory fraction T instead of the oracle's 0.85
        mix = AppHistoryMix(ctx, None)
        mix.ah.args = OracleArgs(mem_guard=float(m.group(1)))
        return mix
    m = re.fullmatch(r"ah-mix\[([0-9.]+)\]", name)
    if m:
        return AppHistoryMix(ctx, float(m.group(1)))
    m = re.fullmatch(r"ah-kube\[([0-9.]+)\]", name)
    if m:
        return AppHistoryKube(ctx, float(m.group(1)))
    m = re.fullmatch(r"ah-fill\[([0-9.]+)\]", name)
    if m:  # app-history-now alone, the oracle's fill weight F instead of its default 0.5
        ah = AppHistory(ctx, tau=1.0, every=60.0)
        ah.args = OracleArgs(fill=float(m.group(1)))
        ah.name = name
        return ah
    return None


if __name__ == "__main__":
    sys.exit(main(resolve, default="ah-guard"))
