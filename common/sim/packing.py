"""Packing mode: the published FGD protocol (Weng et al., USENIX ATC'23, and its artefact).

Workload (``packing_workload``), as the FGD artefact builds it: every pod of the pool in
a seeded shuffle, then pods drawn uniformly *with replacement* from the pool and
appended until the arrived requests would pass ``target_load`` x capacity (the draw that
would cross is dropped). The measure is GPU milli for clusters with GPUs, CPU milli
otherwise. When the pool alone exceeds the target, random pods are removed until it
fits. No departures.

Run (``run_packing``): pods arrive one at a time; each is placed through the scorer
interface (:func:`fedsched.common.schedulers.place`) or fails if it fits nowhere, and
the next one arrives. There is no usage model: a node's real use (``cpu_used`` / ``mem_used``)
is its requests, ClusterState's ``use_source="requests"`` definition, which the serving cache
without telemetry shares. After every attempt a sample (arrived %, allocation %, fragmented
GPU) is recorded; the metrics bin these samples as the artefact does.
:meth:`PackingSimulator.idle_gpu_account` says where the GPU left idle at the end sits (what a
better placement could still win, and what the pods' sizes leave for any scheduler).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedsched.common.model.cluster import MILLI_PER_GPU, USE_REQUESTS, ClusterState, NodeTable, Pod, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.load_metrics import LOAD_METRICS
from fedsched.common.model.metrics import (
    FragTracker,
    binned_curve,
    failed_requests,
    snapshot_metrics,
    utilisation,
)
from fedsched.common.schedulers import Placement, Scheduler, place

CURVE_X = np.arange(0, 131)


def uses_gpu_measure(nodes: NodeTable) -> bool:
    return int(nodes.gpu.sum()) > 0


MAX_TARGET_LOAD = 10.0  # the command lines' bound: the pods a run draws grow with the target


def packing_workload(pool: PodTable, nodes: NodeTable, target_load: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Indices into ``pool`` in arrival order (see module docstring)."""
    if not 0 < target_load < float("inf"):  # a NaN target is never reached: the draw would not end
        raise ValueError(f"target load must be a positive finite number, got {target_load}")
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
    idle_gpu: dict[str, Any] = field(default_factory=dict)  # PackingSimulator.idle_gpu_account (run_packing)

    def curve(self, xs: np.ndarray = CURVE_X) -> np.ndarray:
        return binned_curve(self.arrived_pct, self.alloc_pct, xs)


class PackingSimulator:
    """Packing mode one decision at a time: ``next_pod()`` then ``bind(placement)``.

    ``run_packing`` loops it with a scheduler; the Gymnasium environment drives it with a
    learned policy. Samples are recorded after every attempt, failed ones included.
    """

    def __init__(self, nodes: NodeTable, pool: PodTable, *, target_load: float, seed: int,
                 typical: TypicalPods | None = None) -> None:
        self.nodes, self.pool, self.target_load = nodes, pool, target_load
        self.rng = np.random.default_rng(seed)
        self.order = packing_workload(pool, nodes, target_load, self.rng)
        self.node_rank = self.rng.permutation(len(nodes))  # the artefact's tie-break order
        # No usage model: a node's real use is its requests (ClusterState's one definition).
        self.state = ClusterState(nodes, use_source=USE_REQUESTS)
        self.frag = FragTracker(self.state, typical)
        self.gpu = uses_gpu_measure(nodes)
        self.capacity = float(nodes.total_gpu_milli if self.gpu else nodes.cpu.sum())
        n = len(self.order)
        self.arrived = np.empty(n)
        self.alloc = np.empty(n)
        self.frag_amt = np.empty(n)
        self.frag_rate = np.empty(n)
        self.placements = np.empty(n, dtype=np.int64)
        self.gpus: list[tuple[int, ...]] = []
        self.k = 0  # arrivals decided so far
        self._arrived_total = self._allocated = self._gpu_alloc = 0.0
        self._pod: Pod | None = None

    def __len__(self) -> int:
        return len(self.order)

    @property
    def allocated_pct(self) -> float:
        """Allocated measured resource so far, % of capacity."""
        return 100.0 * self._allocated / self.capacity

    @property
    def arrived_pct(self) -> float:
        return 100.0 * self._arrived_total / self.capacity

    @property
    def frag_pct(self) -> float:
        """Fragmented GPU now, % of all GPU (0 without GPUs or typical pods)."""
        gpu_cap = float(self.nodes.total_gpu_milli)
        return 100.0 * self.frag.total / gpu_cap if gpu_cap else 0.0

    @property
    def done(self) -> bool:
        return self.k >= len(self.order)

    def next_pod(self) -> tuple[Pod, ClusterState] | None:
        """The arriving pod that needs a decision (None when the workload is exhausted)."""
        if self.done:
            return None
        if self._pod is None:
            self._pod = Pod.from_table(self.pool, int(self.order[self.k]))
        return self._pod, self.state

    def bind(self, p: Placement) -> None:
        """Apply the decision for the current pod (``p.node == -1``: it fails)."""
        pod = self._pod if self._pod is not None else self.next_pod()[0]  # type: ignore[index]
        k, state = self.k, self.state
        size = pod.gpu_request if self.gpu else pod.cpu
        self._arrived_total += size
        self.placements[k] = p.node
        self.gpus.append(p.gpus)
        if p.node >= 0:
            state.allocate(p.node, pod, p.gpus)  # and real use = requests (ClusterState docstring)
            self.frag.update(p.node)
            self._allocated += size
            self._gpu_alloc += pod.gpu_request
        gpu_cap = float(self.nodes.total_gpu_milli)
        self.arrived[k] = 100.0 * self._arrived_total / self.capacity
        self.alloc[k] = 100.0 * self._allocated / self.capacity
        idle = gpu_cap - self._gpu_alloc
        self.frag_amt[k] = 100.0 * self.frag.total / gpu_cap if gpu_cap else 0.0
        self.frag_rate[k] = 100.0 * self.frag.total / idle if idle > 0 else 0.0
        self.k += 1
        self._pod = None

    def clone(self, future: np.ndarray | None = None) -> PackingSimulator:
        """An independent copy of the run as it stands (for look-ahead rollouts).

        The copy has its own cluster state, fragmentation tracker, random generator and
        samples; stepping it leaves this simulator untouched. ``future`` (indices into the
        pool) replaces the arrivals after the pending one (``order[k + 1:]``, or
        ``order[k:]`` when no pod is pending): a sampled future instead of this run's.
        """
        c = copy.copy(self)
        c.rng = copy.deepcopy(self.rng)
        c.state = self.state.copy()
        c.frag = copy.copy(self.frag)
        c.frag.state = c.state
        c.frag.per_node = self.frag.per_node.copy()
        c.gpus = list(self.gpus)
        if future is None:
            for name in ("arrived", "alloc", "frag_amt", "frag_rate", "placements"):
                setattr(c, name, getattr(self, name).copy())
            return c
        keep = self.k + (1 if self._pod is not None else 0)
        c.order = np.concatenate([self.order[:keep], np.asarray(future, dtype=np.int64)])
        n = len(c.order)
        for name in ("arrived", "alloc", "frag_amt", "frag_rate", "placements"):
            old = getattr(self, name)
            arr = np.empty(n, dtype=old.dtype)
            arr[: self.k] = old[: self.k]
            setattr(c, name, arr)
        return c

    def idle_gpu_account(self, top: int | None = None) -> dict[str, Any]:
        """Where the GPU left idle now sits, each part in % of all GPU milli:

        - ``idle``: all of it (100 minus the allocated share); ``whole_idle``: GPUs with nothing
          on them; ``shared_idle``: what is left on GPUs that sharing pods use, and
          ``shared_idle_by_largest``: the same split by the largest sharing pod on the GPU
          (milli -> %, largest part first): a GPU holding an 810-milli pod has at most
          190 left, which only pods of at most 190 can take;
        - ``cpu_stranded`` / ``mem_stranded``: idle GPU (whole or partial) on nodes whose free
          CPU (memory, where CPU is not short) is below every GPU pod of the pool: no GPU pod
          it could ever receive fits there;
        - ``failed_by_shape``: failed arrivals by ``"<GPUs>x<milli>"`` (CPU-only: ``"0x0"``),
          most frequent first.

        The two splits keep their ``top`` largest entries (None: all; averages over runs need
        all). Empty without GPUs."""
        if top is not None and top < 1:
            raise ValueError(f"top must be at least 1, got {top}")
        nt, st = self.nodes, self.state
        total = float(nt.total_gpu_milli)
        if total <= 0:
            return {}
        free = np.where(st.gpu_exists, st.gpu_free, 0)
        pct = 100.0 / total
        k = self.k
        rows = self.order[:k]
        placed = self.placements[:k]
        largest: dict[tuple[int, int], int] = {}
        share = (self.pool.num_gpu[rows] == 1) & (self.pool.gpu_milli[rows] < MILLI_PER_GPU) & (placed >= 0)
        for a in np.flatnonzero(share).tolist():
            key = (int(placed[a]), int(self.gpus[a][0]))
            largest[key] = max(largest.get(key, 0), int(self.pool.gpu_milli[rows[a]]))
        by_largest: dict[int, float] = {}
        for (n, g), size in largest.items():
            by_largest[size] = by_largest.get(size, 0.0) + pct * float(free[n, g])
        gpu_pods = self.pool.num_gpu > 0
        node_free = free.sum(axis=1).astype(np.float64)
        cpu_short = np.zeros(len(nt), dtype=bool)
        mem_short = np.zeros(len(nt), dtype=bool)
        if gpu_pods.any():
            cpu_short = nt.cpu - st.cpu_req < int(self.pool.cpu[gpu_pods].min())
            mem_short = ~cpu_short & (nt.mem - st.mem_req < int(self.pool.mem[gpu_pods].min()))
        failed = rows[placed < 0]
        ngpu, milli = self.pool.num_gpu, self.pool.gpu_milli
        shapes = Counter(f"{int(ngpu[i])}x{int(milli[i]) if ngpu[i] else 0}" for i in failed.tolist())
        whole = float((st.gpu_exists & (free == MILLI_PER_GPU)).sum()) * MILLI_PER_GPU
        return {
            "idle": pct * float(free.sum()),
            "whole_idle": pct * whole,
            "shared_idle": pct * (float(free.sum()) - whole),
            "shared_idle_by_largest": dict(sorted(by_largest.items(), key=lambda kv: -kv[1])[:top]),
            "cpu_stranded": pct * float(node_free[cpu_short].sum()),
            "mem_stranded": pct * float(node_free[mem_short].sum()),
            "failed_by_shape": dict(shapes.most_common(top)),
        }

    def result(self) -> PackingResult:
        """Samples and metrics of the decisions made so far."""
        k = self.k
        arrived, alloc = self.arrived[:k], self.alloc[:k]
        frag_amt, frag_rate = self.frag_amt[:k].copy(), self.frag_rate[:k].copy()
        if self.frag.model is None:
            frag_amt[:] = np.nan
            frag_rate[:] = np.nan
        res = PackingResult(arrived, alloc, frag_amt, frag_rate, self.placements[:k], list(self.gpus))
        self.frag.refresh()
        m = snapshot_metrics(self.state, self.frag)
        at = binned_curve(arrived, alloc, np.array([100.0, round(100 * self.target_load)]))
        m["gpu_alloc_at_100"] = float(at[0]) if self.gpu else float("nan")
        m["gpu_alloc_at_target"] = float(at[1]) if self.gpu else float("nan")
        m["gpu_frag_rate_at_90"] = float(binned_curve(arrived, frag_rate, np.array([90.0]))[0])
        u = utilisation(self.state)
        nan = float("nan")  # packing has no queue and no usage model: not applicable
        m.update(failed_requests(self.pool, self.order[:k][res.placements < 0]))
        m.update(failed_pods=float((res.placements < 0).sum()), pending_pods=nan, pending_mean_s=nan,
                 pending_p99_s=nan, util_mean=float(u.mean()), util_variance=float(u.var()),
                 overload_events=nan, oom_events=nan,
                 offered_load_pct=float(arrived[-1]) if len(arrived) else 0.0,
                 **dict.fromkeys(LOAD_METRICS, nan))
        res.metrics = m
        return res


def run_packing(nodes: NodeTable, pool: PodTable, scheduler: Scheduler, *, target_load: float,
                seed: int, typical: TypicalPods | None = None,
                progress: Callable[[int, int], None] | None = None) -> PackingResult:
    """One packing run of ``scheduler`` on ``nodes`` with pods drawn from ``pool``, with the idle-GPU
    account of its end state."""
    sim = PackingSimulator(nodes, pool, target_load=target_load, seed=seed, typical=typical)
    n = len(sim)
    while (item := sim.next_pod()) is not None:
        pod, state = item
        sim.bind(place(scheduler, state, pod, sim.rng, node_rank=sim.node_rank))
        if progress is not None and (sim.k % 500 == 0 or sim.k == n):
            progress(sim.k, n)
    res = sim.result()
    res.idle_gpu = sim.idle_gpu_account()
    return res
