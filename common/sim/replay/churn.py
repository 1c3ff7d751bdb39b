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

The code is :class:`NodeChurn`, an object the simulator
(:class:`~fedsched.common.sim.replay.simulator.ReplaySimulator`) builds once per run and
calls: the constructor removes the spare pool, :meth:`NodeChurn.next_failure` draws when the
next failure event comes, :meth:`NodeChurn.strike` and :meth:`NodeChurn.fail` handle one
(``EV_FAIL``), :meth:`NodeChurn.node_up` brings a node back (``EV_REPAIR`` / ``EV_BOOT``) and
:meth:`NodeChurn.autoscale` runs at each usage tick. It owns node status (the status,
failure and ``empty_since`` fields of :class:`~fedsched.common.sim.replay.config.NodeStats`
and ``state.alive``); the simulator owns the pods and the event queue: it evicts a failed
node's pods and queues the events whose times these methods return.

May import: ``fedsched.common.model`` and ``config`` of this sub-package (never ``simulator``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

from fedsched.common.model.cluster import Pod
from fedsched.common.sim.replay.config import NODE_BOOTING, NODE_FAILED, NODE_REMOVED, NODE_UP

if TYPE_CHECKING:
    from fedsched.common.model.cluster import ClusterState, NodeTable, PodTable
    from fedsched.common.sim.replay.config import NodeStats, ReplayConfig


class NodeChurn:
    """Node failures, repairs and the autoscaler of one replay run (see the module docstring).

    Inputs, fixed at construction: the run's ``config``, ``nodes`` and ``pods`` (the oldest
    pending pod's requests, for a scale-up), the cluster ``state`` (``alive``), the
    ``node_stats`` it keeps (status, failures, ``empty_since``; it reads ``n_pods``) and the
    generator ``g_fail`` (spares and failures). Owns ``fail_rate`` (cluster-wide failures per
    second) and ``_above_since`` (since when the pending queue has been long enough for a
    scale-up, ``None`` when it is not).
    """

    def __init__(self, config: ReplayConfig, nodes: NodeTable, pods: PodTable, state: ClusterState,
                 node_stats: NodeStats, g_fail: np.random.Generator) -> None:
        """Remove the spare pool (with ``autoscale``)."""
        cfg, n_nodes = config, len(nodes)
        self.config, self.nodes, self.pods = config, nodes, pods
        self.state, self.node_stats, self._g_fail = state, node_stats, g_fail
        self._above_since: float | None = None
        if cfg.autoscale and cfg.spare_fraction > 0:
            k = min(round(cfg.spare_fraction * n_nodes), max(n_nodes - max(cfg.min_nodes, 0), 0))
            spare = g_fail.choice(n_nodes, size=k, replace=False)
            state.alive[spare] = False
            node_stats.status[spare] = NODE_REMOVED
        self.fail_rate = cfg.failure_rate_per_node_hour * n_nodes / 3600.0

    def next_failure(self, now: float) -> float:
        """When the failure event after ``now`` comes (call only with ``fail_rate > 0``)."""
        return now + self._g_fail.exponential(1.0 / self.fail_rate)

    def strike(self) -> int:
        """The node a failure event picks (uniformly), or -1 when it is not up (thinning)."""
        n = int(self._g_fail.integers(len(self.nodes)))
        return n if self.node_stats.status[n] == NODE_UP else -1

    def fail(self, n: int, now: float) -> float:
        """Node ``n`` (struck, its pods already evicted) fails at ``now``; returns when it is repaired."""
        ns = self.node_stats
        self.state.alive[n] = False
        ns.status[n] = NODE_FAILED
        ns.failure_count[n] += 1
        ns.overloaded[n] = False
        return now + self._g_fail.exponential(self.config.repair_mean_s)

    def node_up(self, n: int, now: float) -> None:
        """Node ``n`` (repaired or booted) is up and empty at ``now``."""
        ns = self.node_stats
        self.state.alive[n] = True
        ns.status[n] = NODE_UP
        ns.empty_since[n] = now

    def autoscale(self, now: float, pending: Collection[int], pod_cache: list[Pod | None]) -> tuple[int, int]:
        """The autoscaler at a usage tick ``now``, with the pending queue ``pending`` (PodTable
        rows, oldest first; ``pod_cache`` holds the rows' :class:`Pod` where already built).

        Returns ``(boot, removed)``: the node to boot (status ``NODE_BOOTING`` now; the
        simulator brings it up ``node_boot_s`` later), -1 for none, and how many idle nodes it
        removed.
        """
        cfg, ns = self.config, self.node_stats
        boot = -1
        if len(pending) >= cfg.scale_up_pending:
            if self._above_since is None:
                self._above_since = now
            elif now - self._above_since >= cfg.scale_up_after_s:
                removed = np.flatnonzero(ns.status == NODE_REMOVED)
                if len(removed):
                    p = next(iter(pending))
                    pod = pod_cache[p] or Pod.from_table(self.pods, p)
                    nt = self.nodes
                    fits = (nt.cpu[removed] >= pod.cpu) & (nt.mem[removed] >= pod.mem) & (
                        nt.gpu[removed] >= pod.num_gpu)
                    if pod.num_gpu:
                        fits &= self.state.model_ok(pod)[removed]
                    boot = int(removed[np.argmax(fits)]) if fits.any() else int(removed[0])
                    ns.status[boot] = NODE_BOOTING
                self._above_since = now
        else:
            self._above_since = None
        idle = np.flatnonzero((ns.status == NODE_UP) & (ns.n_pods == 0)
                              & (now - ns.empty_since >= cfg.scale_down_idle_s))
        room = int((ns.status == NODE_UP).sum()) - cfg.min_nodes
        n_down = 0
        if len(idle) and room > 0:
            down = idle[:room]
            self.state.alive[down] = False
            ns.status[down] = NODE_REMOVED
            ns.overloaded[down] = False
            n_down = len(down)
        return boot, n_down
