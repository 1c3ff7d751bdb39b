"""Replay mode: a discrete-event simulation of a trace with arrivals, departures and churn.

:class:`ReplaySimulator` is the event loop; it draws the workload (``workload``) and owns
two collaborators it calls: the usage model (``sim.usage``, a
:class:`~fedsched.common.sim.replay.usage.UsageModel`: real use, OOM kills, overload) and
node churn (``sim.churn``, a :class:`~fedsched.common.sim.replay.churn.NodeChurn`: failures,
repairs, the autoscaler). It owns the pods (queue, bindings, start-up, departures) and the
event queue; the collaborators own their state and return what the loop must queue. Its
knobs are :class:`ReplayConfig` (``config``).

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

**Metrics** (:class:`ReplayResult`). ``metrics`` holds every name of
:data:`fedsched.common.model.metrics.METRICS`: allocation and fragmentation at the end
(:func:`snapshot_metrics`, alive nodes), packing-only curve points NaN, ``util_mean`` and
``util_variance`` the time average over usage ticks of the mean and variance over alive
nodes of real CPU utilisation (%), pending latency (mean, p99) over all binds, and the
event counters. ``counters`` adds events processed, decisions, completions, evictions,
node failures, scale-ups/downs and events per second.

**Stepping API.** :class:`ReplaySimulator` runs the event loop until a pod needs a
decision (:meth:`ReplaySimulator.next_pod` returns it with the state) and applies the
decision with :meth:`ReplaySimulator.bind` (``Placement(-1)``: fits nowhere, backoff), so
a Gymnasium environment can drive it one decision at a time; :func:`run_replay` loops it
with a scheduler through :func:`fedsched.common.schedulers.place`.

**Hidden usage** (read-only, for reference schedulers and tests, never for features):
:meth:`ReplaySimulator.expected_use` gives a pod's true mean use from the usage model's
parameters and :meth:`ReplaySimulator.expected_node_use` each node's true expected load (the
sum over its bound pods); the oracle (``oracle``) reads them, and :func:`run_replay` hands the
simulator to a scheduler that has an ``attach_simulator`` method.

May import: ``fedsched.common.model``, ``fedsched.common.schedulers``,
``fedsched.common.learning.features`` (``Telemetry``) and the other modules of this
sub-package but ``oracle``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedsched.common.learning.features import Telemetry
from fedsched.common.model.cluster import USE_MEASURED, ClusterState, NodeTable, Pod, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.load_metrics import LoadMetrics, LoadMetricsConfig, UsageWindow, oom_and_pending
from fedsched.common.model.metrics import (
    METRICS,
    FragTracker,
    failed_requests,
    latency_stats,
    snapshot_metrics,
    utilisation,
)
from fedsched.common.schedulers import Placement, Scheduler, place
from fedsched.common.sim.replay.churn import NodeChurn
from fedsched.common.sim.replay.config import (
    COMPLETED,
    EV_ATTEMPT,
    EV_BOOT,
    EV_DEPART,
    EV_FAIL,
    EV_REPAIR,
    EV_START,
    EV_TICK,
    FAILED,
    NOT_ARRIVED,
    PENDING,
    RUNNING,
    NodeStats,
    ReplayConfig,
)
from fedsched.common.sim.replay.usage import UsageModel
from fedsched.common.sim.replay.usage_kernel import KERNELS, CompiledUsageWindow
from fedsched.common.sim.replay.workload import ReplayWorkload, replay_workload


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
    ``sim.finish()``. ``sim.rng`` is the generator for the scheduler's tie-breaks. The
    usage model is ``sim.usage`` (:class:`UsageModel`) and node churn ``sim.churn``
    (:class:`NodeChurn`), built here and called by the loop.
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
        self._g_start = g_start
        self.workload = wl = replay_workload(pods, nodes, cfg, g_work)
        self.end = wl.end
        self.state = ClusterState(nodes, use_source=USE_MEASURED)  # the usage model measures every node
        n_nodes, n_pods = len(nodes), len(pods)
        ns = self.node_stats = NodeStats.zeros(n_nodes)
        # Usage parameters for every pod (drawn up front from g_work, after the workload:
        # independent of the scheduler); the noise from g_usage.
        self.usage = UsageModel(cfg, nodes, pods, self.state, ns, g_work, g_usage, kernels=KERNELS)
        self._inv_cap100 = 100.0 / self.usage.cap_cpu
        # What a scorer may see beyond requests, shared with the feature builder through the
        # state (the arrays are node_stats' own, updated in place).
        self._telemetry = Telemetry(ns.cpu_trend, ns.mem_trend, ns.overloaded, ns.overload_count,
                                    ns.oom_count, app_usage=self.usage.app_usage, peak_fn=self._peaks)
        self._peak: tuple[np.ndarray, np.ndarray] | None = None
        self.state.telemetry = self._telemetry
        self._node_pods: list[set[int]] = [set() for _ in range(n_nodes)]
        # Online metrics (common/model/load_metrics.py) and the windowed per-node statistics
        # the load-aware scorers read (state.telemetry.cpu_mean/std, mem_mean/std).
        self.load_metrics = LoadMetrics(self.state, LoadMetricsConfig(
            threshold=cfg.overload_threshold, window_s=cfg.hot_window_s, sla_s=cfg.sla_s))
        self._stats: UsageWindow | CompiledUsageWindow = (  # rows: CPU, memory
            UsageWindow((2, n_nodes), cfg.stats_window_s) if KERNELS is None
            else CompiledUsageWindow((2, n_nodes), cfg.stats_window_s))
        self._use = np.zeros((2, n_nodes))  # this tick's real use / capacity (reused buffer)
        # GPU fragmentation kept per node; nodes whose allocation changed are recomputed at the tick.
        self._frag = FragTracker(self.state, typical)
        self._frag_dirty: set[int] = set()
        self._frag_alive = self.state.alive.copy()

        # Per-pod bookkeeping (index = PodTable row). Hot scalars in lists, vector data in arrays.
        self.status = [NOT_ARRIVED] * n_pods
        self._gen = [0] * n_pods
        self._node = [-1] * n_pods
        self._gpus: list[tuple[int, ...]] = [()] * n_pods
        self._enq = [0.0] * n_pods
        self._attempts = [0] * n_pods
        self._fail_epoch = [-1] * n_pods
        self._start_t = [math.nan] * n_pods
        self._remaining = [math.inf] * n_pods
        for k, p in enumerate(wl.pod.tolist()):
            self._remaining[p] = float(wl.duration[k])
        self._pod_cache: list[Pod | None] = [None] * n_pods
        for p, pod in zip(wl.pod.tolist(), Pod.many_from_table(pods, wl.pod), strict=True):
            self._pod_cache[p] = pod

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
             "scale_downs", "usage_ticks", "starts"), 0)
        self._util_mean: list[float] = []
        self._util_var: list[float] = []
        self._series: dict[str, list[float]] = {k: [] for k in
                                                ("t", "util_mean", "util_var", "pending", "running",
                                                 "alive")}
        self._wall0 = time.perf_counter()

        self._push(cfg.usage_tick_s, EV_TICK, 0, 0)
        self.churn = NodeChurn(cfg, nodes, pods, self.state, ns, g_fail)  # removes the spare pool
        if self.churn.fail_rate > 0:
            self._push(self.churn.next_failure(self.now), EV_FAIL, 0, 0)

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
            tel = self._telemetry
            tel.queue_len = len(self._pending)
            return pod, self.state
        self._done = True
        if end < math.inf:
            self.now = end
        if self.progress is not None:
            self.progress(self.n_arrived, n_arr)
        return None

    def _peaks(self) -> tuple[np.ndarray, np.ndarray]:
        """The windowed peak of CPU and memory use / capacity, computed once per tick on demand
        (``Telemetry.peak_fn``: a scheduler that never reads it never pays for it)."""
        if self._peak is None:
            cpu, mem = self._stats.peak()
            self._peak = (cpu, mem)
        return self._peak

    def oom_kills_of(self, pod: int) -> int:
        """OOM kills of pod ``pod`` (PodTable row) so far."""
        return self.usage.oom_kills[pod]

    def pod_throttled_core_s(self, rows: np.ndarray | list[int] | int) -> np.ndarray:
        """Throttled CPU of PodTable ``rows`` so far, core-seconds: what each pod wanted but did not
        get because its node's CPU demand exceeded its capacity, over every run of it; summed over
        all pods, the run's ``throttled_cpu_core_s`` (:meth:`UsageModel.pod_throttled_core_s`)."""
        return self.usage.pod_throttled_core_s(rows)

    def releases_of(self, pod: int) -> int:
        """How many times pod ``pod`` (PodTable row) has been released so far (completion,
        eviction, OOM kill): a bind's run of the pod is over once this has grown."""
        return self._gen[pod]

    def running_use(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(pod rows, CPU milli, memory MiB)`` of the running pods now: what per-pod container
        metrics would show (copies; :meth:`UsageModel.running_use`)."""
        return self.usage.running_use()

    def app_usage(self, app: int) -> tuple[float, float] | None:
        """Observed (CPU, memory) use / non-zero request of application ``app``'s running pods,
        None when none runs (``Telemetry.app_usage``; :meth:`UsageModel.app_usage`)."""
        return self.usage.app_usage(app)

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
        self._frag_dirty.add(node)
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

    # ---- hidden usage parameters (read-only; for reference schedulers and tests) --------
    def expected_use(self, rows: np.ndarray | list[int] | int) -> tuple[np.ndarray, np.ndarray]:
        """The hidden mean real use of PodTable ``rows``: ``(cpu_milli, mem_mib)``, float64
        arrays of ``len(rows)`` (a scalar row gives length-1 arrays).

        Contract: the usage model's level of each pod (``sim.usage``'s ``_pf[_BASE]`` and
        ``_pf[_BASE + 1]``: the level its use varies around, before the cycle and the noise),
        capped at the pod's limit (``_pf[_MAX]``, ``_pf[_MAX + 1]``; no cap where the model has
        none), i.e. the pod's long-run mean use on an uncontended node up to the clipping of
        the cycle and the noise at 0 and at the limit (and before any cap the model puts on a
        best-effort pod's CPU by its node's idle capacity). Drawn for every row when the
        simulator is built, independent of the scheduler and of whether the pod has arrived;
        the same seed gives the same values. No real scheduler knows it (it sees requests and
        past measurements only): this is for the oracle reference
        (``fedsched.common.sim.replay.oracle``) and tests, never for a baseline or a learned
        policy's features. The arrays are copies.
        """
        return self.usage.expected_use(rows)

    def expected_node_use(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the sum of :meth:`expected_use` over the pods bound to it now (starting or
        running; not the pod awaiting a decision): ``(cpu_milli, mem_mib)``, float64 arrays of
        one entry per node (0 for an empty or dead node). The node's true current expected
        load, which no measurement shows (a measurement sees noise and the cycle, and not the
        pods still starting). Costs O(bound pods + nodes) per call."""
        rows, node = self._bound()
        n = len(self._node_pods)
        if len(rows) == 0:
            return np.zeros(n), np.zeros(n)
        cpu, mem = self.expected_use(rows)
        return np.bincount(node, weights=cpu, minlength=n), np.bincount(node, weights=mem, minlength=n)

    def node_sums(self, cpu: np.ndarray, mem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the sums of the per-PodTable-row values ``cpu`` and ``mem`` over the pods
        bound to it now (as :meth:`expected_node_use` sums the hidden means)."""
        rows, node = self._bound()
        n = len(self._node_pods)
        if len(rows) == 0:
            return np.zeros(n), np.zeros(n)
        return (np.bincount(node, weights=cpu[rows], minlength=n),
                np.bincount(node, weights=mem[rows], minlength=n))

    def _bound(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows of the pods bound now and their nodes."""
        counts = [len(ps) for ps in self._node_pods]
        total = sum(counts)
        rows = np.fromiter(itertools.chain.from_iterable(self._node_pods), dtype=np.int64, count=total)
        return rows, np.repeat(np.arange(len(counts)), counts)

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
        """A bound pod starts running: its usage, then its duration clock."""
        self.usage.start(p, self._node[p], self.now)
        self.counters["starts"] += 1
        self._start_t[p] = self.now
        rem = self._remaining[p]
        if rem < math.inf:
            self._push(self.now + rem, EV_DEPART, p, self._gen[p])

    def _release(self, p: int) -> None:
        """Free a bound pod's resources (completion, eviction, OOM kill)."""
        n = self._node[p]
        finite = self._remaining[p] < math.inf
        if self.usage.stop(p, n):  # it was running: keep the work done so far
            self._remaining[p] = max(self._remaining[p] - (self.now - self._start_t[p]), 0.0)
        self.state.release(n, self._pod_cache[p], self._gpus[p])
        self._frag_dirty.add(n)
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

    # ---- node churn (sim.churn decides, the loop evicts and queues) ----------------------
    def _fail_event(self) -> None:
        """``EV_FAIL``: the struck node (if up) loses its pods and fails; the next failure is queued."""
        churn = self.churn
        n = churn.strike()
        if n >= 0:
            self._evict_node(n)
            self.counters["node_failures"] += 1
            self._push(churn.fail(n, self.now), EV_REPAIR, n, 0)
        self._push(churn.next_failure(self.now), EV_FAIL, 0, 0)

    def _evict_node(self, n: int) -> None:
        for p in sorted(self._node_pods[n]):
            self._requeue(p)
            self.counters["evictions"] += 1

    def _node_up(self, n: int, kind: int) -> None:
        """``EV_REPAIR`` / ``EV_BOOT``: node ``n`` is up; capacity grew."""
        self.churn.node_up(n, self.now)
        self._epoch += 1
        self.counters["node_repairs" if kind == EV_REPAIR else "scale_ups"] += 1

    def _autoscale(self) -> None:
        boot, removed = self.churn.autoscale(self.now, self._pending, self._pod_cache)
        if boot >= 0:
            self._push(self.now + self.config.node_boot_s, EV_BOOT, boot, 0)
        self.counters["scale_downs"] += removed

    # ---- usage ticks ---------------------------------------------------------------------
    def _tick(self) -> None:
        """A usage tick: usage, OOM and overload (``sim.usage``), autoscaler, the series, next tick."""
        cfg = self.config
        counters = self.counters
        counters["usage_ticks"] += 1
        oom, overload = self.usage.step(self.now, self._requeue)  # an OOM-killed pod is requeued
        counters["oom_events"] += oom
        counters["overload_events"] += overload
        if cfg.autoscale:
            self._autoscale()
        self._measure(cfg.usage_tick_s)
        self._sample()
        self._push(self.now + cfg.usage_tick_s, EV_TICK, 0, 0)

    def _measure(self, dt: float) -> None:
        """Feed this tick (its values hold for ``dt``) to the online metrics and the windowed
        telemetry; bring the per-node GPU fragmentation up to date first."""
        s, n = self.state, len(self.nodes)
        if s.alive.tobytes() != self._frag_alive.tobytes():  # (cheaper than a numpy comparison)
            self._frag_dirty.update(np.flatnonzero(s.alive != self._frag_alive).tolist())
            self._frag_alive[:] = s.alive
        if self._frag_dirty and self._frag.model is not None:
            self._frag.update_nodes(np.fromiter(self._frag_dirty, dtype=np.int64))
        self._frag_dirty.clear()
        usage = self.usage
        pods, max_pod = usage.running_per_node()
        frag = self._frag.total if self._frag.model is not None else None
        use = self._use
        np.divide(s.cpu_used, usage.cap_cpu, out=use[0])
        np.divide(s.mem_used, usage.cap_mem, out=use[1])
        self.load_metrics.tick(s, dt, usage.cpu_demand, pods, max_pod, frag, use=use)
        tel = self._telemetry
        tel.cpu_mean, tel.mem_mean = self._stats.add(dt, use)
        tel.cpu_std, tel.mem_std = self._stats.std()
        self._peak = None  # the window's peak is computed when something reads it (_peaks)
        if tel.metrics_age_s is None:
            tel.metrics_age_s = np.zeros(n)  # simulated telemetry is always fresh

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
        m.update(failed_requests(self.pods, np.asarray(self.status) == FAILED))
        m.update(self.load_metrics.result())
        waiting = np.array([self.now - self._enq[p] for p in self._pending])
        m.update(oom_and_pending(self.counters["starts"], self.counters["oom_events"],
                                 sum(1 for k in self.usage.oom_kills if k > 0), lat, waiting,
                                 self.config.sla_s))
        m["offered_load_pct"] = 100.0 * self.workload.offered_load
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
    """One replay run of ``scheduler`` on ``nodes`` with the trace ``pods``.

    A scheduler with an ``attach_simulator(sim)`` method (a reference point that reads the
    simulator's hidden state, such as :class:`fedsched.common.sim.replay.oracle.Oracle`) is
    handed the simulator before the first decision.
    """
    sim = ReplaySimulator(nodes, pods, config=config, seed=seed, typical=typical, progress=progress)
    attach = getattr(scheduler, "attach_simulator", None)
    if attach is not None:
        attach(sim)
    rng = sim.rng
    while (d := sim.next_pod()) is not None:
        pod, state = d
        sim.bind(place(scheduler, state, pod, rng))
    return sim.finish()
