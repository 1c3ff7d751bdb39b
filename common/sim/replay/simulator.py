"""Replay mode: a discrete-event simulation of a trace with arrivals, departures and churn.

Every modelling choice and default (all defaults live in :class:`ReplayConfig`):

**Workload** (:func:`replay_workload`). The run starts at trace time ``t0``: the start
of ``window_s`` if given, else the creation time of the ``start_quantile`` quantile of the
pods (default 0: the earliest creation; openb's first ~100 days hold only ~18 pods, and
``start_quantile=0.01`` skips them). Times are shifted by ``t0`` and divided by
``time_compression`` (arrivals *and* durations: sim time = trace time / factor). A pod's
duration is ``deletion - creation``; a pod without a deletion time never leaves. A pod
without a creation time, or created before ``t0`` and not yet deleted at ``t0``, is
present at the start: it arrives at 0 (plus jitter) and runs until its deletion (a
cluster snapshot at ``t0``); pods gone by ``t0`` or created at or after the end of
``window_s`` are dropped. Durations are multiplied by ``duration_scale``; with
``target_load`` set, ``duration_scale`` is instead solved (bisection) so that the
time-averaged *requested* load over ``[0, end]`` (``[0, last arrival]`` when the run has
no finite end) is ``target_load`` x capacity, counting
each pod from its arrival to ``min(arrival + duration, end)`` (queueing ignored). The
measure is GPU milli when the cluster has GPUs, CPU milli otherwise (as in packing
mode), over every node, spares included. The openb traces are ~0.2% loaded as recorded,
so ``target_load`` (or a large ``duration_scale``) is how a run gets a loaded cluster;
since an openb pod list requests about the whole cluster in total and arrives gradually,
at most ~45% is reachable (with ``start_quantile=0.01``); an unreachable target uses
the maximum (every pod stays to the end) and ``ReplayWorkload.offered_load`` tells what
was reached. Noise (seeded, drawn for every trace row so the selection does not change
a pod's draw): each arrival gets ``N(0, arrival_jitter_s)`` seconds (clipped at 0), each
duration a factor ``max(0.05, 1 + N(0, duration_jitter))``. Pods are ordered by arrival
(ties by trace row); ``max_pods`` keeps the first arrivals. The run ends at
``horizon_s``; ``None`` means the last arrival, ``math.inf`` means when nothing is left to
do (all arrived, none pending, no pod with a finite duration still bound).

**Queue** (kube-scheduler-like). An arriving pod is tried at once. A pod that fits
nowhere (``Placement.node == -1``) is retried after an exponential backoff
``min(backoff_initial_s * 2**(k-1), backoff_max_s)`` after its k-th failed attempt. A
pod that still has not been bound ``max_wait_s`` after it (re-)entered the queue gets a
last attempt at that deadline and then counts as failed. Pods still queued at the end are
``pending_pods``. Since feasibility can only grow when something is released or a node
comes up, a retry with no release/node-up since the pod's last failed attempt is
answered "fits nowhere" without calling the scheduler (exactly what ``place`` would
return; no random draw is skipped). The pending latency of a bind is measured from the
moment the pod (re-)entered the queue. Simultaneous events: queued events (departures,
ticks, retries, ...) run before trace arrivals of the same instant, then by push order.

**Start-up.** A bound pod holds its requests at once but starts running (real usage,
duration clock) after an exponential start-up latency with mean ``startup_mean_s``. A
pod's departure is ``start + remaining duration``. An evicted or OOM-killed pod is
released and requeued with its backoff reset, and later runs its *remaining* duration
(work done so far is kept), so the offered load matches the trace. A pod evicted by a
node failure is tried again at once; an OOM-killed pod after a crash-loop delay
``oom_restart_s`` doubling with each kill of that pod up to ``oom_restart_max_s``
(kubelet's CrashLoopBackOff: 10 s to 5 min), so a pod that keeps overflowing a node does
not flood the counters.

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

**Metrics** (:class:`ReplayResult`). ``metrics`` holds every name of
:data:`fedsched.common.model.metrics.METRICS`: allocation and fragmentation at the end
(:func:`snapshot_metrics`, alive nodes), packing-only curve points NaN, ``util_mean`` and
``util_variance`` the time average over usage ticks of the mean and variance over alive
nodes of real CPU utilisation (%), pending latency (mean, p99) over all binds, and the
event counters. ``counters`` adds events processed, decisions, completions, evictions,
node failures, scale-ups/downs and events per second.

**Randomness.** One ``SeedSequence(seed)`` spawns independent generators for the
workload noise and per-pod usage parameters, the usage noise, start-up latencies, node
failures/spares and the scheduler's tie-break (``sim.rng``, passed to ``place``), so the
same seed gives the same run, and the workload is the same for every scheduler.

**Stepping API.** :class:`ReplaySimulator` runs the event loop until a pod needs a
decision (:meth:`ReplaySimulator.next_pod` returns it with the state) and applies the
decision with :meth:`ReplaySimulator.bind` (``Placement(-1)``: fits nowhere, backoff), so
a Gymnasium environment can drive it one decision at a time; :func:`run_replay` loops it
with a scheduler through :func:`fedsched.common.schedulers.place`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedsched.common.learning.features import Telemetry
from fedsched.common.model.cluster import (
    DEFAULT_MEMORY_REQUEST_MIB,
    DEFAULT_MILLI_CPU_REQUEST,
    ClusterState,
    NodeTable,
    Pod,
    PodTable,
)
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.metrics import METRICS, FragTracker, latency_stats, snapshot_metrics, utilisation
from fedsched.common.schedulers import Placement, Scheduler, place

# Mean real use / request per QoS code (BE, Burstable, LS, Guaranteed): (CPU, memory).
QOS_USAGE_RATIO = ((1.60, 1.30), (1.10, 0.95), (0.70, 0.85), (0.95, 0.97))
GUARANTEED = 3  # use capped at the request (limit == request)

# Pod status codes (sim.status); every arrived pod is in exactly one of the last four.
NOT_ARRIVED, PENDING, RUNNING, COMPLETED, FAILED = 0, 1, 2, 3, 4
# Node status codes (NodeStats.status).
NODE_UP, NODE_FAILED, NODE_REMOVED, NODE_BOOTING = 0, 1, 2, 3
# Queued event kinds; trace arrivals are a separate pre-sorted stream merged with the heap.
EV_ATTEMPT, EV_START, EV_DEPART, EV_TICK, EV_FAIL, EV_REPAIR, EV_BOOT = range(7)
# Rows of the per-pod usage parameter arrays (CPU row, then memory row, for each pair).
_BASE, _AMP, _MAX, _EPS, _CUR = 0, 2, 4, 6, 8  # base use, base * amplitude, cap, AR(1) state, current
_OMEGA, _PHASE, _NROWS = 10, 11, 12
INNOVATION_TABLE_MIN = 1 << 16  # pre-drawn normals per resource (at least 2x the pods)


@dataclass
class ReplayConfig:
    """Every knob of replay mode (times in simulated seconds unless noted)."""

    # --- workload ---
    time_compression: float = 1.0  # sim time = trace time / factor (arrivals and durations)
    duration_scale: float = 1.0  # extra multiplier on pod durations after compression
    target_load: float | None = None  # solve duration_scale for this mean requested load (fraction)
    start_quantile: float = 0.0  # start at the creation time of this quantile of pods (skip a sparse head)
    window_s: tuple[float, float] | None = None  # trace-time [start, end) to replay (beats start_quantile)
    max_pods: int | None = None  # keep only the first max_pods arrivals
    horizon_s: float | None = None  # end of the run; None = last arrival, math.inf = until idle
    arrival_jitter_s: float = 1.0  # std of Gaussian noise on each arrival time (clipped at 0)
    duration_jitter: float = 0.05  # relative std of Gaussian noise on each duration
    startup_mean_s: float = 2.0  # mean of the exponential bind-to-running latency
    # --- pending queue ---
    backoff_initial_s: float = 1.0  # first retry delay after a failed attempt
    backoff_max_s: float = 10.0  # retry delay cap (doubles per failed attempt up to this)
    max_wait_s: float = 600.0  # a pod not bound this long after (re-)queueing fails
    oom_restart_s: float = 10.0  # an OOM-killed pod is retried after this (crash-loop backoff) ...
    oom_restart_max_s: float = 300.0  # ... doubling per kill of the same pod up to this
    # --- usage model ---
    usage_tick_s: float = 10.0  # interval of usage updates, overload/OOM checks and autoscaler
    usage_pod_sigma: float = 0.25  # sigma of the per-pod lognormal usage factor (mean 1)
    usage_amp_cpu: float = 0.30  # relative amplitude of the per-pod CPU sinusoid
    usage_amp_mem: float = 0.10  # relative amplitude of the per-pod memory sinusoid
    usage_period_s: float = 3600.0  # mean period of the sinusoid (per pod x U(0.5, 1.5))
    usage_noise_cpu: float = 0.15  # stationary std of the CPU AR(1) noise (relative)
    usage_noise_mem: float = 0.05  # stationary std of the memory AR(1) noise (relative)
    usage_noise_tau_s: float = 60.0  # correlation time of the AR(1) noise
    overload_threshold: float = 0.85  # real CPU use / capacity above which a node is overloaded
    trend_alpha: float = 0.3  # EMA weight of the per-node usage trend
    # --- node failures ---
    failure_rate_per_node_hour: float = 1e-4  # Poisson failure rate of each up node
    repair_mean_s: float = 1800.0  # mean of the exponential repair time
    # --- autoscaler ---
    autoscale: bool = False  # enable the scale-up/scale-down loop
    spare_fraction: float = 0.0  # share of nodes removed at the start (spare pool), with autoscale
    scale_up_pending: int = 1  # pending-queue length that triggers a scale-up ...
    scale_up_after_s: float = 30.0  # ... once it has held this long
    node_boot_s: float = 60.0  # delay between scale-up decision and the node being alive
    scale_down_idle_s: float = 600.0  # an up node empty this long is removed
    min_nodes: int = 1  # scale-down never leaves fewer up nodes

    def validate(self) -> None:
        pos = ("time_compression", "duration_scale", "backoff_initial_s", "backoff_max_s",
               "usage_tick_s", "usage_period_s", "usage_noise_tau_s", "repair_mean_s")
        for k in pos:
            if not getattr(self, k) > 0:
                raise ValueError(f"ReplayConfig.{k} must be positive, got {getattr(self, k)}")
        nonneg = ("arrival_jitter_s", "duration_jitter", "startup_mean_s", "max_wait_s",
                  "usage_pod_sigma", "usage_amp_cpu", "usage_amp_mem", "usage_noise_cpu",
                  "usage_noise_mem", "failure_rate_per_node_hour", "scale_up_after_s",
                  "node_boot_s", "scale_down_idle_s", "oom_restart_s", "oom_restart_max_s")
        for k in nonneg:
            v = getattr(self, k)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"ReplayConfig.{k} must be finite and >= 0, got {v}")
        if not 0 <= self.start_quantile < 1:
            raise ValueError(f"ReplayConfig.start_quantile must be in [0, 1), got {self.start_quantile}")
        if self.target_load is not None and not self.target_load > 0:
            raise ValueError(f"ReplayConfig.target_load must be positive, got {self.target_load}")
        if self.max_pods is not None and self.max_pods < 0:
            raise ValueError(f"ReplayConfig.max_pods must be >= 0, got {self.max_pods}")
        if self.horizon_s is not None and not self.horizon_s >= 0:
            raise ValueError(f"ReplayConfig.horizon_s must be >= 0, got {self.horizon_s}")
        if self.window_s is not None and not self.window_s[0] < self.window_s[1]:
            raise ValueError(f"ReplayConfig.window_s must be (start, end) with start < end, "
                             f"got {self.window_s}")
        if not 0 <= self.spare_fraction < 1:
            raise ValueError(f"ReplayConfig.spare_fraction must be in [0, 1), got {self.spare_fraction}")
        if not self.overload_threshold > 0:
            raise ValueError("ReplayConfig.overload_threshold must be positive")
        if not 0 < self.trend_alpha <= 1:
            raise ValueError("ReplayConfig.trend_alpha must be in (0, 1]")


@dataclass(frozen=True)
class ReplayWorkload:
    """The replayed pods in arrival order, with sim-time arrivals and durations."""

    pod: np.ndarray  # int64 row in the PodTable
    arrival: np.ndarray  # float64 sim seconds, non-decreasing
    duration: np.ndarray  # float64 sim seconds from start to departure; inf = never leaves
    duration_scale: float  # the scale applied (solved when target_load is set)
    end: float  # end of the run (sim seconds); inf = until idle
    offered_load: float  # mean requested load / capacity over [0, end] ([0, last arrival] if end is inf)


def _measure(pods: PodTable, nodes: NodeTable) -> tuple[np.ndarray, float]:
    if int(nodes.gpu.sum()) > 0:
        return pods.gpu_request.astype(np.float64), float(nodes.total_gpu_milli)
    return pods.cpu.astype(np.float64), float(nodes.cpu.sum())


def _offered(size: np.ndarray, arrival: np.ndarray, duration: np.ndarray, end: float,
             capacity: float) -> float:
    leave = np.minimum(arrival + duration, end)
    return float((size * np.maximum(leave - arrival, 0.0)).sum()) / (end * capacity)


def replay_workload(pods: PodTable, nodes: NodeTable, config: ReplayConfig,
                    rng: np.random.Generator) -> ReplayWorkload:
    """Arrival order, arrival times and durations of the replayed pods (module docstring)."""
    cfg = config
    n = len(pods)
    creation, deletion = pods.creation.astype(np.float64), pods.deletion.astype(np.float64)
    known = ~np.isnan(creation)
    # Draw noise for every trace row, so a pod's noise does not depend on the selection.
    a_noise = rng.normal(0.0, 1.0, n) * cfg.arrival_jitter_s
    d_noise = np.maximum(0.05, 1.0 + rng.normal(0.0, 1.0, n) * cfg.duration_jitter)
    if cfg.window_s is not None:
        lo, hi = (float(x) for x in cfg.window_s)
    else:
        lo = float(np.quantile(creation[known], cfg.start_quantile)) if known.any() else 0.0
        hi = math.inf
    # Pods created before the start (or with no creation time) are present at the start:
    # they arrive at 0 and run until their (shifted) deletion; those gone by then are dropped.
    before = ~known | (creation < lo)
    start = np.where(before, 0.0, creation - lo)
    leave = deletion - lo  # NaN stays NaN: never leaves
    dur = np.where(np.isnan(leave), np.inf, leave - start)
    keep = ~(known & (creation >= hi)) & ~(before & (leave <= 0))
    arrival = np.maximum(start / cfg.time_compression + a_noise, 0.0)
    dur = dur / cfg.time_compression * d_noise
    rows = np.flatnonzero(keep)
    rows = rows[np.argsort(arrival[rows], kind="stable")]
    if cfg.max_pods is not None:
        rows = rows[: cfg.max_pods]
    arrival, dur = arrival[rows], dur[rows]
    last = float(arrival[-1]) if len(rows) else 0.0
    end = float(cfg.horizon_s) if cfg.horizon_s is not None else last
    size, cap = _measure(pods, nodes)
    size = size[rows]
    scale = float(cfg.duration_scale)
    span = end if end < math.inf else last  # the load is measured over [0, span]
    finite_end = span > 0 and cap > 0
    if cfg.target_load is not None:
        if not finite_end:
            raise ValueError("target_load needs arrivals spread over time or a positive finite horizon_s")
        lo_s, hi_s = 1e-9, 1e12
        if _offered(size, arrival, dur * hi_s, span, cap) <= cfg.target_load:
            scale = hi_s
        else:
            for _ in range(200):  # bisection in log space
                mid = math.sqrt(lo_s * hi_s)
                if _offered(size, arrival, dur * mid, span, cap) < cfg.target_load:
                    lo_s = mid
                else:
                    hi_s = mid
                if hi_s / lo_s < 1 + 1e-9:
                    break
            scale = hi_s
    dur = dur * scale
    offered = _offered(size, arrival, dur, span, cap) if finite_end else float("nan")
    return ReplayWorkload(pod=rows.astype(np.int64), arrival=arrival, duration=dur,
                          duration_scale=scale, end=end, offered_load=offered)


@dataclass
class NodeStats:
    """Per-node side information for observations (index = node id)."""

    status: np.ndarray  # int8 NODE_UP / NODE_FAILED / NODE_REMOVED / NODE_BOOTING
    n_pods: np.ndarray  # int64 pods bound (starting or running)
    cpu_trend: np.ndarray  # float64 EMA of d(cpu_used)/dt, milli-CPU per second
    mem_trend: np.ndarray  # float64 EMA of d(mem_used)/dt, MiB per second
    overloaded: np.ndarray  # bool, real CPU above the threshold at the last tick
    overload_count: np.ndarray  # int64 transitions into overload
    oom_count: np.ndarray  # int64 OOM kills on the node
    failure_count: np.ndarray  # int64 failures of the node
    empty_since: np.ndarray  # float64 time the node last became empty (autoscaler)


@dataclass
class ReplayResult:
    """The run's metrics (every name in METRICS), counters and per-tick series."""

    metrics: dict[str, float]
    counters: dict[str, float]
    series: dict[str, np.ndarray]  # per usage tick: t, util_mean, util_var, pending, running, alive
    workload: ReplayWorkload
    end_time: float
    wall_s: float
    latencies: np.ndarray = field(default_factory=lambda: np.zeros(0))  # arrival-to-bind per bind


class ReplaySimulator:
    """The replay event loop, driven one scheduling decision at a time.

    ``while (d := sim.next_pod()) is not None: sim.bind(decide(*d))`` then
    ``sim.finish()``. ``sim.rng`` is the generator for the scheduler's tie-breaks.
    """

    def __init__(self, nodes: NodeTable, pods: PodTable, *, config: ReplayConfig | None = None,
                 seed: int = 0, typical: TypicalPods | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        cfg = self.config = config or ReplayConfig()
        cfg.validate()
        self.nodes, self.pods, self.typical, self.progress = nodes, pods, typical, progress
        g_work, g_usage, g_start, g_fail, g_sched = (
            np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5))
        self.rng = g_sched
        self._g_usage, self._g_start, self._g_fail = g_usage, g_start, g_fail
        self.workload = wl = replay_workload(pods, nodes, cfg, g_work)
        self.end = wl.end
        self.state = ClusterState(nodes)
        n_nodes, n_pods = len(nodes), len(pods)
        self._cap_cpu = nodes.cpu.astype(np.float64)
        self._cap_mem = nodes.mem.astype(np.float64)
        self._cpu_demand = np.zeros(n_nodes)
        self.node_stats = NodeStats(
            status=np.zeros(n_nodes, dtype=np.int8), n_pods=np.zeros(n_nodes, dtype=np.int64),
            cpu_trend=np.zeros(n_nodes), mem_trend=np.zeros(n_nodes),
            overloaded=np.zeros(n_nodes, dtype=bool), overload_count=np.zeros(n_nodes, dtype=np.int64),
            oom_count=np.zeros(n_nodes, dtype=np.int64), failure_count=np.zeros(n_nodes, dtype=np.int64),
            empty_since=np.zeros(n_nodes))
        # What a scorer may see beyond requests, shared with the feature builder through the
        # state (the arrays are node_stats' own, updated in place).
        ns = self.node_stats
        self._telemetry = Telemetry(ns.cpu_trend, ns.mem_trend, ns.overloaded, ns.overload_count,
                                    ns.oom_count)
        self.state.telemetry = self._telemetry
        self._node_pods: list[set[int]] = [set() for _ in range(n_nodes)]
        self._prev_cpu = np.zeros(n_nodes)
        self._prev_mem = np.zeros(n_nodes)

        # Per-pod bookkeeping (index = PodTable row). Hot scalars in lists, vector data in arrays.
        self.status = [NOT_ARRIVED] * n_pods
        self._gen = [0] * n_pods
        self._node = [-1] * n_pods
        self._gpus: list[tuple[int, ...]] = [()] * n_pods
        self._enq = [0.0] * n_pods
        self._attempts = [0] * n_pods
        self._oom_kills = [0] * n_pods
        self._fail_epoch = [-1] * n_pods
        self._start_t = [math.nan] * n_pods
        self._remaining = [math.inf] * n_pods
        for k, p in enumerate(wl.pod.tolist()):
            self._remaining[p] = float(wl.duration[k])
        self._pod_cache: list[Pod | None] = [None] * n_pods
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
        self._innov = g_usage.standard_normal((2, m)) * (math.sqrt(1.0 - self._rho ** 2) * np.array(
            [[cfg.usage_noise_cpu], [cfg.usage_noise_mem]]))
        self._sf = np.zeros((_NROWS, n_pods))
        self._s_node = np.zeros(n_pods, dtype=np.int64)
        self._s_pod = np.zeros(n_pods, dtype=np.int64)
        self._slot = [-1] * n_pods  # slot of a running pod, -1 when not running
        self._n_active = 0
        self._inv_cap100 = 100.0 / self._cap_cpu

        # Event machinery.
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._arr_t = wl.arrival.tolist()
        self._arr_p = wl.pod.tolist()
        self._ai = 0
        self._pending: dict[int, None] = {}  # insertion-ordered: oldest first
        self._epoch = 0  # bumped when capacity may have grown (release, node up)
        self._current = -1
        self._done = False
        self.now = 0.0
        self.feasible_mask: np.ndarray | None = None  # set by next_pod(skip_infeasible=True)
        self._latencies: list[float] = []
        self._startup_buf: list[float] = []
        self.n_arrived = self.n_running = self.n_completed = self.n_failed = 0
        self._bound_finite = 0
        self.counters = dict.fromkeys(
            ("events", "stale_events", "decisions", "attempts_skipped", "binds", "evictions",
             "oom_events", "overload_events", "node_failures", "node_repairs", "scale_ups",
             "scale_downs", "usage_ticks"), 0)
        self._util_mean: list[float] = []
        self._util_var: list[float] = []
        self._series: dict[str, list[float]] = {k: [] for k in
                                                ("t", "util_mean", "util_var", "pending", "running",
                                                 "alive")}
        self._above_since: float | None = None
        self._wall0 = time.perf_counter()

        if cfg.autoscale and cfg.spare_fraction > 0:
            k = min(round(cfg.spare_fraction * n_nodes), max(n_nodes - max(cfg.min_nodes, 0), 0))
            spare = g_fail.choice(n_nodes, size=k, replace=False)
            self.state.alive[spare] = False
            self.node_stats.status[spare] = NODE_REMOVED
        self._push(cfg.usage_tick_s, EV_TICK, 0, 0)
        self._fail_rate = cfg.failure_rate_per_node_hour * n_nodes / 3600.0
        if self._fail_rate > 0:
            self._push(self._g_fail.exponential(1.0 / self._fail_rate), EV_FAIL, 0, 0)

    # ---- public stepping API -------------------------------------------------------
    def next_pod(self, skip_infeasible: bool = False) -> tuple[Pod, ClusterState] | None:
        """Advance to the next pod needing a decision; ``None`` when the run is over.

        With ``skip_infeasible`` a pod that fits no node is sent to backoff without being
        returned, and ``self.feasible_mask`` holds the feasible nodes of the returned pod
        (for an action mask).
        """
        if self._current >= 0:
            raise RuntimeError("next_pod() called before bind() for the previous pod")
        if self._done:
            return None
        heap = self._heap
        arr_t = self._arr_t
        n_arr = len(arr_t)
        end = self.end
        status, gen = self.status, self._gen
        counters = self.counters
        pop = heapq.heappop
        while True:
            ta = arr_t[self._ai] if self._ai < n_arr else math.inf
            if heap and heap[0][0] <= ta:
                t = heap[0][0]
                if t > end or (end == math.inf and ta == math.inf and self._idle()):
                    break
                t, _, kind, p, g = pop(heap)
                self.now = t
                if kind == EV_ATTEMPT:
                    if g != gen[p] or status[p] != PENDING:
                        counters["stale_events"] += 1
                        continue
                elif kind in (EV_START, EV_DEPART):
                    if g != gen[p]:
                        counters["stale_events"] += 1
                        continue
                    counters["events"] += 1
                    if kind == EV_START:
                        self._start(p)
                    else:
                        self._depart(p)
                    continue
                else:
                    counters["events"] += 1
                    if kind == EV_TICK:
                        self._tick()
                    elif kind == EV_FAIL:
                        self._fail_event()
                    elif kind in (EV_REPAIR, EV_BOOT):
                        self._node_up(p, kind)
                    continue
            else:
                if ta > end or ta == math.inf:
                    break
                p = self._arr_p[self._ai]
                self._ai += 1
                self.now = ta
                status[p] = PENDING
                self._enq[p] = ta
                self._pending[p] = None
                self.n_arrived += 1
                if self.progress is not None and self.n_arrived % 500 == 0:
                    self.progress(self.n_arrived, n_arr)
            # A scheduling attempt for pending pod p.
            counters["events"] += 1
            if self._fail_epoch[p] == self._epoch:
                counters["attempts_skipped"] += 1
                self._failed_attempt(p)
                continue
            pod = self._pod_cache[p]
            if pod is None:
                pod = self._pod_cache[p] = Pod.from_table(self.pods, p)
            if skip_infeasible:
                mask = self.state.feasible(pod)
                if not mask.any():
                    self._failed_attempt(p)
                    continue
                self.feasible_mask = mask
            self._current = p
            counters["decisions"] += 1
            self._telemetry.queue_len = len(self._pending)
            return pod, self.state
        self._done = True
        if end < math.inf:
            self.now = end
        if self.progress is not None:
            self.progress(self.n_arrived, n_arr)
        return None

    def bind(self, placement: Placement) -> None:
        """Apply the decision for the pod last returned by :meth:`next_pod`.

        ``placement.node == -1`` means the pod fits nowhere: it goes to backoff (and is
        not offered to the scheduler again until some capacity is released).
        """
        p = self._current
        if p < 0:
            raise RuntimeError("bind() without a pod from next_pod()")
        self._current = -1
        self.feasible_mask = None
        node = placement.node
        if node < 0:
            self._failed_attempt(p)
            return
        if not self.state.alive[node]:
            raise ValueError(f"pod {p} bound to node {node}, which is not alive")
        pod = self._pod_cache[p]
        self.state.allocate(node, pod, placement.gpus)  # raises on over-allocation
        now = self.now
        self.status[p] = RUNNING
        del self._pending[p]
        self.n_running += 1
        self._node[p] = node
        self._gpus[p] = tuple(placement.gpus)
        self._node_pods[node].add(p)
        self.node_stats.n_pods[node] += 1
        self._latencies.append(now - self._enq[p])
        self.counters["binds"] += 1
        if self._remaining[p] < math.inf:
            self._bound_finite += 1
        self._push(now + self._startup_delay(), EV_START, p, self._gen[p])

    @property
    def latencies(self) -> list[float]:
        """Pending latency (queue entry to bind, sim seconds) of every bind so far, in order."""
        return self._latencies

    def counts(self) -> dict[str, int]:
        """Arrived pods by status (the conservation invariant: the four sum to arrived)."""
        return {"arrived": self.n_arrived, "pending": len(self._pending), "running": self.n_running,
                "completed": self.n_completed, "failed": self.n_failed}

    def check_invariants(self) -> None:
        """Full O(pods + nodes) consistency check (for tests); raises AssertionError."""
        c = self.counts()
        st = np.asarray(self.status)
        assert c["pending"] + c["running"] + c["completed"] + c["failed"] == c["arrived"], c
        assert int((st != NOT_ARRIVED).sum()) == c["arrived"], c
        for code, key in ((PENDING, "pending"), (RUNNING, "running"), (COMPLETED, "completed"),
                          (FAILED, "failed")):
            assert int((st == code).sum()) == c[key], (key, c)
        s = self.state
        assert (s.cpu_req <= s.nodes.cpu).all() and (s.mem_req <= s.nodes.mem).all()
        assert (s.gpu_free >= 0).all() and (s.cpu_req >= 0).all() and (s.mem_req >= 0).all()
        bound = sum(len(x) for x in self._node_pods)
        assert bound == c["running"], (bound, c)
        for n in np.flatnonzero(~s.alive).tolist():
            assert not self._node_pods[n], f"node {n} is not alive but holds pods"
        for n, ps in enumerate(self._node_pods):
            assert all(self.status[p] == RUNNING and self._node[p] == n for p in ps)
            assert len(ps) == self.node_stats.n_pods[n]

    # ---- event handlers ------------------------------------------------------------
    def _push(self, t: float, kind: int, p: int, g: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, p, g))

    def _idle(self) -> bool:
        return not self._pending and self._bound_finite == 0 and self._current < 0

    def _startup_delay(self) -> float:
        """Next start-up latency, drawn in batches (a scalar numpy draw costs microseconds)."""
        if not self._startup_buf:
            mean = self.config.startup_mean_s
            batch = self._g_start.exponential(mean, 1024) if mean > 0 else np.zeros(1024)
            self._startup_buf = batch.tolist()[::-1]
        return self._startup_buf.pop()

    def _failed_attempt(self, p: int) -> None:
        cfg = self.config
        self._attempts[p] += 1
        self._fail_epoch[p] = self._epoch
        deadline = self._enq[p] + cfg.max_wait_s
        now = self.now
        if now >= deadline:
            self.status[p] = FAILED
            del self._pending[p]
            self.n_failed += 1
            return
        delay = min(cfg.backoff_initial_s * 2.0 ** (self._attempts[p] - 1), cfg.backoff_max_s)
        self._push(min(now + delay, deadline), EV_ATTEMPT, p, self._gen[p])

    def _start(self, p: int) -> None:
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
        self._start_t[p] = self.now
        rem = self._remaining[p]
        if rem < math.inf:
            self._push(self.now + rem, EV_DEPART, p, self._gen[p])

    def _stop_usage(self, p: int) -> None:
        k = self._slot[p]
        if k < 0:
            return
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
        self._remaining[p] = max(self._remaining[p] - (self.now - self._start_t[p]), 0.0)

    def _release(self, p: int) -> None:
        """Free a bound pod's resources (completion, eviction, OOM kill)."""
        n = self._node[p]
        finite = self._remaining[p] < math.inf
        self._stop_usage(p)
        self.state.release(n, self._pod_cache[p], self._gpus[p])
        self._node_pods[n].discard(p)
        ns = self.node_stats
        ns.n_pods[n] -= 1
        if ns.n_pods[n] == 0:
            ns.empty_since[n] = self.now
        self._node[p] = -1
        self._gpus[p] = ()
        self._gen[p] += 1
        self._epoch += 1
        self.n_running -= 1
        if finite:
            self._bound_finite -= 1

    def _depart(self, p: int) -> None:
        self._release(p)
        self.status[p] = COMPLETED
        self.n_completed += 1

    def _requeue(self, p: int, delay: float = 0.0) -> None:
        """Release a bound pod and put it back in the queue; first attempt after ``delay``."""
        self._release(p)
        self.status[p] = PENDING
        self._pending[p] = None
        self._enq[p] = self.now
        self._attempts[p] = 0
        self._fail_epoch[p] = -1
        self._push(self.now + delay, EV_ATTEMPT, p, self._gen[p])

    def _tick(self) -> None:
        cfg, s, ns = self.config, self.state, self.node_stats
        now = self.now
        self.counters["usage_ticks"] += 1
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
        if cfg.autoscale:
            self._autoscale()
        self._sample()
        self._push(now + cfg.usage_tick_s, EV_TICK, 0, 0)

    def _sample(self) -> None:
        """Record the per-tick series; utilisation as in :func:`utilisation` (alive nodes)."""
        s = self.state
        n_alive = int(np.count_nonzero(s.alive))
        mean = var = math.nan
        if n_alive:
            u = s.cpu_used * self._inv_cap100 if n_alive == len(s.alive) else utilisation(s)
            mean = float(u.sum()) / n_alive
            var = max(float(np.dot(u, u)) / n_alive - mean * mean, 0.0)
            self._util_mean.append(mean)
            self._util_var.append(var)
        ser = self._series
        ser["t"].append(self.now)
        ser["util_mean"].append(mean)
        ser["util_var"].append(var)
        ser["pending"].append(len(self._pending))
        ser["running"].append(self.n_running)
        ser["alive"].append(n_alive)

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

    # ---- results -------------------------------------------------------------------
    def finish(self) -> ReplayResult:
        """Metrics of the run so far (call after :meth:`next_pod` returned ``None``)."""
        if not self._util_mean:
            self._sample()
        state = self.state
        frag = FragTracker(state, self.typical)
        m = snapshot_metrics(state, frag)
        m["gpu_alloc_at_100"] = m["gpu_alloc_at_target"] = m["gpu_frag_rate_at_90"] = float("nan")
        lat = np.asarray(self._latencies)
        mean, p99 = latency_stats(lat)
        c = self.counts()
        m.update(failed_pods=float(c["failed"]), pending_pods=float(c["pending"]),
                 pending_mean_s=mean, pending_p99_s=p99,
                 util_mean=float(np.mean(self._util_mean)) if self._util_mean else math.nan,
                 util_variance=float(np.mean(self._util_var)) if self._util_var else math.nan,
                 overload_events=float(self.counters["overload_events"]),
                 oom_events=float(self.counters["oom_events"]))
        metrics = {k: float(m[k]) for k in METRICS}
        wall = time.perf_counter() - self._wall0
        counters = {k: float(v) for k, v in self.counters.items()}
        counters.update({k: float(v) for k, v in c.items()})
        counters["wall_s"] = wall
        counters["events_per_s"] = counters["events"] / wall if wall > 0 else float("nan")
        counters["sim_time_s"] = self.now
        series = {k: np.asarray(v, dtype=np.float64) for k, v in self._series.items()}
        return ReplayResult(metrics=metrics, counters=counters, series=series, workload=self.workload,
                            end_time=self.now, wall_s=wall, latencies=lat)


def run_replay(nodes: NodeTable, pods: PodTable, scheduler: Scheduler, *, config: ReplayConfig | None = None,
               seed: int, typical: TypicalPods | None = None,
               progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """One replay run of ``scheduler`` on ``nodes`` with the trace ``pods``."""
    sim = ReplaySimulator(nodes, pods, config=config, seed=seed, typical=typical, progress=progress)
    rng = sim.rng
    while (d := sim.next_pod()) is not None:
        pod, state = d
        sim.bind(place(scheduler, state, pod, rng))
    return sim.finish()
