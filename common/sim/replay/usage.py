"""Replay mode's usage model: real CPU and memory use of running pods, overload and OOM.

**Usage model.** Real use of a running pod ``p`` of application ``a`` and QoS class ``c``,
per resource ``r`` (CPU, memory), at sim time ``t``::

    use_r(t) = min(limit_r, max(0, base_r * (1 + amp_r[c] * cos(2 pi (t*tc/3600 - peak[c]) / P) + eps_r(t))))
    base_r   = max(request_r, kube non-zero default) * median_r[c] * exp(A_r[a] + B_r[p])
    A_r[a] ~ N(0, sigma_r^2 - pod_sigma^2)  (shared by the pods of one application)
    B_r[p] ~ N(0, pod_sigma^2)              (the pod's own spread around its application)

``tc`` is ``time_compression`` and ``P`` = ``usage_period_s / 3600`` (24 trace hours), so
the daily cycle follows trace time; hour 0 is the start of the run. The cycle has *one
phase per QoS class* for the whole cluster (``usage_peak_hour``; online classes peak in
the afternoon, best-effort batch at night) and a class-specific amplitude, so the pods of
a class peak together, as whole production clusters do (Jiang et al., "Characterizing
Co-located Workloads in Alibaba Cloud Datacenters", IEEE TCC 2020: "the resource usages of
containers have similar cyclical fluctuation consistent with the whole cluster, while their
memory usages remain approximately constant", hence the small memory amplitude). The
application level ``A`` makes a new pod of a known application predictable from its
siblings' history: the share of the log-variance of a pod's level explained by its
application is ``1 - pod_sigma^2 / sigma^2`` (92% for CPU, 88% for memory by default).
A pod without an application (``PodTable.app == -1``) is an application of its own. A pod
whose use was measured (``PodTable.cpu_use`` / ``mem_use``: a recording of a real cluster, its
own mean or its application's use per request) has that measured mean as ``base_r`` instead. CPU
and memory levels are correlated (``usage_cpu_mem_corr``, in both parts). ``eps_r`` is a
stationary AR(1) process stepped at each tick, ``eps <- rho eps + sqrt(1 - rho^2) sigma z``
with ``rho = exp(-usage_tick_s / usage_noise_tau_s)`` (``tau`` = 60 s: flicker on the scale
of a minute, lag-one autocorrelation 0.85 at 10 s ticks) and ``sigma`` =
``usage_noise_cpu`` / ``usage_noise_mem``, started from its stationary law and kept
across an eviction. The normals ``z`` of a tick are a contiguous block at a random offset
of a table drawn once per run (fresh normals for every running pod at every tick would
dominate the run time).

**Limits.** ``limit_r`` is the pod's limit from the trace (``PodTable.cpu_limit`` /
``mem_limit``) or, where unknown, ``usage_limit_ratio[c]`` x the non-zero request
(Guaranteed: 1, limit == request). A pod's memory limit is also at most its node's memory
(one pod alone never OOMs a node). A best-effort pod's CPU use is in addition capped at
the CPU its node's other pods leave idle (``usage_be_idle_cap``): BE pods on a node share
what is left in proportion to their demand, so they cannot take what others use and never
throttle them. Per node, ``state.cpu_used`` is the sum of its pods' CPU use clipped at
capacity (CPU is compressible: excess demand is throttled) and ``state.mem_used`` the
unclipped sum (memory is not). Both are kept current at every event; use is re-evaluated
for every running pod at each usage tick (vectorised over packed arrays of the running
pods) and is constant in between; a starting pod's use is evaluated when it starts (a
starting BE pod gets at most the CPU idle on its node then).

**Calibration** (defaults; every figure below is from the source named). Published
production statistics on use relative to requests:

- Datadog, container report 2020, as quoted in "Practical tips for rightsizing your
  Kubernetes workloads" (Datadog blog, 21 March 2023,
  https://www.datadoghq.com/blog/rightsize-kubernetes-workloads/): "49 percent of
  containers are using less than 30 percent of their requested CPU" and "45 percent of
  containers using less than 30 percent of their requested memory".
- Datadog, container report 2023 (https://www.datadoghq.com/container-report/, Fact 5;
  its methodology: "computing the hourly average of CPU or memory used by each container
  and dividing it by the hourly average of its resource request"), as summarised by a
  Datadog researcher: "over 65% of Kubernetes workloads were using less than 50% of their
  requested CPU and memory".
- Rzadca et al., "Autopilot: workload autoscaling at Google", EuroSys 2020 (abstract):
  slack is "the difference between the limit and the actual resource usage", and
  "Autopiloted jobs have a slack of just 23%, compared with 46% for manually-managed jobs".
  Borg schedules on the limit, the quantity a Kubernetes scheduler reads as the request;
  read so (our reading, not the paper's), hand-set reservations are used to about 0.54.

A lognormal through the two Datadog quantiles gives the per-pod level's median and sigma:
CPU ``P(r < 0.3) = 0.49``, ``P(r < 0.5) = 0.65`` -> median 0.31, sigma 1.25; memory
``P(r < 0.3) = 0.45``, ``P(r < 0.5) = 0.65`` -> median 0.34, sigma 1.0. With the default
limit of 2x the request (BE, Burstable, LS) the request-weighted mean CPU use / request
is then ``E[min(r, 2)]`` = 0.54, Autopilot's 1 - 46%. The classes share the fitted distribution
and differ by their limits (the figures are over all containers with requests; none is
published per class):

    ========== ============== =========== ========== ========== ==========
    QoS        median cpu/mem sigma c/m   limit/req  CPU target mem target
    ========== ============== =========== ========== ========== ==========
    BE         0.31 / 0.34    1.25 / 1.0  2 + idle   0.54       0.51
    Burstable  0.31 / 0.34    1.25 / 1.0  2          0.54       0.51
    LS         0.31 / 0.34    1.25 / 1.0  2          0.54       0.51
    Guaranteed 0.31 / 0.34    1.25 / 1.0  1          0.43       0.44
    ========== ============== =========== ========== ========== ==========

(targets: request-weighted mean use / request, ``E[min(r, limit)]`` of the lognormal,
:func:`usage_targets`; the BE figure is before the idle-capacity cap, which only lowers it
on busy nodes). Measured from a replay run (``tests/common/sim/test_replay_usage.py``:
8,000 pods with mixed requests, 2,000 per class, on an uncontended node over a simulated
day, with the daily cycle and the noise; seed 1): CPU use / request 0.52 BE, 0.53
Burstable, 0.53 LS, 0.41 Guaranteed; memory 0.50, 0.50, 0.51, 0.41 (1-6% below the
targets; the limit also clips the cycle's and the noise's peaks, which pulls Guaranteed
lowest; seeds 2 and 3 give the same within 0.03); Burstable's 0.53 against Autopilot's
0.54; the share of pods whose mean use is below 30% / 50% of their CPU request 0.50 / 0.66
(Datadog: 0.49 / "over 0.65"), of their memory request 0.46 / 0.66 (Datadog: 0.45 /
"over 0.65"); all pods together 0.50 of the CPU requested. The model before this
calibration ran request-weighted use at 0.97x of requests and best-effort pods at 1.6x.

Parameters (all :class:`ReplayConfig` fields, tuples by QoS BE, Burstable, LS, Guaranteed):

    ====================== ====================== ============================================
    field                  default                meaning
    ====================== ====================== ============================================
    usage_cpu_median       0.31 (all classes)     median pod level of CPU use / request
    usage_cpu_sigma        1.25                   log-sd of the CPU level over pods
    usage_mem_median       0.34 (all classes)     median pod level of memory use / request
    usage_mem_sigma        1.0                    log-sd of the memory level over pods
    usage_pod_sigma        0.35                   log-sd of a pod around its application
    usage_cpu_mem_corr     0.5                    correlation of CPU and memory log levels
    usage_limit_ratio      (2, 2, 2, 1)           limit / request where the trace has none
    usage_be_idle_cap      True                   BE CPU capped at the node's idle CPU
    usage_amp_cpu          (0.2, 0.3, 0.4, 0.3)   daily CPU amplitude per class
    usage_amp_mem          0.05 (all classes)     daily memory amplitude per class
    usage_peak_hour        (2, 14, 14, 14)        hour of the class's daily peak (trace time)
    usage_period_s         86400                  cycle period, trace seconds
    usage_noise_cpu        0.15                   stationary std of the CPU AR(1) noise
    usage_noise_mem        0.05                   stationary std of the memory AR(1) noise
    usage_noise_tau_s      60                     AR(1) correlation time, sim seconds
    usage_tick_s           10                     usage update interval, sim seconds
    ====================== ====================== ============================================

Randomness: the application and pod levels are drawn from the workload generator
(``g_work``: the same for every scheduler of one seed), the noise from the usage generator.

**Throttling per pod.** A node whose CPU demand (``cpu_demand``: its pods' use after the
best-effort squeeze) exceeds its capacity gets only its capacity; the online metrics charge the
excess ``demand - capacity`` as throttled CPU (``LoadMetrics``' ``throttled_cpu_core_s``, per node
``node_throttled``). The model shares the excess among the node's running pods in proportion to
their demand (each gets ``capacity / demand`` of what it wants), so at each usage tick, after
the OOM kills (the state the metrics read), pod ``p`` on such a node is charged
``dt / 1000 * use_p * (demand - capacity) / demand`` core-seconds (``dt`` = ``usage_tick_s``),
summed over its life (over every run of it: an evicted or OOM-killed pod keeps its total).
Summed over pods this is the cluster's ``throttled_cpu_core_s`` up to float rounding
(``tests/common/sim/test_replay_usage.py``). A best-effort pod under the idle-capacity cap
(``usage_be_idle_cap``) is never charged: the squeeze leaves it no CPU on a node whose other
pods alone exceed its capacity, and what the squeeze takes from it is not throttling in the
metrics' sense either. Read with :meth:`UsageModel.pod_throttled_core_s`
(``ReplaySimulator.pod_throttled_core_s``); keeping it changes no other figure of a run.

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

The code is :class:`UsageModel`, an object the simulator
(:class:`~fedsched.common.sim.replay.simulator.ReplaySimulator`) builds once per run and
calls: the constructor draws every pod's usage parameters, :meth:`UsageModel.start` when a
pod starts running, :meth:`UsageModel.stop` when it is released, and
:meth:`UsageModel.step` at each usage tick (AR(1) noise, OOM kills, per-pod throttling,
overload transitions, trend). It writes real use into the cluster state (``state.cpu_used`` /
``mem_used``) and the overload, OOM and trend fields of :class:`~fedsched.common.sim.replay.config.NodeStats`;
an OOM kill is handed back to the simulator (``step``'s ``kill``), which releases and
requeues the pod. ``_pf[_BASE]`` / ``_pf[_BASE + 1]`` hold every pod's mean CPU / memory
level (``base_r`` above, before limits).

**Speed.** Handed the compiled loops (``kernels``: the simulator passes
:data:`~fedsched.common.sim.replay.usage_kernel.KERNELS`, numba), ``start``, ``stop`` and a
tick's per-pod and per-node loops run compiled: the same operations on the same operands in the
same order, so the same bits. The numpy forms below run without them (no numba, or
``kernels=None``) and are the reference ``tests/common/sim/test_replay_kernels.py`` compares
the compiled loops with.

May import: ``fedsched.common.model`` and ``config`` of this sub-package (never ``simulator``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from fedsched.common.model.cluster import DEFAULT_MEMORY_REQUEST_MIB, DEFAULT_MILLI_CPU_REQUEST

if TYPE_CHECKING:
    from types import SimpleNamespace

    from fedsched.common.model.cluster import ClusterState, NodeTable, PodTable
    from fedsched.common.sim.replay.config import NodeStats, ReplayConfig

BEST_EFFORT = 0  # QoS code whose CPU use is capped at its node's idle CPU
GUARANTEED = 3  # limit == request by default
N_QOS = 4

# Rows of the per-pod usage parameter arrays (CPU row, then memory row, for each pair).
_BASE, _AMP, _MAX, _EPS, _CUR = 0, 2, 4, 6, 8  # base use, base * amplitude, cap (limit), AR(1) state, current
_CLS, _BEF, _NROWS = 10, 11, 12  # QoS class (as float), 1.0 for a best-effort pod
INNOVATION_TABLE_MIN = 1 << 16  # pre-drawn normals per resource (at least 2x the pods)


def per_class(value: float | tuple[float, ...]) -> np.ndarray:
    """A per-QoS-class parameter (one value for all, or four) as a float array of four."""
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (N_QOS,)).copy()


def _mean_capped_lognormal(median: float, sigma: float, cap: float) -> float:
    """``E[min(X, cap)]`` for ``X`` lognormal with the given median and log-sd."""
    if median <= 0:
        return 0.0
    if sigma <= 0:
        return min(median, cap)
    mu = math.log(median)
    mean = math.exp(mu + 0.5 * sigma * sigma)
    if not math.isfinite(cap):
        return mean
    phi = lambda x: 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))  # noqa: E731
    lc = math.log(cap)
    return mean * phi((lc - mu - sigma * sigma) / sigma) + cap * (1.0 - phi((lc - mu) / sigma))


def usage_targets(config: ReplayConfig) -> dict[str, np.ndarray]:
    """The calibration targets of ``config``'s usage model by QoS class (module docstring).

    ``cpu`` / ``mem``: request-weighted mean use / request, ``E[min(r, limit)]`` of the
    lognormal pod level (no daily cycle, noise or idle-capacity cap: what an uncontended
    node shows on average); ``cpu_below`` / ``mem_below``: the share of pods whose mean
    use is below 30% and 50% of the request (rows) for each class (columns).
    """
    cfg = config
    lim = per_class(cfg.usage_limit_ratio)
    out: dict[str, np.ndarray] = {}
    for r, med, sig in (("cpu", per_class(cfg.usage_cpu_median), cfg.usage_cpu_sigma),
                        ("mem", per_class(cfg.usage_mem_median), cfg.usage_mem_sigma)):
        out[r] = np.array([_mean_capped_lognormal(float(m), sig, float(c))
                           for m, c in zip(med, lim, strict=True)])
        below = np.zeros((2, N_QOS))
        for i, x in enumerate((0.3, 0.5)):
            for c in range(N_QOS):
                m = float(med[c])
                if sig > 0 and m > 0:
                    below[i, c] = 0.5 * (1.0 + math.erf((math.log(x) - math.log(m)) / (sig * math.sqrt(2.0))))
                else:
                    below[i, c] = float(m < x)
        out[f"{r}_below"] = below
    return out


class UsageModel:
    """The usage model of one replay run (see the module docstring).

    Inputs, fixed at construction: the run's ``config``, ``nodes`` and ``pods``, the cluster
    ``state`` whose ``cpu_used`` / ``mem_used`` it keeps current, the ``node_stats`` whose
    overload, OOM and trend fields it writes, the workload generator ``g_work`` (every pod's
    levels, drawn here: the same for every scheduler of one seed) and the usage generator
    ``g_usage`` (the noise); ``kernels`` the compiled loops (module docstring, "Speed"), None
    for the numpy forms.

    Public state read by the simulator: the float capacities ``cap_cpu`` / ``cap_mem``, the
    per-node CPU demand ``cpu_demand`` (before throttling; replaced at each tick), the
    per-pod OOM kill counts ``oom_kills`` and throttled CPU core-seconds ``throttled_core_s``
    (module docstring, "Throttling per pod"; read through :meth:`pod_throttled_core_s`).
    Private: the previous use ``_prev_cpu`` /
    ``_prev_mem`` (trend), every pod's usage parameters ``_pf`` (rows ``_BASE`` mean level,
    ``_AMP`` daily amplitude x level, ``_MAX`` limit, ``_EPS`` AR(1) state, ``_CUR`` current
    use, CPU then memory; ``_CLS`` QoS class, ``_BEF`` 1 for a BE pod under the idle cap), the
    packed parameters of the running pods ``_sf`` (slot = column, with ``_s_pod`` /
    ``_s_node`` / ``_s_cls``, ``_slot`` per pod, ``_n_active`` slots used, ``_n_be`` of them
    capped BE pods), each pod's last start time ``_started``, the class cycles' ``_omega`` /
    ``_phase``, the AR(1) factor ``_rho`` and innovation table ``_innov``, and the per-pod QoS
    codes ``_qos``.
    """

    def __init__(self, config: ReplayConfig, nodes: NodeTable, pods: PodTable, state: ClusterState,
                 node_stats: NodeStats, g_work: np.random.Generator, g_usage: np.random.Generator,
                 kernels: SimpleNamespace | None = None) -> None:
        cfg = self.config = config
        self.state, self.node_stats, self._g_usage = state, node_stats, g_usage
        n_nodes, n_pods = len(nodes), len(pods)
        self.cap_cpu = nodes.cpu.astype(np.float64)
        self.cap_mem = nodes.mem.astype(np.float64)
        self.cpu_demand = np.zeros(n_nodes)
        self._prev_cpu = np.zeros(n_nodes)
        self._prev_mem = np.zeros(n_nodes)
        self.oom_kills = [0] * n_pods
        self.throttled_core_s = np.zeros(n_pods)  # per pod, over its life (pod_throttled_core_s)
        self._qos = pods.qos.tolist()
        self._started = [math.nan] * n_pods

        # Usage parameters for every pod (drawn up front: independent of the scheduler).
        qos = np.clip(pods.qos, 0, N_QOS - 1)
        cpu_nz = np.where(pods.cpu > 0, pods.cpu, DEFAULT_MILLI_CPU_REQUEST).astype(np.float64)
        mem_nz = np.where(pods.mem > 0, pods.mem, DEFAULT_MEMORY_REQUEST_MIB).astype(np.float64)
        # Log levels: an application part shared by its pods plus the pod's own part, for CPU
        # and memory with correlation usage_cpu_mem_corr. A pod with app -1 is its own app.
        app = np.asarray(pods.app, dtype=np.int64)
        known = app >= 0
        codes, dense = np.unique(np.where(known, app, -1), return_inverse=True)
        dense = dense.ravel() - int(len(codes) > 0 and codes[0] < 0)  # known codes as 0..n_apps-1
        n_apps = int((codes >= 0).sum())
        own = np.where(known, dense, n_apps + np.arange(n_pods))
        # Observed use per application (app_usage): dense code of each pod (-1: none), the
        # non-zero requests it is measured against, and the cache of the per-app sums.
        self._app_dense = np.where(known, dense, -1)
        self._app_code = {int(c): i for i, c in enumerate(codes[codes >= 0].tolist())}
        self._req_nz = np.stack([cpu_nz, mem_nz])
        self._n_apps = n_apps
        self._app_sums: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
        self._app_out = np.zeros(4)  # the compiled app_usage's answer (use and requests, CPU and memory)
        rho_cm = cfg.usage_cpu_mem_corr
        z_app = g_work.standard_normal((2, n_apps + n_pods))
        z_pod = g_work.standard_normal((2, n_pods))
        for z in (z_app, z_pod):
            z[1] = rho_cm * z[0] + math.sqrt(max(0.0, 1.0 - rho_cm * rho_cm)) * z[1]
        levels = []
        for r, sig in ((0, cfg.usage_cpu_sigma), (1, cfg.usage_mem_sigma)):
            s_pod = min(cfg.usage_pod_sigma, sig)
            s_app = math.sqrt(max(sig * sig - s_pod * s_pod, 0.0))
            levels.append(np.exp(s_app * z_app[r, own] + s_pod * z_pod[r]))
        lim = per_class(cfg.usage_limit_ratio)[qos]
        cpu_lim = np.where(pods.cpu_limit > 0, pods.cpu_limit, cpu_nz * lim).astype(np.float64)
        mem_lim = np.where(pods.mem_limit > 0, pods.mem_limit, mem_nz * lim).astype(np.float64)
        # _pf[row, pod]: usage parameters of every pod; _sf[row, slot]: the same for the pods
        # running now, packed in slots 0..n_active-1 so a usage tick is a few vector ops.
        pf = self._pf = np.zeros((_NROWS, n_pods))
        pf[_BASE] = cpu_nz * per_class(cfg.usage_cpu_median)[qos] * levels[0]
        pf[_BASE + 1] = mem_nz * per_class(cfg.usage_mem_median)[qos] * levels[1]
        # A recorded pod runs at its measured mean use (PodTable.cpu_use / mem_use) where known.
        for r, measured in ((0, pods.cpu_use), (1, pods.mem_use)):
            known_use = np.isfinite(measured)
            if known_use.any():
                pf[_BASE + r] = np.where(known_use, measured, pf[_BASE + r])
        pf[_AMP] = pf[_BASE] * per_class(cfg.usage_amp_cpu)[qos]
        pf[_AMP + 1] = pf[_BASE + 1] * per_class(cfg.usage_amp_mem)[qos]
        pf[_MAX] = cpu_lim
        pf[_MAX + 1] = mem_lim
        pf[_CLS] = qos
        pf[_BEF] = (qos == BEST_EFFORT) & cfg.usage_be_idle_cap
        pf[_EPS] = g_work.standard_normal(n_pods) * cfg.usage_noise_cpu  # stationary start
        pf[_EPS + 1] = g_work.standard_normal(n_pods) * cfg.usage_noise_mem
        # One daily cycle per QoS class: wave_c(t) = cos(omega t - phase_c), t in sim seconds.
        self._omega = 2 * np.pi * cfg.time_compression / cfg.usage_period_s
        self._phase = 2 * np.pi * per_class(cfg.usage_peak_hour) * 3600.0 / cfg.usage_period_s
        # For start(): Python scalars.
        self._phase_f, self._cap_mem_f = self._phase.tolist(), self.cap_mem.tolist()
        self._cls_l = qos.tolist()
        self._n_be = 0  # running best-effort pods with the idle-capacity cap
        # AR(1) innovations: a tick reads a contiguous block at a random offset of a
        # pre-drawn table (drawing fresh normals for every running pod per tick is slow).
        self._rho = math.exp(-cfg.usage_tick_s / cfg.usage_noise_tau_s)
        m = max(INNOVATION_TABLE_MIN, 2 * n_pods)
        self._innov = g_usage.standard_normal((2, m)) * (math.sqrt(1.0 - self._rho ** 2) * np.array(
            [[cfg.usage_noise_cpu], [cfg.usage_noise_mem]]))
        self._sf = np.zeros((_NROWS, n_pods))
        self._s_cls = np.zeros(n_pods, dtype=np.intp)  # QoS class of each slot (wave gather)
        self._s_node = np.zeros(n_pods, dtype=np.int64)
        self._s_pod = np.zeros(n_pods, dtype=np.int64)
        self._slot = [-1] * n_pods  # slot of a running pod, -1 when not running
        self._n_active = 0
        self._kernels = kernels  # the compiled loops (usage_kernel.KERNELS); None: the numpy forms

    # ---- what the model shows ----------------------------------------------------------
    def running_use(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(pod rows, CPU milli, memory MiB)`` of the running pods now: what per-pod container
        metrics would show (copies)."""
        k = self._n_active
        return self._s_pod[:k].copy(), self._sf[_CUR, :k].copy(), self._sf[_CUR + 1, :k].copy()

    def running_per_node(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the number of running pods and the CPU use of its largest one (0 if none)."""
        n = len(self.cap_cpu)
        k = self._n_active
        if self._kernels is not None:
            pods, max_pod = np.zeros(n, dtype=np.int64), np.zeros(n)
            self._kernels.per_node(self._s_node, self._sf[_CUR], k, pods, max_pod)
            return pods, max_pod
        nodes, cpu = self._s_node[:k], self._sf[_CUR, :k]
        pods = np.bincount(nodes, minlength=n)
        max_pod = np.zeros(n)
        np.maximum.at(max_pod, nodes, cpu)
        return pods, max_pod

    def app_usage(self, app: int) -> tuple[float, float] | None:
        """Observed (CPU, memory) use / non-zero request of application ``app``'s running pods
        (``Pod.app`` code), None when none runs: what per-pod container metrics would show a
        real cluster (``Telemetry.app_usage``)."""
        i = self._app_code.get(app)
        if i is None:
            return None
        if self._kernels is not None:  # one application's sums, the same bits as its bincount entry
            out = self._app_out
            self._kernels.app_usage(self._app_dense, self._s_pod, self._sf, self._req_nz, self._n_active, i,
                                    out)
            if out[2] <= 0:
                return None
            return float(out[0] / out[2]), float(out[1] / out[3])
        if self._app_sums is None:
            k = self._n_active
            d = self._app_dense[self._s_pod[:k]]
            keep = d >= 0
            d = d[keep]
            cur = self._sf[_CUR:_CUR + 2, :k][:, keep]
            req = self._req_nz[:, self._s_pod[:k][keep]]
            n = self._n_apps
            use = (np.bincount(d, weights=cur[0], minlength=n), np.bincount(d, weights=cur[1], minlength=n))
            tot = (np.bincount(d, weights=req[0], minlength=n), np.bincount(d, weights=req[1], minlength=n))
            self._app_sums = (use, tot)
        use, tot = self._app_sums
        if tot[0][i] <= 0:
            return None
        return float(use[0][i] / tot[0][i]), float(use[1][i] / tot[1][i])

    def expected_use(self, rows: np.ndarray | list[int] | int) -> tuple[np.ndarray, np.ndarray]:
        """The hidden mean use of PodTable ``rows``, ``(cpu_milli, mem_mib)``: each pod's level
        (``_pf[_BASE]``, ``_pf[_BASE + 1]``) capped at its limit (``_pf[_MAX]``, ``_pf[_MAX + 1]``);
        the contract is :meth:`ReplaySimulator.expected_use`'s. Copies."""
        idx = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        pf = self._pf
        cpu = np.minimum(pf[_BASE, idx], pf[_MAX, idx])
        mem = np.minimum(pf[_BASE + 1, idx], pf[_MAX + 1, idx])
        return cpu, mem

    def pod_throttled_core_s(self, rows: np.ndarray | list[int] | int) -> np.ndarray:
        """Throttled CPU of PodTable ``rows`` so far, in core-seconds: the CPU each pod wanted
        but did not get because its node's demand exceeded its capacity, summed over the usage
        ticks of its life (every run of it; module docstring, "Throttling per pod"). Over all
        pods it sums to the run's ``throttled_cpu_core_s`` up to float rounding. A copy
        (float64, one entry per row; a scalar row gives length 1)."""
        return self.throttled_core_s[np.atleast_1d(np.asarray(rows, dtype=np.int64))].copy()

    # ---- what the simulator calls --------------------------------------------------------
    def start(self, p: int, n: int, now: float) -> None:
        """Pod ``p`` (bound to node ``n``) starts running at ``now``: give it a slot, evaluate its use."""
        self._started[p] = now
        k = self._n_active
        self._n_active = k + 1
        self._slot[p] = k
        self._s_pod[k] = p
        self._s_node[k] = n
        if self._kernels is not None:
            c = self._cls_l[p]
            self._s_cls[k] = c
            s = self.state
            self._n_be += self._kernels.start(
                self._pf, self._sf, p, k, n, math.cos(self._omega * now - self._phase_f[c]), self.cap_cpu,
                self.cap_mem, self.cpu_demand, s.cpu_used, s.mem_used)
            return  # the compiled app_usage keeps no sums
        col = self._pf[:, p].tolist()
        col[_MAX + 1] = min(col[_MAX + 1], self._cap_mem_f[n])  # one pod alone never OOMs its node
        c = int(col[_CLS])
        self._s_cls[k] = c
        wave = math.cos(self._omega * now - self._phase_f[c])
        cu = min(max(0.0, col[_BASE] * (1.0 + col[_EPS]) + col[_AMP] * wave), col[_MAX])
        if col[_BEF]:  # best effort: at most what the node leaves idle now
            cu = min(cu, max(0.0, self.cap_cpu[n] - self.cpu_demand[n]))
            self._n_be += 1
        mu = min(max(0.0, col[_BASE + 1] * (1.0 + col[_EPS + 1]) + col[_AMP + 1] * wave), col[_MAX + 1])
        col[_CUR], col[_CUR + 1] = cu, mu
        self._sf[:, k] = col
        self.cpu_demand[n] += cu
        s = self.state
        s.cpu_used[n] = min(self.cpu_demand[n], self.cap_cpu[n])
        s.mem_used[n] += mu
        self._add_app_sums(p, k)

    def _add_app_sums(self, p: int, k: int) -> None:
        """Count the pod that just started in slot ``k`` (the last) in :meth:`app_usage`'s sums:
        the bincounts add their weights in slot order, so adding the new last slot's gives the
        same bits as counting again."""
        if self._app_sums is None:
            return
        d = self._app_dense[p]
        if d >= 0:
            use, tot = self._app_sums
            use[0][d] += self._sf[_CUR, k]
            use[1][d] += self._sf[_CUR + 1, k]
            tot[0][d] += self._req_nz[0, p]
            tot[1][d] += self._req_nz[1, p]

    def stop(self, p: int, n: int) -> bool:
        """Remove pod ``p``'s use from its node ``n``; ``False`` (nothing done) if it was not running."""
        k = self._slot[p]
        if k < 0:
            return False
        self._app_sums = None
        last = self._n_active - 1
        if self._kernels is not None:
            s = self.state
            r = self._kernels.stop(self._pf, self._sf, p, k, last, n, self._s_pod, self._s_node, self._s_cls,
                                   self.cpu_demand, self.cap_cpu, s.cpu_used, s.mem_used)
            if r < 0:
                self._n_be -= 1
            q = abs(r) - 1
            if q >= 0:
                self._slot[q] = k
            self._n_active = last
            self._slot[p] = -1
            return True
        sf = self._sf
        cu, mu = float(sf[_CUR, k]), float(sf[_CUR + 1, k])
        self._pf[_EPS:_EPS + 2, p] = sf[_EPS:_EPS + 2, k]  # keep the noise state for a restart
        if sf[_BEF, k]:
            self._n_be -= 1
        if k != last:  # move the last slot into the hole
            q = int(self._s_pod[last])
            sf[:, k] = sf[:, last]
            self._s_pod[k] = q
            self._s_node[k] = self._s_node[last]
            self._s_cls[k] = self._s_cls[last]
            self._slot[q] = k
        self._n_active = last
        self._slot[p] = -1
        d = self.cpu_demand[n] - cu
        self.cpu_demand[n] = d if d > 1e-9 else 0.0
        s = self.state
        s.cpu_used[n] = min(self.cpu_demand[n], self.cap_cpu[n])
        m = s.mem_used[n] - mu
        s.mem_used[n] = m if m > 1e-9 else 0.0
        return True

    def step(self, now: float, kill: Callable[[int, float], None]) -> tuple[int, int]:
        """A usage tick at ``now``: re-evaluate every running pod's use, OOM kills, overload, trend.

        An OOM-killed pod ``p`` is handed to ``kill(p, delay)``: the simulator releases it (which
        calls :meth:`stop`) and requeues it with its first attempt ``delay`` seconds later (the
        crash-loop back-off). Returns ``(OOM kills, transitions into overload)`` of this tick.
        """
        cfg, s, ns = self.config, self.state, self.node_stats
        k = self._n_active
        self._app_sums = None
        n_nodes = len(s.alive)
        kern = self._kernels
        over_mem = True  # some node may use more memory than it has (the numpy form looks)
        if kern is not None:
            demand = np.zeros(n_nodes)
            at = int(self._g_usage.integers(self._innov.shape[1] - k + 1)) if k else 0
            wave = np.cos(self._omega * now - self._phase)
            over_mem = kern.step(self._sf, k, self._rho, self._innov, at, wave, self._s_cls, self._s_node,
                                 self.cap_cpu, self.cap_mem, self._n_be, demand, s.cpu_used, s.mem_used) > 0
            self.cpu_demand = demand
        elif k:
            sf = self._sf
            eps = sf[_EPS:_EPS + 2, :k]
            eps *= self._rho
            at = int(self._g_usage.integers(self._innov.shape[1] - k + 1))
            eps += self._innov[:, at:at + k]
            use = eps + 1.0
            use *= sf[_BASE:_BASE + 2, :k]
            wave = np.cos(self._omega * now - self._phase)[self._s_cls[:k]]  # one cycle per class
            cur = sf[_CUR:_CUR + 2, :k]
            np.multiply(sf[_AMP:_AMP + 2, :k], wave, out=cur)
            cur += use
            np.maximum(cur, 0.0, out=cur)
            np.minimum(cur, sf[_MAX:_MAX + 2, :k], out=cur)
            nodes = self._s_node[:k]
            cpu = cur[0]
            demand = np.bincount(nodes, weights=cpu, minlength=n_nodes)
            # Best-effort pods share what the node's other pods leave idle, by demand. BE
            # use is squeezed exactly where the node's total demand exceeds its capacity.
            if self._n_be and (demand > self.cap_cpu).any():
                bef = sf[_BEF, :k]
                be = np.bincount(nodes, weights=cpu * bef, minlength=n_nodes)
                idle = self.cap_cpu - (demand - be)
                np.maximum(idle, 0.0, out=idle)
                squeeze = be > idle
                if squeeze.any():
                    f = np.ones(n_nodes)
                    f[squeeze] = idle[squeeze] / be[squeeze]
                    g = f[nodes]
                    g -= 1.0
                    g *= bef
                    g += 1.0
                    cpu *= g
                    demand -= be
                    demand += np.minimum(be, idle)
            self.cpu_demand = demand
            s.mem_used[:] = np.bincount(nodes, weights=cur[1], minlength=n_nodes)
        else:
            self.cpu_demand[:] = 0.0
            s.mem_used[:] = 0.0
        if kern is None:
            np.minimum(self.cpu_demand, self.cap_cpu, out=s.cpu_used)
        # OOM: kill the lowest-priority, most recently started running pod until memory fits.
        n_oom = 0
        for n in np.flatnonzero(s.mem_used > self.cap_mem).tolist() if over_mem else ():
            while s.mem_used[n] > self.cap_mem[n]:
                m = self._n_active
                cands = self._s_pod[:m][self._s_node[:m] == n].tolist()
                if not cands:
                    break
                victim = min(cands, key=lambda p: (self._qos[p], -self._started[p], -p))
                kills = self.oom_kills[victim] = self.oom_kills[victim] + 1
                kill(victim, min(cfg.oom_restart_s * 2.0 ** (kills - 1), cfg.oom_restart_max_s))
                ns.oom_count[n] += 1
                n_oom += 1
        # Throttled CPU per pod: each running pod's share of its node's demand above capacity,
        # on the state the online metrics read (after the OOM kills), for the tick's dt.
        a, dt = cfg.trend_alpha, cfg.usage_tick_s
        if kern is not None:
            kern.throttle(self._sf, self._n_active, self._s_pod, self._s_node, self.cpu_demand, self.cap_cpu,
                          dt / 1000.0, self.throttled_core_s)
        else:
            self._throttle(dt / 1000.0)
        # Overload transitions, trend (trend += alpha * (delta / dt - trend), in place: observers
        # may hold the arrays).
        if kern is not None:
            n_over = kern.overload_trend(s.cpu_used, s.mem_used, self.cap_cpu, cfg.overload_threshold,
                                         ns.overloaded, ns.overload_count, ns.cpu_trend, ns.mem_trend,
                                         self._prev_cpu, self._prev_mem, a / dt, 1 - a)
            return n_oom, n_over
        over = s.cpu_used > cfg.overload_threshold * self.cap_cpu
        new = over & ~ns.overloaded
        n_over = 0
        if new.any():
            ns.overload_count += new
            n_over = int(new.sum())
        ns.overloaded[:] = over
        for trend, used, prev in ((ns.cpu_trend, s.cpu_used, self._prev_cpu),
                                  (ns.mem_trend, s.mem_used, self._prev_mem)):
            np.subtract(used, prev, out=prev)
            prev *= a / dt
            trend *= 1 - a
            trend += prev
            prev[:] = used
        return n_oom, n_over

    def _throttle(self, gain: float) -> None:
        """The numpy form of a tick's per-pod throttling (``usage_kernel._throttle``): on each node
        whose demand exceeds its capacity, ``throttled_core_s[p] += use_p * (gain * excess / demand)``
        for its running pods ``p``."""
        over = self.cpu_demand - self.cap_cpu
        hot = over > 0.0
        if not hot.any():
            return
        k = self._n_active
        factor = np.zeros(len(over))
        factor[hot] = gain * over[hot] / self.cpu_demand[hot]
        g = factor[self._s_node[:k]]
        on = g != 0.0
        self.throttled_core_s[self._s_pod[:k][on]] += self._sf[_CUR, :k][on] * g[on]
