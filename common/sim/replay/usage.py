"""Replay mode's usage model: real CPU and memory use of running pods, overload and OOM.

**Usage model.** Real use of a running pod, per resource ``r`` (CPU, memory)::

    use_r(t) = base_r * max(0, 1 + amp_r * sin(2 pi t / period + phase) + eps_r(t))
    base_r   = max(request_r, kube non-zero default) * QOS_RATIO_r[qos] * lognormal factor

The mean ratios of real use to request by QoS class (:data:`QOS_USAGE_RATIO`; for
Guaranteed pods the cap at the request pulls the realised mean below the table value,
to about 0.85 with the default variation):

    ========== ==== ====  =====================================================
    QoS        CPU  mem   rationale
    ========== ==== ====  =====================================================
    BE         1.60 1.30  no meaningful request; bursts into idle capacity
    Burstable  1.10 0.95  requests near the typical use, bursts above
    LS         0.70 0.85  latency-sensitive: over-provisioned for headroom
    Guaranteed 0.95 0.97  limit == request: capped at the request
    ========== ==== ====  =====================================================

The per-pod factor is lognormal with mean 1 and sigma ``usage_pod_sigma``; ``phase`` is
uniform, ``period`` is ``usage_period_s`` x U(0.5, 1.5) per pod; ``eps_r`` is a
stationary AR(1) process stepped at each tick, ``eps <- rho eps + sqrt(1 - rho^2) sigma z``
with ``rho = exp(-usage_tick_s / usage_noise_tau_s)`` and ``sigma`` = ``usage_noise_cpu``
/ ``usage_noise_mem``, started from its stationary law and kept across an eviction. The
normals ``z`` of a tick are a contiguous block at a random offset of a table drawn once
per run (fresh normals for every running pod at every tick would dominate the run time).
Use is re-evaluated for every running pod at each usage tick (every
``usage_tick_s``, vectorised over packed arrays of the running pods) and is constant in
between; a starting pod's use is evaluated when it starts. A Guaranteed pod's use is
capped at its request, and any pod's memory use at its node's memory (one pod alone
never OOMs a node). Per node, ``state.cpu_used`` is the sum of its pods' CPU use clipped
at capacity (CPU is compressible: excess demand is throttled) and ``state.mem_used`` the
unclipped sum (memory is not). Both are kept current at every event.

**Overload and OOM** (checked at each usage tick). A node is overloaded when its real CPU
use is above ``overload_threshold`` (85%) of capacity; ``overload_events`` counts the
*transitions* into overload (a node that stays overloaded for many ticks counts once,
again after it drops below and comes back). When a node's real memory use exceeds its
capacity, its lowest-priority running pod (lowest QoS code, then the most recently
started) is killed, released and requeued, repeatedly until the node fits; each kill is
one ``oom_event``. :class:`NodeStats` (``sim.node_stats``) exposes per-node overload and
OOM counters, the overload flag and the usage trend: an exponential moving average
(weight ``trend_alpha``) of the per-tick change of ``cpu_used`` / ``mem_used`` in units
per second.

The code is :class:`UsageMixin`, a base class of
:class:`~fedsched.common.sim.replay.simulator.ReplaySimulator` whose methods the event
loop calls: ``_init_usage`` at construction (draws every pod's usage parameters),
``_start_usage`` when a pod starts running, ``_stop_usage`` when it is released, and
``_step_usage`` at each usage tick (AR(1) noise, OOM kills, overload transitions, trend).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fedsched.common.model.cluster import DEFAULT_MEMORY_REQUEST_MIB, DEFAULT_MILLI_CPU_REQUEST

if TYPE_CHECKING:
    from fedsched.common.model.cluster import ClusterState, NodeTable, PodTable
    from fedsched.common.sim.replay.config import ReplayConfig
    from fedsched.common.sim.replay.simulator import NodeStats

# Mean real use / request per QoS code (BE, Burstable, LS, Guaranteed): (CPU, memory).
QOS_USAGE_RATIO = ((1.60, 1.30), (1.10, 0.95), (0.70, 0.85), (0.95, 0.97))
GUARANTEED = 3  # use capped at the request (limit == request)

# Rows of the per-pod usage parameter arrays (CPU row, then memory row, for each pair).
_BASE, _AMP, _MAX, _EPS, _CUR = 0, 2, 4, 6, 8  # base use, base * amplitude, cap, AR(1) state, current
_OMEGA, _PHASE, _NROWS = 10, 11, 12
INNOVATION_TABLE_MIN = 1 << 16  # pre-drawn normals per resource (at least 2x the pods)


class UsageMixin:
    """The usage model of :class:`ReplaySimulator` (see the module docstring).

    Owns the float capacities ``_cap_cpu`` / ``_cap_mem``, the per-node CPU demand
    ``_cpu_demand`` and previous use ``_prev_cpu`` / ``_prev_mem`` (trend), every pod's
    usage parameters ``_pf``, the packed parameters of the running pods ``_sf`` (slot =
    column, with ``_s_pod`` / ``_s_node``, ``_slot`` per pod, ``_n_active`` slots used),
    the AR(1) factor ``_rho`` and innovation table ``_innov``, and the per-pod QoS codes
    ``_qos`` and OOM kill counts ``_oom_kills``. Uses the simulator's attributes annotated
    below and its ``_requeue`` (an OOM-killed pod goes back to the queue).
    """

    config: ReplayConfig
    nodes: NodeTable
    state: ClusterState
    node_stats: NodeStats
    counters: dict[str, int]
    now: float
    _g_usage: np.random.Generator
    _node: list[int]  # node of each bound pod, -1 when not bound
    _node_pods: list[set[int]]  # the pods bound to each node
    _start_t: list[float]  # when each pod last started running

    def _init_usage(self, pods: PodTable, g_work: np.random.Generator) -> None:
        """Draw every pod's usage parameters (``g_work``) and the innovation table (``_g_usage``)."""
        cfg, nodes = self.config, self.nodes
        n_nodes, n_pods = len(nodes), len(pods)
        self._cap_cpu = nodes.cpu.astype(np.float64)
        self._cap_mem = nodes.mem.astype(np.float64)
        self._cpu_demand = np.zeros(n_nodes)
        self._prev_cpu = np.zeros(n_nodes)
        self._prev_mem = np.zeros(n_nodes)
        self._oom_kills = [0] * n_pods
        self._qos = pods.qos.tolist()

        # Usage parameters for every pod (drawn up front: independent of the scheduler).
        qos = np.clip(pods.qos, 0, len(QOS_USAGE_RATIO) - 1)
        ratio = np.asarray(QOS_USAGE_RATIO)[qos]
        s = cfg.usage_pod_sigma
        factor = np.exp(g_work.normal(-0.5 * s * s, s, n_pods)) if s > 0 else np.ones(n_pods)
        cpu_nz = np.where(pods.cpu > 0, pods.cpu, DEFAULT_MILLI_CPU_REQUEST).astype(np.float64)
        mem_nz = np.where(pods.mem > 0, pods.mem, DEFAULT_MEMORY_REQUEST_MIB).astype(np.float64)
        guaranteed = pods.qos == GUARANTEED
        # _pf[row, pod]: usage parameters of every pod; _sf[row, slot]: the same for the pods
        # running now, packed in slots 0..n_active-1 so a usage tick is a few vector ops.
        pf = self._pf = np.zeros((_NROWS, n_pods))
        pf[_BASE] = cpu_nz * ratio[:, 0] * factor
        pf[_BASE + 1] = mem_nz * ratio[:, 1] * factor
        pf[_AMP] = pf[_BASE] * cfg.usage_amp_cpu
        pf[_AMP + 1] = pf[_BASE + 1] * cfg.usage_amp_mem
        pf[_MAX] = np.where(guaranteed, cpu_nz, np.inf)
        pf[_MAX + 1] = np.where(guaranteed, mem_nz, np.inf)
        pf[_OMEGA] = 2 * np.pi / (cfg.usage_period_s * g_work.uniform(0.5, 1.5, n_pods))
        pf[_PHASE] = g_work.uniform(0, 2 * np.pi, n_pods)
        pf[_EPS] = g_work.standard_normal(n_pods) * cfg.usage_noise_cpu  # stationary start
        pf[_EPS + 1] = g_work.standard_normal(n_pods) * cfg.usage_noise_mem
        # AR(1) innovations: a tick reads a contiguous block at a random offset of a
        # pre-drawn table (drawing fresh normals for every running pod per tick is slow).
        self._rho = math.exp(-cfg.usage_tick_s / cfg.usage_noise_tau_s)
        m = max(INNOVATION_TABLE_MIN, 2 * n_pods)
        self._innov = self._g_usage.standard_normal((2, m)) * (math.sqrt(1.0 - self._rho ** 2) * np.array(
            [[cfg.usage_noise_cpu], [cfg.usage_noise_mem]]))
        self._sf = np.zeros((_NROWS, n_pods))
        self._s_node = np.zeros(n_pods, dtype=np.int64)
        self._s_pod = np.zeros(n_pods, dtype=np.int64)
        self._slot = [-1] * n_pods  # slot of a running pod, -1 when not running
        self._n_active = 0

    def _start_usage(self, p: int) -> None:
        """Pod ``p`` (bound to ``_node[p]``) starts running: give it a slot, evaluate its use."""
        n = self._node[p]
        k = self._n_active
        self._n_active = k + 1
        self._slot[p] = k
        self._s_pod[k] = p
        self._s_node[k] = n
        col = self._pf[:, p].tolist()
        col[_MAX + 1] = min(col[_MAX + 1], self._cap_mem[n])  # one pod alone never OOMs its node
        wave = math.sin(col[_OMEGA] * self.now + col[_PHASE])
        cu = min(max(0.0, col[_BASE] * (1.0 + col[_EPS]) + col[_AMP] * wave), col[_MAX])
        mu = min(max(0.0, col[_BASE + 1] * (1.0 + col[_EPS + 1]) + col[_AMP + 1] * wave), col[_MAX + 1])
        col[_CUR], col[_CUR + 1] = cu, mu
        self._sf[:, k] = col
        self._cpu_demand[n] += cu
        s = self.state
        s.cpu_used[n] = min(self._cpu_demand[n], self._cap_cpu[n])
        s.mem_used[n] += mu

    def _stop_usage(self, p: int) -> bool:
        """Remove pod ``p``'s use from its node; ``False`` (nothing done) if it was not running."""
        k = self._slot[p]
        if k < 0:
            return False
        n = self._node[p]
        sf = self._sf
        cu, mu = float(sf[_CUR, k]), float(sf[_CUR + 1, k])
        self._pf[_EPS:_EPS + 2, p] = sf[_EPS:_EPS + 2, k]  # keep the noise state for a restart
        last = self._n_active - 1
        if k != last:  # move the last slot into the hole
            q = int(self._s_pod[last])
            sf[:, k] = sf[:, last]
            self._s_pod[k] = q
            self._s_node[k] = self._s_node[last]
            self._slot[q] = k
        self._n_active = last
        self._slot[p] = -1
        d = self._cpu_demand[n] - cu
        self._cpu_demand[n] = d if d > 1e-9 else 0.0
        s = self.state
        s.cpu_used[n] = min(self._cpu_demand[n], self._cap_cpu[n])
        m = s.mem_used[n] - mu
        s.mem_used[n] = m if m > 1e-9 else 0.0
        return True

    def _step_usage(self) -> None:
        """A usage tick: re-evaluate every running pod's use, OOM kills, overload, trend."""
        cfg, s, ns = self.config, self.state, self.node_stats
        now = self.now
        k = self._n_active
        n_nodes = len(s.alive)
        if k:
            sf = self._sf
            eps = sf[_EPS:_EPS + 2, :k]
            eps *= self._rho
            at = int(self._g_usage.integers(self._innov.shape[1] - k + 1))
            eps += self._innov[:, at:at + k]
            use = eps + 1.0
            use *= sf[_BASE:_BASE + 2, :k]
            arg = sf[_OMEGA, :k] * now
            arg += sf[_PHASE, :k]
            wave = np.sin(arg.astype(np.float32))  # float32 sin is vectorised, far faster
            cur = sf[_CUR:_CUR + 2, :k]
            np.multiply(sf[_AMP:_AMP + 2, :k], wave, out=cur)
            cur += use
            np.maximum(cur, 0.0, out=cur)
            np.minimum(cur, sf[_MAX:_MAX + 2, :k], out=cur)
            nodes = self._s_node[:k]
            self._cpu_demand = np.bincount(nodes, weights=cur[0], minlength=n_nodes)
            s.mem_used[:] = np.bincount(nodes, weights=cur[1], minlength=n_nodes)
        else:
            self._cpu_demand[:] = 0.0
            s.mem_used[:] = 0.0
        np.minimum(self._cpu_demand, self._cap_cpu, out=s.cpu_used)
        # OOM: kill the lowest-priority, most recently started pod until memory fits.
        for n in np.flatnonzero(s.mem_used > self._cap_mem).tolist():
            while s.mem_used[n] > self._cap_mem[n]:
                cands = [p for p in self._node_pods[n] if self._slot[p] >= 0]
                if not cands:
                    break
                victim = min(cands, key=lambda p: (self._qos[p], -self._start_t[p], -p))
                kills = self._oom_kills[victim] = self._oom_kills[victim] + 1
                self._requeue(victim, min(cfg.oom_restart_s * 2.0 ** (kills - 1), cfg.oom_restart_max_s))
                ns.oom_count[n] += 1
                self.counters["oom_events"] += 1
        # Overload transitions, trend.
        over = s.cpu_used > cfg.overload_threshold * self._cap_cpu
        new = over & ~ns.overloaded
        if new.any():
            ns.overload_count += new
            self.counters["overload_events"] += int(new.sum())
        ns.overloaded[:] = over
        # trend += alpha * (delta / dt - trend), in place (observers may hold the arrays)
        a, dt = cfg.trend_alpha, cfg.usage_tick_s
        for trend, used, prev in ((ns.cpu_trend, s.cpu_used, self._prev_cpu),
                                  (ns.mem_trend, s.mem_used, self._prev_mem)):
            np.subtract(used, prev, out=prev)
            prev *= a / dt
            trend *= 1 - a
            trend += prev
            prev[:] = used
