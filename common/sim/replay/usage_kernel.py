"""The usage tick's per-pod and per-node loops, compiled with numba (:class:`~.usage.UsageModel`).

Each function is the numpy form in ``usage.py`` written as one loop, operation for operation
on the same float64 operands in the same order, with no fast-math, so the same bits:

- :func:`_step`: the AR(1) noise ``eps * rho + innovation``, the use
  ``amp * wave + (eps + 1) * base`` clipped at 0 and at the limit, the per-node sums of CPU
  demand and memory in slot order (``np.bincount`` adds its weights in index order from 0.0),
  and best-effort pods' share of their node's idle CPU (the factor ``(f - 1) + 1`` as numpy
  forms it; a non-BE pod's ``0.0`` weight in the BE sum changes no bit, so it is left out);
  then the CPU use clipped at capacity and the count of nodes short of memory (OOM to check).
- :func:`_start` / :func:`_stop`: a pod taking a slot (its use evaluated at once, a best-effort
  pod's CPU at most what its node leaves idle) and leaving it (the last slot moved into the hole).
- :func:`_throttle`: each running pod's share of its node's CPU demand above capacity, added
  to its throttled core-seconds (``factor = gain * (demand - cap) / demand`` per hot node, then
  ``use * factor`` per pod, as the numpy form; pods on other nodes are left alone, where the
  numpy form also adds nothing).
- :func:`_per_node`: running pods per node and the CPU use of each node's largest
  (``np.bincount`` and ``np.maximum.at`` from 0).
- :func:`_app_usage`: one application's use and requests summed over its running pods in slot
  order (its entry of the numpy form's ``np.bincount`` over every application), without the
  per-application arrays the numpy form builds and keeps until the next tick or departure.
- :func:`_overload_trend`: overload transitions and the usage trend EMA.
- :class:`CompiledUsageWindow`: :class:`~fedsched.common.model.load_metrics.UsageWindow`'s
  mean and deviation, the new sample's ``dt * v`` and ``dt * v * v`` added, the leaving one's
  taken away and the mean and deviation read in one loop (:func:`_window_update`), and the
  window's peak from a ring of its samples (:func:`_window_peak`).

``usage.py`` holds the numpy forms, used when numba cannot be imported (``KERNELS`` None) or
when a :class:`~.usage.UsageModel` is built without ``kernels`` (the simulator passes
``KERNELS``); ``tests/common/sim/test_replay_kernels.py`` runs replays both ways and compares
every metric, counter, per-tick series and latency bit for bit. The first call of each function
in a process loads its machine code from numba's on-disk cache (compiled once, about 2 s; the
loads together take about 0.3 s per process).

May import: numpy, numba.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import numpy as np

# Rows of UsageModel's per-pod parameter arrays (usage.py's _BASE, _AMP, ...; a test checks they agree).
_BASE, _AMP, _MAX, _EPS, _CUR, _BEF = 0, 2, 4, 6, 8, 11


def _start(pf: np.ndarray, sf: np.ndarray, p: int, k: int, n: int, wave: float, cap_cpu: np.ndarray,
           cap_mem: np.ndarray, cpu_demand: np.ndarray, cpu_used: np.ndarray, mem_used: np.ndarray) -> bool:
    """Pod ``p`` into slot ``k`` on node ``n`` with its use now; True for a capped best-effort pod."""
    for r in range(sf.shape[0]):
        sf[r, k] = pf[r, p]
    max_m = min(pf[_MAX + 1, p], cap_mem[n])  # one pod alone never OOMs its node
    sf[_MAX + 1, k] = max_m
    cu = min(max(0.0, pf[_BASE, p] * (1.0 + pf[_EPS, p]) + pf[_AMP, p] * wave), pf[_MAX, p])
    bef = pf[_BEF, p] != 0.0
    if bef:  # best effort: at most what the node leaves idle now
        cu = min(cu, max(0.0, cap_cpu[n] - cpu_demand[n]))
    mu = min(max(0.0, pf[_BASE + 1, p] * (1.0 + pf[_EPS + 1, p]) + pf[_AMP + 1, p] * wave), max_m)
    sf[_CUR, k] = cu
    sf[_CUR + 1, k] = mu
    cpu_demand[n] += cu
    cpu_used[n] = min(cpu_demand[n], cap_cpu[n])
    mem_used[n] += mu
    return bef


def _stop(pf: np.ndarray, sf: np.ndarray, p: int, k: int, last: int, n: int, s_pod: np.ndarray,
          s_node: np.ndarray, s_cls: np.ndarray, cpu_demand: np.ndarray, cap_cpu: np.ndarray,
          cpu_used: np.ndarray, mem_used: np.ndarray) -> int:
    """Pod ``p`` out of slot ``k`` (node ``n``), slot ``last`` moved into it; returns the moved
    pod (-1: none) + 1, negated for a capped best-effort pod ``p``."""
    cu, mu = sf[_CUR, k], sf[_CUR + 1, k]
    pf[_EPS, p] = sf[_EPS, k]  # keep the noise state for a restart
    pf[_EPS + 1, p] = sf[_EPS + 1, k]
    bef = sf[_BEF, k] != 0.0
    q = -1
    if k != last:
        q = s_pod[last]
        for r in range(sf.shape[0]):
            sf[r, k] = sf[r, last]
        s_pod[k] = q
        s_node[k] = s_node[last]
        s_cls[k] = s_cls[last]
    d = cpu_demand[n] - cu
    cpu_demand[n] = d if d > 1e-9 else 0.0
    cpu_used[n] = min(cpu_demand[n], cap_cpu[n])
    m = mem_used[n] - mu
    mem_used[n] = m if m > 1e-9 else 0.0
    return -(q + 1) if bef else q + 1


def _step(sf: np.ndarray, k: int, rho: float, innov: np.ndarray, at: int, wave: np.ndarray,
          s_cls: np.ndarray, s_node: np.ndarray, cap_cpu: np.ndarray, cap_mem: np.ndarray, n_be: int,
          demand: np.ndarray, cpu_used: np.ndarray, mem_used: np.ndarray) -> int:
    """Step the ``k`` running slots of ``sf`` in place; per-node CPU ``demand`` (zeroed by the
    caller), ``cpu_used`` (``np.minimum(demand, cap_cpu)``) and ``mem_used`` out (overwritten);
    returns how many nodes use more memory than they have."""
    _step_use(sf, k, rho, innov, at, wave, s_cls, s_node, cap_cpu, n_be, demand, mem_used)
    n_oom = 0
    for i in range(demand.shape[0]):
        cpu_used[i] = demand[i] if demand[i] <= cap_cpu[i] else cap_cpu[i]
        if mem_used[i] > cap_mem[i]:
            n_oom += 1
    return n_oom


def _step_use(sf: np.ndarray, k: int, rho: float, innov: np.ndarray, at: int, wave: np.ndarray,
              s_cls: np.ndarray, s_node: np.ndarray, cap_cpu: np.ndarray, n_be: int, demand: np.ndarray,
              mem_used: np.ndarray) -> None:
    """The slots' use, the per-node sums and best-effort pods' share of the idle CPU."""
    n = demand.shape[0]
    for i in range(n):
        mem_used[i] = 0.0
    # Rows as 1-d views: the loop below runs at about two thirds of the time of 2-d indexing.
    base_c, base_m, amp_c, amp_m = sf[_BASE], sf[_BASE + 1], sf[_AMP], sf[_AMP + 1]
    max_c, max_m = sf[_MAX], sf[_MAX + 1]
    eps_c, eps_m, cur_c, cur_m = sf[_EPS], sf[_EPS + 1], sf[_CUR], sf[_CUR + 1]
    innov_c, innov_m = innov[0], innov[1]
    for j in range(k):
        node = s_node[j]
        w = wave[s_cls[j]]
        e = eps_c[j] * rho + innov_c[at + j]
        eps_c[j] = e
        c = min(max(amp_c[j] * w + (e + 1.0) * base_c[j], 0.0), max_c[j])
        cur_c[j] = c
        demand[node] += c
        e = eps_m[j] * rho + innov_m[at + j]
        eps_m[j] = e
        c = min(max(amp_m[j] * w + (e + 1.0) * base_m[j], 0.0), max_m[j])
        cur_m[j] = c
        mem_used[node] += c
    if n_be == 0:
        return
    hot = False
    for i in range(n):
        if demand[i] > cap_cpu[i]:
            hot = True
            break
    if not hot:
        return
    be = np.zeros(n)
    for j in range(k):
        if sf[_BEF, j] != 0.0:
            be[s_node[j]] += sf[_CUR, j]
    idle = np.empty(n)
    squeeze = False
    for i in range(n):
        idle[i] = max(cap_cpu[i] - (demand[i] - be[i]), 0.0)
        if be[i] > idle[i]:
            squeeze = True
    if not squeeze:
        return
    for j in range(k):
        if sf[_BEF, j] != 0.0:
            i = s_node[j]
            f = idle[i] / be[i] if be[i] > idle[i] else 1.0
            sf[_CUR, j] *= (f - 1.0) * sf[_BEF, j] + 1.0
    for i in range(n):
        demand[i] = (demand[i] - be[i]) + min(be[i], idle[i])


def _throttle(sf: np.ndarray, k: int, s_pod: np.ndarray, s_node: np.ndarray, demand: np.ndarray,
              cap_cpu: np.ndarray, gain: float, acc: np.ndarray) -> None:
    """``acc[pod] += cur * (gain * (demand - cap) / demand)`` for the ``k`` running slots on nodes
    whose CPU demand exceeds their capacity (nothing when there is none)."""
    n = demand.shape[0]
    hot = False
    for i in range(n):
        if demand[i] - cap_cpu[i] > 0.0:
            hot = True
            break
    if not hot:
        return
    factor = np.zeros(n)
    for i in range(n):
        over = demand[i] - cap_cpu[i]
        if over > 0.0:
            factor[i] = gain * over / demand[i]
    cur = sf[_CUR]
    for j in range(k):
        f = factor[s_node[j]]
        if f != 0.0:
            acc[s_pod[j]] += cur[j] * f


def _per_node(s_node: np.ndarray, cpu: np.ndarray, k: int, pods: np.ndarray, max_pod: np.ndarray) -> None:
    """Running pods per node and the largest one's CPU use (both zeroed by the caller)."""
    for j in range(k):
        i = s_node[j]
        pods[i] += 1
        max_pod[i] = max(max_pod[i], cpu[j])


def _app_usage(app_dense: np.ndarray, s_pod: np.ndarray, sf: np.ndarray, req_nz: np.ndarray, k: int,
               app: int, out: np.ndarray) -> None:
    """Application ``app``'s running pods' CPU and memory use and non-zero requests, summed in
    slot order from 0.0 (``np.bincount``'s order, so its entry for ``app``), into ``out[0:4]``."""
    u0 = u1 = t0 = t1 = 0.0
    for j in range(k):
        p = s_pod[j]
        if app_dense[p] == app:
            u0 += sf[_CUR, j]
            u1 += sf[_CUR + 1, j]
            t0 += req_nz[0, p]
            t1 += req_nz[1, p]
    out[0] = u0
    out[1] = u1
    out[2] = t0
    out[3] = t1


def _overload_trend(cpu_used: np.ndarray, mem_used: np.ndarray, cap_cpu: np.ndarray, threshold: float,
                    overloaded: np.ndarray, overload_count: np.ndarray, cpu_trend: np.ndarray,
                    mem_trend: np.ndarray, prev_cpu: np.ndarray, prev_mem: np.ndarray, gain: float,
                    keep: float) -> int:
    """Overload flags and transitions (returned), then ``trend = trend * keep + (used - prev) * gain``."""
    n_over = 0
    for i in range(cpu_used.shape[0]):
        over = cpu_used[i] > threshold * cap_cpu[i]
        if over and not overloaded[i]:
            overload_count[i] += 1
            n_over += 1
        overloaded[i] = over
        cpu_trend[i] = cpu_trend[i] * keep + (cpu_used[i] - prev_cpu[i]) * gain
        prev_cpu[i] = cpu_used[i]
        mem_trend[i] = mem_trend[i] * keep + (mem_used[i] - prev_mem[i]) * gain
        prev_mem[i] = mem_used[i]
    return n_over


def _window_update(total: np.ndarray, sq: np.ndarray, v: np.ndarray, dt: float, add: bool, old: np.ndarray,
                   old_dt: float, drop: bool, span: float, mean: np.ndarray, std: np.ndarray) -> None:
    """With ``add``, ``total += dt * v`` and ``sq += dt * v * v``; then, with ``drop``,
    ``total -= old_dt * old`` and ``sq -= old_dt * old * old``; then, with ``span`` > 0,
    ``mean = total / span`` and ``std = sqrt(max(sq / span - mean * mean, 0))``: per entry, in
    that order, as the numpy form."""
    for i in range(total.shape[0]):
        a, b = total[i], sq[i]
        if add:
            t = dt * v[i]
            a += t
            b += t * v[i]
        if drop:
            t = old_dt * old[i]
            a -= t
            b -= t * old[i]
        total[i] = a
        sq[i] = b
        if span > 0:
            m = a / span
            mean[i] = m
            std[i] = np.sqrt(max(b / span - m * m, 0.0))


def _window_peak(ring: np.ndarray, head: int, count: int, out: np.ndarray) -> None:
    """Elementwise maximum of the ``count`` ring rows from ``head`` (wrapping), in window order
    as ``np.max`` of their stack takes it: a later sample replaces the maximum only when larger,
    and a NaN anywhere gives NaN (``np.maximum``)."""
    cap, m = ring.shape
    for e in range(m):
        out[e] = ring[head, e]
    for i in range(1, count):
        r = (head + i) % cap
        for e in range(m):
            x = ring[r, e]
            if x > out[e] or x != x:
                out[e] = x


class CompiledUsageWindow:
    """:class:`~fedsched.common.model.load_metrics.UsageWindow` (with the deviation) on the
    compiled loops: the same samples kept and dropped, the same sums, the same bits. :meth:`add`
    returns the mean and keeps the deviation for :meth:`std` (one read of the sums). The
    samples are kept, flat, in a ring of rows (their durations beside it), which :meth:`peak`
    reads in one pass (:func:`_window_peak`)."""

    def __init__(self, shape: tuple[int, ...], window_s: float) -> None:
        assert KERNELS is not None
        self.window_s = window_s
        self._dts: deque[float] = deque()  # each kept sample's duration, oldest first
        self._shape = shape
        self._sum = np.zeros(shape)
        self._sq = np.zeros(shape)
        self._span = 0.0
        self._std: np.ndarray | None = None
        # The kept samples themselves, flat: row (head + i) % len holds the i-th oldest.
        self._ring = np.zeros((16, int(np.prod(shape))))
        self._head = 0

    def _ring_push(self, values: np.ndarray) -> np.ndarray:
        """Store the newest sample (its duration already in ``_dts``) and return its row."""
        ring, count = self._ring, len(self._dts)
        if count > len(ring):  # full: twice the rows, the window's samples first, in order
            order = (self._head + np.arange(count - 1)) % len(ring)
            grown = np.zeros((2 * len(ring), ring.shape[1]))
            grown[:count - 1] = ring[order]
            self._ring, self._head, ring = grown, 0, grown
        row = ring[(self._head + count - 1) % len(ring)]
        row[:] = np.asarray(values, dtype=np.float64).reshape(-1)
        return row

    def add(self, dt: float, values: np.ndarray) -> np.ndarray:
        """Add a sample lasting ``dt``; returns the windowed mean (including it)."""
        dts = self._dts
        dts.append(dt)
        flat = self._ring_push(values)
        span = self._span + dt
        # The samples UsageWindow.add pops, in its order; their rows stay as they are until the
        # next sample is pushed.
        gone: list[tuple[float, np.ndarray]] = []
        while len(dts) > 1 and span - dts[0] >= self.window_s - 1e-9:
            old_dt = dts.popleft()
            gone.append((old_dt, self._ring[self._head]))
            self._head = (self._head + 1) % len(self._ring)
            span -= old_dt
        self._span = span
        total, sq = self._sum.reshape(-1), self._sq.reshape(-1)
        mean, self._std = np.zeros(self._shape), np.zeros(self._shape)
        update = KERNELS.window_update
        m, d = mean.reshape(-1), self._std.reshape(-1)
        if len(gone) <= 1:  # the common case, one pass: add the new sample, drop the old one, read
            old_dt, old = gone[0] if gone else (0.0, flat)
            update(total, sq, flat, dt, True, old, old_dt, bool(gone), span, m, d)
            return mean
        update(total, sq, flat, dt, True, flat, 0.0, False, -1.0, m, d)
        for i, (old_dt, old) in enumerate(gone):
            update(total, sq, flat, 0.0, False, old, old_dt, True, span if i == len(gone) - 1 else -1.0, m, d)
        return mean

    def std(self) -> np.ndarray:
        """The time-weighted standard deviation at the last :meth:`add` (zeros before it)."""
        return np.zeros(self._shape) if self._std is None else self._std

    def peak(self) -> np.ndarray:
        """Largest sample in the window, per entry (zeros before the first sample): the
        samples' elementwise maximum in window order, ``np.max`` of their stack without the
        stack (:func:`_window_peak`)."""
        out = np.zeros(self._shape)
        if self._dts:
            KERNELS.window_peak(self._ring, self._head, len(self._dts), out.reshape(-1))
        return out


KERNELS: SimpleNamespace | None
try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; usage.py's numpy forms stand in
    KERNELS = None
else:
    _step_use = numba.njit(cache=True)(_step_use)  # called by _step (a compiled function calls compiled ones)
    KERNELS = SimpleNamespace(start=numba.njit(cache=True)(_start), stop=numba.njit(cache=True)(_stop),
                              step=numba.njit(cache=True)(_step), throttle=numba.njit(cache=True)(_throttle),
                              per_node=numba.njit(cache=True)(_per_node),
                              app_usage=numba.njit(cache=True)(_app_usage),
                              overload_trend=numba.njit(cache=True)(_overload_trend),
                              window_update=numba.njit(cache=True)(_window_update),
                              window_peak=numba.njit(cache=True)(_window_peak))
