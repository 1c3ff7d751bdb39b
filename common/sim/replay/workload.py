"""Replay mode's workload: which trace pods are replayed, when they arrive, how long they run.

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
at most ~45% is reachable (with ``start_quantile=0.01``). An unreachable target is an
error naming the highest reachable load, unless ``allow_unreachable_load`` (then the run uses
that maximum: every pod stays to the end); ``ReplayWorkload.offered_load`` is what was
reached, and every replay result reports it (``offered_load_pct``).
Noise (seeded, drawn for every trace row so the selection does not change a pod's draw):
each arrival gets ``N(0, arrival_jitter_s)`` seconds (clipped at 0), each duration a factor
``max(0.05, 1 + N(0, duration_jitter))``. Pods are ordered by arrival (ties by trace row);
``max_pods`` keeps the first arrivals. The run ends at
``horizon_s``; ``None`` means the last arrival, ``math.inf`` means when nothing is left to
do (all arrived, none pending, no pod with a finite duration still bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.sim.replay.config import ReplayConfig


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
        reachable = _offered(size, arrival, dur * hi_s, span, cap)
        if reachable < cfg.target_load * (1 - 1e-3) and not cfg.allow_unreachable_load:
            raise ValueError(
                f"replay target_load {cfg.target_load:g} cannot be reached: with every pod staying "
                f"to the end the requested load is {reachable:.3g} of capacity over the run; lower "
                f"target_load, raise max_pods or start_quantile, set horizon_s, or allow it "
                f"(allow_unreachable_load / --replay-allow-unreachable-load)")
        if reachable <= cfg.target_load:
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
