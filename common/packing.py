"""Packing mode: the published FGD protocol (reference section 4).

Workload (``packing_workload``), as the FGD artefact builds it: every pod of the pool in
a seeded shuffle, then pods drawn uniformly *with replacement* from the pool and
appended until the arrived requests would pass ``target_load`` x capacity (the draw that
would cross is dropped). The measure is GPU milli for clusters with GPUs, CPU milli
otherwise. When the pool alone exceeds the target, random pods are removed until it
fits. No departures.

Run (``run_packing``): pods arrive one at a time; each is placed through the scorer
interface (:func:`fedsched.common.schedulers.place`) or fails if it fits nowhere, and
the next one arrives. After every attempt a sample (arrived %, allocation %, fragmented
GPU) is recorded; the metrics bin these samples as the artefact does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .cluster import ClusterState, NodeTable, Pod, PodTable
from .fragmentation import TypicalPods
from .metrics import FragTracker, binned_curve, snapshot_metrics, utilisation
from .schedulers import Scheduler, place

CURVE_X = np.arange(0, 131)


def uses_gpu_measure(nodes: NodeTable) -> bool:
    return int(nodes.gpu.sum()) > 0


def packing_workload(pool: PodTable, nodes: NodeTable, target_load: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Indices into ``pool`` in arrival order (see module docstring)."""
    if target_load <= 0:
        raise ValueError(f"target load must be positive, got {target_load}")
    if uses_gpu_measure(nodes):
        size, capacity = pool.gpu_request, float(nodes.total_gpu_milli)
    else:
        size, capacity = pool.cpu, float(nodes.cpu.sum())
    target = target_load * capacity
    order = list(rng.permutation(len(pool)))
    total = float(size.sum())
    if total > target:
        while total > target and order:
            k = int(rng.integers(len(order)))
            total -= float(size[order.pop(k)])
        return np.asarray(order, dtype=np.int64)
    if size.max() <= 0:
        raise ValueError("no pod in the pool requests the measured resource")
    extra = []
    while True:
        i = int(rng.integers(len(pool)))
        if total + size[i] > target:
            break
        total += float(size[i])
        extra.append(i)
    return np.asarray(order + extra, dtype=np.int64)


@dataclass
class PackingResult:
    """Samples after every pod attempt, and the run's metrics."""

    arrived_pct: np.ndarray  # arrived requests, % of capacity
    alloc_pct: np.ndarray  # allocated measured resource, % of capacity
    frag_pct: np.ndarray  # fragmented GPU, % of all GPU (NaN without typical pods)
    frag_rate_pct: np.ndarray  # fragmented / idle GPU, %
    placements: np.ndarray  # node per arrival, -1 = failed
    gpus: list[tuple[int, ...]]  # GPU slots per arrival (empty when failed or CPU-only)
    metrics: dict[str, float] = field(default_factory=dict)

    def curve(self, xs: np.ndarray = CURVE_X) -> np.ndarray:
        return binned_curve(self.arrived_pct, self.alloc_pct, xs)


def run_packing(nodes: NodeTable, pool: PodTable, scheduler: Scheduler, *, target_load: float,
                seed: int, typical: TypicalPods | None = None,
                progress: Callable[[int, int], None] | None = None) -> PackingResult:
    """One packing run of ``scheduler`` on ``nodes`` with pods drawn from ``pool``."""
    rng = np.random.default_rng(seed)
    order = packing_workload(pool, nodes, target_load, rng)
    node_rank = rng.permutation(len(nodes))
    state = ClusterState(nodes)
    frag = FragTracker(state, typical)
    gpu = uses_gpu_measure(nodes)
    capacity = float(nodes.total_gpu_milli if gpu else nodes.cpu.sum())
    n = len(order)
    arrived = np.empty(n)
    alloc = np.empty(n)
    frag_amt = np.empty(n)
    frag_rate = np.empty(n)
    placements = np.empty(n, dtype=np.int64)
    gpus: list[tuple[int, ...]] = []
    arrived_total = 0.0
    allocated = 0.0
    gpu_cap = float(nodes.total_gpu_milli)
    gpu_alloc = 0.0
    for k, i in enumerate(order):
        pod = Pod.from_table(pool, int(i))
        size = pod.gpu_request if gpu else pod.cpu
        arrived_total += size
        p = place(scheduler, state, pod, rng, node_rank=node_rank)
        placements[k] = p.node
        gpus.append(p.gpus)
        if p.node >= 0:
            state.allocate(p.node, pod, p.gpus)
            state.cpu_used[p.node] += pod.cpu  # packing: real use equals requests
            state.mem_used[p.node] += pod.mem
            frag.update(p.node)
            allocated += size
            gpu_alloc += pod.gpu_request
        arrived[k] = 100.0 * arrived_total / capacity
        alloc[k] = 100.0 * allocated / capacity
        idle = gpu_cap - gpu_alloc
        frag_amt[k] = 100.0 * frag.total / gpu_cap if gpu_cap else 0.0
        frag_rate[k] = 100.0 * frag.total / idle if idle > 0 else 0.0
        if progress is not None and (k % 500 == 0 or k == n - 1):
            progress(k + 1, n)
    if frag.model is None:
        frag_amt[:] = np.nan
        frag_rate[:] = np.nan
    res = PackingResult(arrived, alloc, frag_amt, frag_rate, placements, gpus)
    frag.refresh()
    m = snapshot_metrics(state, frag)
    at = binned_curve(arrived, alloc, np.array([100.0, round(100 * target_load)]))
    m["gpu_alloc_at_100"] = float(at[0]) if gpu else float("nan")
    m["gpu_alloc_at_target"] = float(at[1]) if gpu else float("nan")
    m["gpu_frag_rate_at_90"] = float(binned_curve(arrived, frag_rate, np.array([90.0]))[0])
    u = utilisation(state)
    nan = float("nan")  # packing has no queue and no usage model: not applicable
    m.update(failed_pods=float((placements < 0).sum()), pending_pods=nan, pending_mean_s=nan,
             pending_p99_s=nan, util_mean=float(u.mean()), util_variance=float(u.var()),
             overload_events=nan, oom_events=nan)
    res.metrics = m
    return res
