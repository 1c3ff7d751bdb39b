"""Attempt 7 of the learning issue, a probe (not a shipped scheduler): the oracle's rule on an
*observable* estimate of use. Each application's use per request is what its running pods show
(``app-history-now``: the latest reading, sampled every minute; ``app-history``: a time-decayed
average, sampled every 5 minutes with a 6-hour time constant, so the daily cycle averages out);
a node's load is the sum over its bound pods of request x their application's ratio, the pod's
the same (the cluster's ratio for an application with no running pod).

It is the oracle's scoring rule with the oracle's hidden figures replaced (a subclass of it), and
reads the replay's usage model through private attributes (the per-application sums behind
``Telemetry.app_usage``), which is why it is a probe and not a scheduler. Run from the project
root; it adds its two names to ``bench/online_quality.py``::

    python bench/results/attempts/app_history_probe.py --scenarios web,gpu,edge \\
        --policies kube-default,app-history,app-history-now --jobs 2 \\
        --json bench/results/attempts/app_history_probe.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers import RESOLVERS
from fedsched.common.schedulers.base import Scheduler, SchedulerContext
from fedsched.common.sim.replay import ReplaySimulator
from fedsched.common.sim.replay.oracle import Oracle
from fedsched.common.sim.replay.usage import _CUR, UsageModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, for online_quality
import online_quality


class AppHistory(Oracle):
    """The oracle's rule (:class:`~fedsched.common.sim.replay.oracle.Oracle`), its per-pod
    estimates and the fill term's use per request replaced by what the running pods show."""

    name = "app-history"

    def __init__(self, ctx: SchedulerContext | None = None, tau: float = 6 * 3600.0,
                 every: float = 300.0) -> None:
        super().__init__(ctx)
        self.tau, self.every = tau, every

    def attach_simulator(self, sim: ReplaySimulator) -> None:
        if sim is self.sim:
            return
        super().attach_simulator(sim)  # the memory guard; the hidden figures it reads are replaced below
        self.ema = np.full((2, sim.usage._n_apps), np.nan)
        self.cluster = np.array([0.5, 0.5])  # before anything runs
        self.seen = False
        self.last = -np.inf
        self._refresh_estimates()

    def _sample(self) -> None:
        """Fold the running pods' current use per request into each application's average."""
        sim, u = self.sim, self.sim.usage
        now = sim.now
        if now - self.last < self.every:
            return
        use, tot = _app_sums(u)
        ok = tot[0] > 0
        ratio = np.where(ok, use / np.maximum(tot, 1e-12), np.nan)
        w = 1.0 if not np.isfinite(self.last) else 1.0 - np.exp(-(now - self.last) / self.tau)
        fresh = ok & np.isnan(self.ema[0])
        seen = ok & ~fresh
        self.ema[:, fresh] = ratio[:, fresh]
        self.ema[:, seen] += w * (ratio[:, seen] - self.ema[:, seen])
        if tot[0].sum() > 0:
            c = use.sum(axis=1) / np.maximum(tot.sum(axis=1), 1e-12)
            self.cluster = c if not self.seen else self.cluster + w * (c - self.cluster)
            self.seen = True
        self.last = now
        self._refresh_estimates()

    def _refresh_estimates(self) -> None:
        """Every row's estimate: request x its application's average (the cluster's if unseen)."""
        u = self.sim.usage
        d = u._app_dense
        ratio = np.where(d >= 0, self.ema[:, np.maximum(d, 0)], np.nan)
        ratio = np.where(np.isnan(ratio), self.cluster[:, None], ratio)
        est = u._req_nz * ratio
        self.estimate = (est[0], est[1])
        self.use_per_request = float(self.cluster[0])

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        self._sample()
        return super().score(state, pod, nodes)


def _app_sums(u: UsageModel) -> tuple[np.ndarray, np.ndarray]:
    """Every application's (CPU, memory) current use and non-zero requests over its running pods,
    as rows ``[cpu, mem]`` x applications: the sums ``UsageModel.app_usage`` divides, computed here
    for all applications at once. (Until 2026-12-07 this probe read the model's cached numpy sums,
    which the compiled ``app_usage`` of 2026-12-04 no longer fills: the probe then saw no
    application at all and scored requests x 0.5, a CPU LeastAllocated.)"""
    k = u._n_active
    rows = u._s_pod[:k]
    d = u._app_dense[rows]
    keep = d >= 0
    d, rows = d[keep], rows[keep]
    cur = u._sf[_CUR:_CUR + 2, :k][:, keep]
    req = u._req_nz[:, rows]
    n = u._n_apps
    use = np.stack([np.bincount(d, weights=cur[0], minlength=n), np.bincount(d, weights=cur[1], minlength=n)])
    tot = np.stack([np.bincount(d, weights=req[0], minlength=n), np.bincount(d, weights=req[1], minlength=n)])
    return use, tot


def resolve(name: str, ctx: SchedulerContext) -> Scheduler | None:
    if name == "app-history":
        return AppHistory(ctx)
    if name == "app-history-now":
        return AppHistory(ctx, tau=1.0, every=60.0)
    return None


if __name__ == "__main__":
    RESOLVERS.insert(0, resolve)
    sys.exit(online_quality.main(sys.argv[1:]))
