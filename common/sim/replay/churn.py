"""Replay mode's node churn: node failures and repairs, and the autoscaler.

**Node failures.** Each up node fails as a Poisson process with rate
``failure_rate_per_node_hour`` (per simulated hour): one cluster-wide Poisson stream
picks a uniform node and the failure is dropped if the node is not up (thinning). A
failure evicts every pod bound to the node (they are requeued) and sets
``state.alive[n] = False``; the node comes back empty after an exponential repair time
with mean ``repair_mean_s``.

**Autoscaler** (off by default; runs at each usage tick). With ``autoscale``, a seeded
``spare_fraction`` of the nodes starts removed (not alive). Scale-up: when the pending
queue has held at least ``scale_up_pending`` pods for ``scale_up_after_s``, one removed
node is brought back (alive after ``node_boot_s``), preferring the lowest-indexed removed
node that could host the oldest pending pod when empty; the timer then restarts. Scale-
down: an up node without any bound pod for ``scale_down_idle_s`` is removed, never going
below ``min_nodes`` up nodes.

The code is :class:`ChurnMixin`, a base class of
:class:`~fedsched.common.sim.replay.simulator.ReplaySimulator`: ``_init_churn`` at
construction (spare pool, first failure), ``_fail_event`` and ``_node_up`` as handlers of
the ``EV_FAIL`` / ``EV_REPAIR`` / ``EV_BOOT`` events, and ``_autoscale`` at each usage tick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedsched.common.model.cluster import Pod
from fedsched.common.sim.replay.config import (
    EV_BOOT,
    EV_FAIL,
    EV_REPAIR,
    NODE_BOOTING,
    NODE_FAILED,
    NODE_REMOVED,
    NODE_UP,
)

if TYPE_CHECKING:
    from fedsched.common.model.cluster import ClusterState, NodeTable, PodTable
    from fedsched.common.sim.replay.config import ReplayConfig
    from fedsched.common.sim.replay.simulator import NodeStats


class ChurnMixin:
    """Node failures, repairs and the autoscaler of :class:`ReplaySimulator` (module docstring).

    Owns ``_fail_rate`` (cluster-wide failures per second) and ``_above_since`` (since when
    the pending queue has been long enough for a scale-up, ``None`` when it is not). Uses
    the simulator's attributes annotated below and its ``_push`` (queue an event) and
    ``_requeue`` (an evicted pod goes back to the queue).
    """

    config: ReplayConfig
    nodes: NodeTable
    pods: PodTable
    state: ClusterState
    node_stats: NodeStats
    counters: dict[str, int]
    now: float
    _g_fail: np.random.Generator
    _node_pods: list[set[int]]  # the pods bound to each node
    _pending: dict[int, None]  # the pending queue, oldest first
    _pod_cache: list[Pod | None]
    _epoch: int  # bumped when capacity may have grown

    def _init_churn(self) -> None:
        """Remove the spare pool (with ``autoscale``) and queue the first node failure."""
        cfg, n_nodes = self.config, len(self.nodes)
        self._above_since: float | None = None
        if cfg.autoscale and cfg.spare_fraction > 0:
            k = min(round(cfg.spare_fraction * n_nodes), max(n_nodes - max(cfg.min_nodes, 0), 0))
            spare = self._g_fail.choice(n_nodes, size=k, replace=False)
            self.state.alive[spare] = False
            self.node_stats.status[spare] = NODE_REMOVED
        self._fail_rate = cfg.failure_rate_per_node_hour * n_nodes / 3600.0
        if self._fail_rate > 0:
            self._push(self._g_fail.exponential(1.0 / self._fail_rate), EV_FAIL, 0, 0)

    def _evict_node(self, n: int) -> None:
        for p in sorted(self._node_pods[n]):
            self._requeue(p)
            self.counters["evictions"] += 1

    def _fail_event(self) -> None:
        n = int(self._g_fail.integers(len(self.nodes)))
        ns = self.node_stats
        if ns.status[n] == NODE_UP:
            self._evict_node(n)
            self.state.alive[n] = False
            ns.status[n] = NODE_FAILED
            ns.failure_count[n] += 1
            ns.overloaded[n] = False
            self.counters["node_failures"] += 1
            self._push(self.now + self._g_fail.exponential(self.config.repair_mean_s), EV_REPAIR, n, 0)
        self._push(self.now + self._g_fail.exponential(1.0 / self._fail_rate), EV_FAIL, 0, 0)

    def _node_up(self, n: int, kind: int) -> None:
        ns = self.node_stats
        self.state.alive[n] = True
        ns.status[n] = NODE_UP
        ns.empty_since[n] = self.now
        self._epoch += 1
        self.counters["node_repairs" if kind == EV_REPAIR else "scale_ups"] += 1

    def _autoscale(self) -> None:
        cfg, ns, now = self.config, self.node_stats, self.now
        if len(self._pending) >= cfg.scale_up_pending:
            if self._above_since is None:
                self._above_since = now
            elif now - self._above_since >= cfg.scale_up_after_s:
                removed = np.flatnonzero(ns.status == NODE_REMOVED)
                if len(removed):
                    p = next(iter(self._pending))
                    pod = self._pod_cache[p] or Pod.from_table(self.pods, p)
                    nt = self.nodes
                    fits = (nt.cpu[removed] >= pod.cpu) & (nt.mem[removed] >= pod.mem) & (
                        nt.gpu[removed] >= pod.num_gpu)
                    if pod.num_gpu:
                        fits &= self.state.model_ok(pod)[removed]
                    n = int(removed[np.argmax(fits)]) if fits.any() else int(removed[0])
                    ns.status[n] = NODE_BOOTING
                    self._push(now + cfg.node_boot_s, EV_BOOT, n, 0)
                self._above_since = now
        else:
            self._above_since = None
        idle = np.flatnonzero((ns.status == NODE_UP) & (ns.n_pods == 0)
                              & (now - ns.empty_since >= cfg.scale_down_idle_s))
        room = int((ns.status == NODE_UP).sum()) - cfg.min_nodes
        if len(idle) and room > 0:
            down = idle[:room]
            self.state.alive[down] = False
            ns.status[down] = NODE_REMOVED
            ns.overloaded[down] = False
            self.counters["scale_downs"] += len(down)
