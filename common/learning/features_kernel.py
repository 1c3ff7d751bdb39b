"""The feature builder's per-decision loops (:meth:`~.features.FeatureBuilder.build`), compiled with numba.

- ``KERNEL`` (:func:`_node_block`): the per-candidate columns, below.
- ``GATHER`` (:func:`_gather_columns`): ``NodeColumnCache.get``'s refresh of the nodes whose
  version moved (``_refresh_few``'s scalar operations) and the copy of the candidates' cached
  rows and aux columns.
- ``TOTALS`` (:func:`_totals`): the cluster's integer totals over its alive nodes
  (``features.cluster_totals``): exact, so any order of addition.

:func:`_node_block` writes, for each candidate node, the node feature columns that move with the
pod or with live signals (``features._BLOCK``: what placing the pod leaves, BestFit's leftover,
the imbalance, measured use and trend, overload history, GPU-tag affinity, the windowed load and
the headroom after placement) straight into the float32 feature rows, and returns nothing else.
It is the numpy form in ``features.py`` (about 45 array operations of a few microseconds each on
100-row arrays, most of a learned decision's feature time) written as one loop over the
candidates, operation for operation on the same float64 operands in the same order, with no
fast-math, so the same bits:

- the fallbacks of :func:`fedsched.common.schedulers.load_stats.node_load` per field and node
  (an absent field, passed as an empty array, or a NaN entry gives the mean ``used / capacity``,
  0 where the node has no capacity, and the deviation 0; the peak is at least the mean, and a
  NaN on either side of that comparison is the answer, as ``np.maximum``);
- ``int`` operands (capacities, GPU-tag counts) are exact in float64, as numpy converts them;
- each value is rounded to float32 once, when stored, as numpy's assignment into the rows.

What it does not compute, because numpy's answer is not libm's or numba's (``log1p`` may come
from numpy's SIMD tables) or is a pairwise sum: the two ``log1p`` history columns (passed in)
and the cluster context's float sums. ``features.py`` keeps the numpy forms, used when numba
cannot be imported (``KERNEL``, ``GATHER``, ``TOTALS`` None); ``tests/common/learning/
test_features_kernel.py`` checks the two give the same bits on serving-like telemetry with gaps,
node churn and GPU clusters, and ``tests/common/sim/test_replay_kernels.py`` on whole replays.

May import: numpy, numba.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

# Rows of the builder's aux block (features._AUX) and the block's columns (features._BLOCK); a test
# checks they agree with features.py.
_CPU_LEFT, _GPU_LEFT, _CAP_CPU, _CAP_MEM, _TAGGED, _N_TAGGED = 0, 2, 5, 6, 10, 11
N_BLOCK = 25


def _fallback(arr: np.ndarray, n: int, default: float) -> float:
    """``arr[n]``, or ``default`` when the field is absent (empty) or the entry is NaN."""
    if len(arr) == 0:
        return default
    v = arr[n]
    return default if math.isnan(v) else v


def _np_maximum(a: float, b: float) -> float:
    """``np.maximum(a, b)`` for two floats: a NaN on either side is the answer."""
    return a if (a >= b or math.isnan(a)) else b


def _node_block(rows: np.ndarray, cols: np.ndarray, nodes: np.ndarray, aux: np.ndarray,
                request: np.ndarray, cpu_nz: float, gpu_request: float, frag_removed: np.ndarray,
                node_cpu: np.ndarray, node_mem: np.ndarray, cpu_used: np.ndarray, mem_used: np.ndarray,
                cpu_trend: np.ndarray, mem_trend: np.ndarray, overloaded: np.ndarray,
                log_overloads: np.ndarray, log_ooms: np.ndarray, same: np.ndarray,
                cpu_mean_f: np.ndarray, cpu_std_f: np.ndarray, mem_mean_f: np.ndarray,
                cpu_peak_f: np.ndarray, mem_peak_f: np.ndarray,
                exp_cpu_num: float, exp_mem_num: float, hot: float, milli_per_gpu: float,
                max_spec_cpu: float, max_spec_gpu: float) -> None:
    """``rows[i, cols[j]]`` = the block's column ``j`` of candidate ``i`` (node ``nodes[i]``).

    ``exp_cpu_num`` / ``exp_mem_num`` are the pod's expected use before the division by the node's
    capacity (``cpu_nonzero * ratio``); ``same`` the node's pods of the pod's GPU tag (zeros for a
    pod without GPUs); absent telemetry fields are empty arrays."""
    b = np.empty(N_BLOCK)
    for i in range(len(nodes)):
        n = nodes[i]
        cap_cpu, cap_mem = aux[_CAP_CPU, i], aux[_CAP_MEM, i]
        for j in range(5):  # cpu/mem/gpu/io/net_after
            b[j] = (aux[j, i] - request[j]) / aux[5 + j, i]
        b[5] = frag_removed[i] / milli_per_gpu
        b[6] = (0.5 * (aux[_CPU_LEFT, i] - cpu_nz)) / max_spec_cpu \
            + (0.5 * (aux[_GPU_LEFT, i] - gpu_request)) / max_spec_gpu
        b[7] = abs((1 - b[0]) - (1 - b[1])) / 2
        b[8] = cpu_used[n] / cap_cpu
        b[9] = mem_used[n] / cap_mem
        b[10] = (cpu_trend[n] * 60.0) / cap_cpu
        b[11] = (mem_trend[n] * 60.0) / cap_mem
        b[12] = overloaded[n]
        b[13] = log_overloads[i]
        b[14] = log_ooms[i]
        s = float(same[i])
        b[15] = s / aux[_N_TAGGED, i]
        b[16] = (aux[_TAGGED, i] - s) / aux[_N_TAGGED, i]
        # node_load: the windowed figures with their fallbacks
        c = float(node_cpu[n])
        cpu_now = cpu_used[n] / c if c > 0 else 0.0
        m = float(node_mem[n])
        mem_now = mem_used[n] / m if m > 0 else 0.0
        cpu_mean = _fallback(cpu_mean_f, n, cpu_now)
        mem_mean = _fallback(mem_mean_f, n, mem_now)
        cpu_std = _fallback(cpu_std_f, n, 0.0)
        cpu_peak = _np_maximum(_fallback(cpu_peak_f, n, cpu_mean), cpu_mean)
        mem_peak = _np_maximum(_fallback(mem_peak_f, n, mem_mean), mem_mean)
        exp_cpu = exp_cpu_num / cap_cpu
        exp_mem = exp_mem_num / cap_mem
        b[17] = cpu_mean
        b[18] = cpu_peak
        b[19] = cpu_mean + cpu_std
        b[20] = mem_mean
        b[21] = mem_peak
        b[22] = hot - (cpu_mean + exp_cpu)
        b[23] = hot - (cpu_peak + exp_cpu)
        b[24] = 1.0 - (mem_peak + exp_mem)
        for j in range(N_BLOCK):
            rows[i, cols[j]] = b[j]


def _gather_columns(nodes: np.ndarray, cached: np.ndarray, version: np.ndarray, rows_c: np.ndarray,
                    aux_c: np.ndarray, node_cpu: np.ndarray, node_mem: np.ndarray, node_gpu: np.ndarray,
                    node_io: np.ndarray, node_net: np.ndarray, cpu_req: np.ndarray, mem_req: np.ndarray,
                    io_req: np.ndarray, net_req: np.ndarray, gpu_free: np.ndarray, tag_pods: np.ndarray,
                    n_pods: np.ndarray, frag_f: np.ndarray, log_pods: np.ndarray, rows_out: np.ndarray,
                    aux_out: np.ndarray, head: int, frag_col: int, pods_col: int, milli_per_gpu: float,
                    max_gpus: float, max_spec_cpu: float, max_spec_mem: float) -> int:
    """``NodeColumnCache.get`` after its frag parts: refresh each candidate whose version moved
    (``_refresh_few``'s scalar operations: the same bits), then copy the cached rows and aux
    columns of ``nodes`` into ``rows_out`` / ``aux_out``. ``frag_f`` is each candidate's FGD
    fragmentation (empty: no model, 0). Returns -1, or, having changed nothing, the pod count of a
    stale node the ``log_pods`` table is too short for."""
    k = len(nodes)
    for i in range(k):
        n = nodes[i]
        if cached[n] != version[n] and n_pods[n] >= len(log_pods):
            return n_pods[n]
    free = np.empty(gpu_free.shape[1], dtype=np.int64)
    for i in range(k):
        n = nodes[i]
        if cached[n] != version[n]:
            cap_cpu, cap_mem, n_gpu = float(node_cpu[n]), float(node_mem[n]), float(node_gpu[n])
            gpu_cap = max(n_gpu * milli_per_gpu, 1.0)
            cpu_left = float(node_cpu[n] - cpu_req[n])
            mem_left = float(node_mem[n] - mem_req[n])
            g = 0
            for j in range(gpu_free.shape[1]):  # insertion sort, descending
                f = gpu_free[n, j]
                g += f
                m = j
                while m > 0 and free[m - 1] < f:
                    free[m] = free[m - 1]
                    m -= 1
                free[m] = f
            gpu_left = float(g)
            tagged = 0
            for j in range(tag_pods.shape[1]):
                tagged += tag_pods[n, j]
            disk_io, net = float(node_io[n]), float(node_net[n])
            frag_before = frag_f[i] if len(frag_f) else 0.0
            aux_c[0, n] = cpu_left
            aux_c[1, n] = mem_left
            aux_c[2, n] = gpu_left
            aux_c[3, n] = disk_io - float(io_req[n])
            aux_c[4, n] = net - float(net_req[n])
            aux_c[5, n] = cap_cpu
            aux_c[6, n] = cap_mem
            aux_c[7, n] = gpu_cap
            aux_c[8, n] = _py_max(disk_io, 1.0)
            aux_c[9, n] = _py_max(net, 1.0)
            aux_c[10, n] = float(tagged)
            aux_c[11, n] = float(max(tagged, 1))
            aux_c[12, n] = frag_before
            rows_c[n, 0] = cpu_left / cap_cpu
            rows_c[n, 1] = mem_left / cap_mem
            rows_c[n, 2] = gpu_left / gpu_cap
            rows_c[n, 3] = 1.0 if n_gpu > 0 else 0.0
            rows_c[n, 4] = n_gpu / max_gpus
            rows_c[n, 5] = cap_cpu / max_spec_cpu
            rows_c[n, 6] = cap_mem / max_spec_mem
            for j in range(head - 7):
                rows_c[n, 7 + j] = float(free[j]) / milli_per_gpu
            rows_c[n, frag_col] = frag_before / gpu_cap
            rows_c[n, pods_col] = log_pods[n_pods[n]]
            cached[n] = version[n]
        for j in range(rows_c.shape[1]):
            rows_out[i, j] = rows_c[n, j]
        for j in range(aux_c.shape[0]):
            aux_out[j, i] = aux_c[j, n]
    return -1


def _totals(alive: np.ndarray, cpu_req: np.ndarray, mem_req: np.ndarray, cpu_req_nz: np.ndarray,
            mem_req_nz: np.ndarray, cpu_measured: np.ndarray, mem_measured: np.ndarray, node_cpu: np.ndarray,
            node_mem: np.ndarray, node_gpu: np.ndarray, gpu_free: np.ndarray, out: np.ndarray) -> None:
    """The cluster's integer totals over its alive nodes into ``out`` (``features.TOTALS`` order):
    integers, so any order of addition gives numpy's sums."""
    for j in range(len(out)):
        out[j] = 0
    for n in range(len(alive)):
        if not alive[n]:
            continue
        out[0] += 1
        out[1] += cpu_req[n]
        out[2] += mem_req[n]
        out[3] += node_cpu[n]
        out[4] += node_mem[n]
        out[5] += node_gpu[n]
        for j in range(gpu_free.shape[1]):
            out[6] += gpu_free[n, j]
        if cpu_measured[n]:
            out[7] += cpu_req_nz[n]
            out[9] += 1
        if mem_measured[n]:
            out[8] += mem_req_nz[n]
            out[10] += 1


def _py_max(a: float, b: float) -> float:
    """Python's ``max(a, b)`` of two floats: ``b`` only when it is larger (a NaN ``a`` stays)."""
    return b if b > a else a


KERNEL: Callable[..., None] | None
GATHER: Callable[..., int] | None
TOTALS: Callable[..., None] | None
try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; features.py's numpy forms stand in
    KERNEL = GATHER = TOTALS = None
else:
    # error_model="numpy": a division by zero gives inf or NaN, as numpy's, instead of raising
    _fallback = numba.njit(cache=True, inline="always", error_model="numpy")(_fallback)
    _np_maximum = numba.njit(cache=True, inline="always", error_model="numpy")(_np_maximum)
    _py_max = numba.njit(cache=True, inline="always", error_model="numpy")(_py_max)
    KERNEL = numba.njit(cache=True, error_model="numpy")(_node_block)
    GATHER = numba.njit(cache=True, error_model="numpy")(_gather_columns)
    TOTALS = numba.njit(cache=True)(_totals)
