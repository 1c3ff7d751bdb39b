"""Online metrics of a replay run: levels over time, not counts of threshold crossings.

:class:`LoadMetrics` is fed the cluster once per usage tick (``dt`` seconds of simulated
time during which the tick's values hold) and reports, per run:

- ``hot_cpu_node_s`` / ``hot_mem_node_s``: node-seconds during which the node's *windowed*
  real use (the time-weighted mean over the last ``window_s``, 5 minutes by default, as
  Crane's and Koordinator's load-aware schedulers judge a node) is above ``threshold``
  (85%) of its capacity. A window makes the figure a level: noise that flickers across the
  threshold for one tick does not count, and the result barely moves with the tick length.
  Node-time where the node's largest pod *alone* uses more than the threshold is left out
  of ``hot_cpu_node_s`` (no placement can avoid it) and reported as
  ``single_pod_hot_node_s``.
- ``throttled_cpu_core_s``: CPU demand above capacity, in core-seconds (CPU is
  compressible: the kernel throttles what does not fit).
- ``contended_pod_share``: the share of pod-time (running pods x seconds) spent on CPU-hot
  nodes, in % (what users feel: how much of their work ran on a hot node).
- ``gpu_frag_rate_avg`` / ``gpu_frag_amount_avg``: FGD's fragmentation rate (% of idle GPU
  that typical pods cannot use) and amount (% of all GPU), time-averaged over the run.
- ``stranded_cpu_avg`` / ``stranded_mem_avg``: a fragmentation measure that depends on
  placement: on each node, the free share of a resource beyond the node's tightest free
  share (CPU or memory) is stranded, since a pod needs both. Summed over nodes weighted by
  capacity, in % of the cluster's capacity of that resource, time-averaged. (The cluster-
  wide ``frag_ratio`` of :mod:`fedsched.common.model.metrics` compares sums over the whole
  cluster, so every placement of the same pods gives it the same value.)

OOM and pending figures come from the simulator's own counts (:func:`oom_and_pending`):
``oom_kills_per_1k_starts``, ``oom_pods_killed`` (distinct pods), ``pending_sla_misses``
(binds that waited longer than ``sla_s``, plus pods still waiting longer at the end).

Names in :data:`LOAD_METRICS`; lower is better for all of them.

May import: numpy and :mod:`fedsched.common.model.cluster`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState

LOAD_METRICS = (
    "hot_cpu_node_s", "hot_mem_node_s", "single_pod_hot_node_s", "throttled_cpu_core_s",
    "contended_pod_share", "gpu_frag_rate_avg", "gpu_frag_amount_avg", "stranded_cpu_avg",
    "stranded_mem_avg", "oom_kills_per_1k_starts", "oom_pods_killed", "pending_sla_misses",
)


@dataclass(frozen=True)
class LoadMetricsConfig:
    """How the online metrics judge a node."""

    threshold: float = 0.85
    """windowed real use / capacity above which a node is hot (CPU and memory)"""
    window_s: float = 300.0
    """length of the window the real use is averaged over (seconds of simulated time)"""
    sla_s: float = 60.0
    """a pod waiting longer than this for its node misses the pending SLA"""

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise ValueError(f"LoadMetricsConfig.threshold must be positive, got {self.threshold}")
        if not self.window_s > 0:
            raise ValueError(f"LoadMetricsConfig.window_s must be positive, got {self.window_s}")
        if not self.sla_s >= 0:
            raise ValueError(f"LoadMetricsConfig.sla_s must be >= 0, got {self.sla_s}")


class UsageWindow:
    """Time-weighted mean (and deviation, peak) of per-node samples over the last ``window_s`` seconds.

    Each sample holds for its ``dt``; the oldest samples leave once the rest cover the
    window (whole samples: with ticks that do not divide the window the span is up to one
    tick longer). ``shape`` is a sample's shape (e.g. ``(2, n)``: CPU and memory of every node,
    one window for both); sums of squares are kept only ``with_std``.
    """

    def __init__(self, shape: int | tuple[int, ...], window_s: float, with_std: bool = True) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, np.ndarray]] = deque()
        self._sum = np.zeros(shape)
        self._sq = np.zeros(shape) if with_std else None
        self._span = 0.0

    def add(self, dt: float, values: np.ndarray) -> np.ndarray:
        """Add a sample lasting ``dt``; returns the windowed mean (including it)."""
        v = np.array(values, dtype=np.float64)
        self._samples.append((dt, v))
        self._sum += dt * v
        if self._sq is not None:
            self._sq += dt * v * v
        self._span += dt
        while len(self._samples) > 1 and self._span - self._samples[0][0] >= self.window_s - 1e-9:
            old_dt, old = self._samples.popleft()
            self._sum -= old_dt * old
            if self._sq is not None:
                self._sq -= old_dt * old * old
            self._span -= old_dt
        return self.mean()

    def mean(self) -> np.ndarray:
        """Time-weighted mean over the window (zeros before the first sample)."""
        return self._sum / self._span if self._span > 0 else np.zeros_like(self._sum)

    def peak(self) -> np.ndarray:
        """Largest sample in the window, per entry (zeros before the first sample).

        Computed on demand (a max over the stored samples), so a caller that needs it only at
        some ticks pays only then."""
        if not self._samples:
            return np.zeros_like(self._sum)
        return np.max(np.stack([v for _, v in self._samples]), axis=0)

    def std(self) -> np.ndarray:
        """Time-weighted population standard deviation over the window (needs ``with_std``)."""
        if self._sq is None:
            raise ValueError("this UsageWindow keeps no sums of squares (with_std=False)")
        if self._span <= 0:
            return np.zeros_like(self._sum)
        m = self._sum / self._span
        return np.sqrt(np.maximum(self._sq / self._span - m * m, 0.0))


class LoadMetrics:
    """Accumulates the tick-based online metrics of one run (see the module docstring)."""

    def __init__(self, state: ClusterState, config: LoadMetricsConfig | None = None) -> None:
        """Metrics of ``state``'s nodes (capacities are read once)."""
        self.cfg = cfg = config or LoadMetricsConfig()
        n = len(state.nodes)
        self._cap_cpu = state.nodes.cpu.astype(np.float64)
        self._cap_mem = state.nodes.mem.astype(np.float64)
        self._use = UsageWindow((2, n), cfg.window_s, with_std=False)  # rows: CPU, memory
        self.time = 0.0
        self.hot_cpu = self.hot_mem = self.single = self.throttled = 0.0
        self.pod_time = self.contended_pod_time = 0.0
        self.frag_rate = self.frag_amount = self.stranded_cpu = self.stranded_mem = 0.0
        self._frag_time = 0.0
        # Per node, cumulative: hot CPU seconds (single-pod ones included), hot memory seconds
        # and throttled CPU core-seconds; a node's outcome over an interval is the difference of
        # two readings (the training environment's per-decision credit).
        self.node_hot_s = np.zeros(n)
        self.node_hot_mem_s = np.zeros(n)
        self.node_throttled = np.zeros(n)

    def tick(self, state: ClusterState, dt: float, cpu_demand: np.ndarray, pods_per_node: np.ndarray,
             max_pod_cpu: np.ndarray, frag_total: float | None = None, use: np.ndarray | None = None) -> None:
        """One tick lasting ``dt``: ``state.cpu_used``/``mem_used`` real use (CPU clipped at
        capacity), ``cpu_demand`` unclipped CPU demand, ``pods_per_node`` running pods,
        ``max_pod_cpu`` the largest running pod's CPU use per node, ``frag_total`` FGD's
        fragmented GPU milli over the alive nodes (None: no GPU fragmentation model); ``use``
        the caller's ``[cpu_used / cap, mem_used / cap]`` when it has it (computed otherwise)."""
        if dt <= 0:
            return
        alive = state.alive
        cap_cpu, cap_mem, thr = self._cap_cpu, self._cap_mem, self.cfg.threshold
        if use is None:
            use = np.stack((state.cpu_used / cap_cpu, state.mem_used / cap_mem))
        cpu_win, mem_win = self._use.add(dt, use)
        every = bool(alive.all())  # the common case: no node down, no boolean indexing needed

        def on_alive(a: np.ndarray) -> np.ndarray:
            return a if every else a[alive]

        hot = cpu_win > thr
        if not every:
            hot &= alive
        single = hot & (max_pod_cpu > thr * cap_cpu)
        n_single = int(np.count_nonzero(single))
        self.hot_cpu += dt * (int(np.count_nonzero(hot)) - n_single)
        self.single += dt * n_single
        hot_mem = mem_win > thr
        if not every:
            hot_mem &= alive
        self.hot_mem += dt * int(np.count_nonzero(hot_mem))
        over = cpu_demand - cap_cpu
        np.maximum(over, 0.0, out=over)
        self.throttled += dt * float(on_alive(over).sum()) / 1000.0
        self.node_hot_s += dt * hot
        self.node_hot_mem_s += dt * hot_mem
        self.node_throttled += (dt / 1000.0) * over
        self.pod_time += dt * float(on_alive(pods_per_node).sum())
        self.contended_pod_time += dt * float(pods_per_node[hot].sum())
        self.time += dt
        if every or alive.any():
            f_cpu = (cap_cpu - state.cpu_req) / cap_cpu
            f_mem = (cap_mem - state.mem_req) / cap_mem
            usable = np.minimum(f_cpu, f_mem)
            f_cpu -= usable
            f_mem -= usable
            self.stranded_cpu += dt * 100.0 * float(on_alive(f_cpu * cap_cpu).sum()) / float(
                on_alive(cap_cpu).sum())
            self.stranded_mem += dt * 100.0 * float(on_alive(f_mem * cap_mem).sum()) / float(
                on_alive(cap_mem).sum())
        if frag_total is not None:
            gpu_cap = float(state.nodes.gpu[alive].sum()) * 1000.0
            gpu_idle = float(state.gpu_free[alive].sum())
            if gpu_cap > 0:
                self.frag_amount += dt * 100.0 * frag_total / gpu_cap
                self.frag_rate += dt * (100.0 * frag_total / gpu_idle if gpu_idle > 0 else 0.0)
                self._frag_time += dt

    def result(self) -> dict[str, float]:
        """The tick-based metrics so far (OOM and pending ones come from :func:`oom_and_pending`)."""
        t, ft = self.time, self._frag_time
        nan = float("nan")
        return {
            "hot_cpu_node_s": self.hot_cpu, "hot_mem_node_s": self.hot_mem,
            "single_pod_hot_node_s": self.single, "throttled_cpu_core_s": self.throttled,
            "contended_pod_share": 100.0 * self.contended_pod_time / self.pod_time if self.pod_time else 0.0,
            "gpu_frag_rate_avg": self.frag_rate / ft if ft else nan,
            "gpu_frag_amount_avg": self.frag_amount / ft if ft else nan,
            "stranded_cpu_avg": self.stranded_cpu / t if t else nan,
            "stranded_mem_avg": self.stranded_mem / t if t else nan,
        }


def oom_and_pending(starts: int, oom_kills: int, pods_killed: int, latencies: np.ndarray,
                    waiting_s: np.ndarray, sla_s: float) -> dict[str, float]:
    """OOM kills per 1,000 pod starts, distinct pods killed, and pending-SLA misses: binds
    that waited longer than ``sla_s`` plus pods still waiting longer than it at the end."""
    lat, wait = np.asarray(latencies, dtype=np.float64), np.asarray(waiting_s, dtype=np.float64)
    return {
        "oom_kills_per_1k_starts": 1000.0 * oom_kills / starts if starts else 0.0,
        "oom_pods_killed": float(pods_killed),
        "pending_sla_misses": float(np.count_nonzero(lat > sla_s) + np.count_nonzero(wait > sla_s)),
    }
