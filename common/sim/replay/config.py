"""Replay mode's knobs and code constants.

Every modelling choice and default (all defaults live in :class:`ReplayConfig`, one
commented field per knob, grouped as workload, pending queue, usage model, node failures
and autoscaler; :meth:`ReplayConfig.validate` rejects out-of-range values). The mechanisms
the knobs drive are described where they are implemented: ``workload`` (arrivals and
durations), ``usage`` (real use, overload and OOM), ``churn`` (node failures and the
autoscaler) and ``simulator`` (queue, start-up, metrics, stepping API). Also here: the code
constants shared by those modules, pod status (``sim.status``), node status
(``NodeStats.status``) and the kinds of queued events, and :class:`NodeStats`, the per-node
side information that the usage model, node churn and the event loop all write.

**Randomness.** One ``SeedSequence(seed)`` spawns independent generators for the
workload noise and per-pod usage parameters, the usage noise, start-up latencies, node
failures/spares and the scheduler's tie-break (``sim.rng``, passed to ``place``), so the
same seed gives the same run, and the workload is the same for every scheduler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Pod status codes (sim.status); every arrived pod is in exactly one of the last four.
NOT_ARRIVED, PENDING, RUNNING, COMPLETED, FAILED = 0, 1, 2, 3, 4
# Node status codes (NodeStats.status).
NODE_UP, NODE_FAILED, NODE_REMOVED, NODE_BOOTING = 0, 1, 2, 3
# Queued event kinds; trace arrivals are a separate pre-sorted stream merged with the heap.
EV_ATTEMPT, EV_START, EV_DEPART, EV_TICK, EV_FAIL, EV_REPAIR, EV_BOOT = range(7)


@dataclass
class NodeStats:
    """Per-node side information for observations (index = node id).

    The usage model writes the overload, OOM and trend fields, node churn the status, failure
    and ``empty_since`` fields, the event loop ``n_pods`` (and ``empty_since`` when a node empties).
    """

    status: np.ndarray  # int8 NODE_UP / NODE_FAILED / NODE_REMOVED / NODE_BOOTING
    n_pods: np.ndarray  # int64 pods bound (starting or running)
    cpu_trend: np.ndarray  # float64 EMA of d(cpu_used)/dt, milli-CPU per second
    mem_trend: np.ndarray  # float64 EMA of d(mem_used)/dt, MiB per second
    overloaded: np.ndarray  # bool, real CPU above the threshold at the last tick
    overload_count: np.ndarray  # int64 transitions into overload
    oom_count: np.ndarray  # int64 OOM kills on the node
    failure_count: np.ndarray  # int64 failures of the node
    empty_since: np.ndarray  # float64 time the node last became empty (autoscaler)

    @classmethod
    def zeros(cls, n_nodes: int) -> NodeStats:
        """Every node up, empty since time 0, no counts."""
        return cls(status=np.zeros(n_nodes, dtype=np.int8), n_pods=np.zeros(n_nodes, dtype=np.int64),
                   cpu_trend=np.zeros(n_nodes), mem_trend=np.zeros(n_nodes),
                   overloaded=np.zeros(n_nodes, dtype=bool),
                   overload_count=np.zeros(n_nodes, dtype=np.int64),
                   oom_count=np.zeros(n_nodes, dtype=np.int64),
                   failure_count=np.zeros(n_nodes, dtype=np.int64), empty_since=np.zeros(n_nodes))


@dataclass
class ReplayConfig:
    """Every knob of replay mode (times in simulated seconds unless noted)."""

    # --- workload ---
    time_compression: float = 1.0
    """sim time = trace time / factor (arrivals and durations)"""
    duration_scale: float = 1.0
    """extra multiplier on pod durations after compression"""
    target_load: float | None = None
    """solve duration_scale for this mean requested load (fraction)"""
    allow_unreachable_load: bool = False
    """with target_load: run at the highest reachable load instead of failing"""
    start_quantile: float = 0.0
    """start at the creation time of this quantile of pods (skip a sparse head)"""
    window_s: tuple[float, float] | None = None
    """trace-time [start, end) to replay (beats start_quantile)"""
    max_pods: int | None = None
    """keep only the first max_pods arrivals"""
    horizon_s: float | None = None
    """end of the run; None = last arrival, math.inf = until idle"""
    arrival_jitter_s: float = 1.0
    """std of Gaussian noise on each arrival time (clipped at 0)"""
    duration_jitter: float = 0.05
    """relative std of Gaussian noise on each duration"""
    startup_mean_s: float = 2.0
    """mean of the exponential bind-to-running latency"""
    # --- pending queue ---
    backoff_initial_s: float = 1.0
    """first retry delay after a failed attempt"""
    backoff_max_s: float = 10.0
    """retry delay cap (doubles per failed attempt up to this)"""
    max_wait_s: float = 600.0
    """a pod not bound this long after (re-)queueing fails"""
    oom_restart_s: float = 10.0
    """an OOM-killed pod is retried after this (crash-loop backoff) ..."""
    oom_restart_max_s: float = 300.0
    """... doubling per kill of the same pod up to this"""
    # --- usage model (see usage.py for the model, its calibration and the cited figures) ---
    usage_tick_s: float = 10.0
    """interval of usage updates, overload/OOM checks and autoscaler"""
    usage_cpu_median: tuple[float, float, float, float] = (0.31, 0.31, 0.31, 0.31)
    """median over pods of mean CPU use / request by QoS (BE, Burstable, LS, Guaranteed); Datadog fit"""
    usage_cpu_sigma: float = 1.25
    """log-sd over pods of mean CPU use / request (application and pod parts together); Datadog fit"""
    usage_mem_median: tuple[float, float, float, float] = (0.34, 0.34, 0.34, 0.34)
    """median over pods of mean memory use / request by QoS, before limits; Datadog fit"""
    usage_mem_sigma: float = 1.0
    """log-sd over pods of mean memory use / request (application and pod parts together); Datadog fit"""
    usage_pod_sigma: float = 0.35
    """log-sd of a pod's usage level around its application's (the rest of the sigma is the application's)"""
    usage_cpu_mem_corr: float = 0.5
    """correlation of the CPU and memory log usage levels (application and pod parts alike)"""
    usage_limit_ratio: tuple[float, float, float, float] = (2.0, 2.0, 2.0, 1.0)
    """limit / request by QoS (BE, Burstable, LS, Guaranteed) where the trace gives no limit"""
    usage_be_idle_cap: bool = True
    """best-effort CPU use is also capped at its node's CPU left idle by the other pods"""
    usage_amp_cpu: tuple[float, float, float, float] = (0.20, 0.30, 0.40, 0.30)
    """relative amplitude of the daily CPU cycle by QoS (one cluster-wide cycle per class)"""
    usage_amp_mem: tuple[float, float, float, float] = (0.05, 0.05, 0.05, 0.05)
    """relative amplitude of the daily memory cycle by QoS (same phase as the CPU cycle)"""
    usage_peak_hour: tuple[float, float, float, float] = (2.0, 14.0, 14.0, 14.0)
    """hour of the daily peak by QoS, trace hours from the start of the run (BE peaks at night)"""
    usage_period_s: float = 86400.0
    """period of the daily cycle in trace seconds (sim period = this / time_compression)"""
    usage_noise_cpu: float = 0.15
    """stationary std of the CPU AR(1) noise (relative)"""
    usage_noise_mem: float = 0.05
    """stationary std of the memory AR(1) noise (relative)"""
    usage_noise_tau_s: float = 60.0
    """correlation time of the AR(1) noise (sim seconds; minutes-scale flicker)"""
    overload_threshold: float = 0.85
    """real CPU use / capacity above which a node is overloaded"""
    trend_alpha: float = 0.3
    """EMA weight of the per-node usage trend"""
    # --- online metrics and windowed telemetry ---
    hot_window_s: float = 300.0
    """window of the hot-node metrics (the 5-minute mean load-aware schedulers judge)"""
    stats_window_s: float = 900.0
    """window of the per-node mean/std telemetry (Trimaran's 15 minutes)"""
    sla_s: float = 60.0
    """a pod waiting longer than this for a node misses the pending SLA"""
    # --- node failures ---
    failure_rate_per_node_hour: float = 1e-4
    """Poisson failure rate of each up node"""
    repair_mean_s: float = 1800.0
    """mean of the exponential repair time"""
    # --- autoscaler ---
    autoscale: bool = False
    """enable the scale-up/scale-down loop"""
    spare_fraction: float = 0.0
    """share of nodes removed at the start (spare pool), with autoscale"""
    scale_up_pending: int = 1
    """pending-queue length that triggers a scale-up ..."""
    scale_up_after_s: float = 30.0
    """... once it has held this long"""
    node_boot_s: float = 60.0
    """delay between scale-up decision and the node being alive"""
    scale_down_idle_s: float = 600.0
    """an up node empty this long is removed"""
    min_nodes: int = 1
    """scale-down never leaves fewer up nodes"""

    def validate(self) -> None:
        pos = ("time_compression", "duration_scale", "backoff_initial_s", "backoff_max_s",
               "usage_tick_s", "usage_period_s", "usage_noise_tau_s", "repair_mean_s",
               "hot_window_s", "stats_window_s")
        for k in pos:
            if not getattr(self, k) > 0:
                raise ValueError(f"ReplayConfig.{k} must be positive, got {getattr(self, k)}")
        nonneg = ("arrival_jitter_s", "duration_jitter", "startup_mean_s", "max_wait_s",
                  "usage_pod_sigma", "usage_cpu_sigma", "usage_mem_sigma", "usage_noise_cpu",
                  "usage_noise_mem", "failure_rate_per_node_hour", "scale_up_after_s",
                  "node_boot_s", "scale_down_idle_s", "oom_restart_s", "oom_restart_max_s", "sla_s")
        for k in nonneg:
            v = getattr(self, k)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"ReplayConfig.{k} must be finite and >= 0, got {v}")
        for k, lo in (("usage_cpu_median", 0.0), ("usage_mem_median", 0.0), ("usage_limit_ratio", 1.0),
                      ("usage_amp_cpu", 0.0), ("usage_amp_mem", 0.0), ("usage_peak_hour", -math.inf)):
            v = getattr(self, k)
            vals = v if isinstance(v, tuple | list) else (v,)
            if len(vals) not in (1, 4) or not all(isinstance(x, int | float) and x >= lo and (
                    math.isfinite(x) or k == "usage_limit_ratio") for x in vals):
                raise ValueError(f"ReplayConfig.{k} must be one value or four (BE, Burstable, LS, "
                                 f"Guaranteed), each >= {lo:g}, got {v}")
        if not -1 <= self.usage_cpu_mem_corr <= 1:
            raise ValueError(f"ReplayConfig.usage_cpu_mem_corr must be in [-1, 1], "
                             f"got {self.usage_cpu_mem_corr}")
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
