"""GPU fragmentation by the FGD definition (Weng et al., USENIX ATC'23).

Upstream semantics (hkust-adsl/kubernetes-scheduler-simulator ``pkg/utils/frag.go``),
re-implemented here in vectorised form:

- **Typical pods** ``M``: task classes keyed by (non-zero CPU request, gpu_milli,
  num_gpu, GPU-model constraint), CPU-only pods included, sorted by popularity
  (count desc, then larger CPU first); classes are taken until they cover 95% of the
  pods (the class that crosses 95% included) and their frequencies renormalised.
  They must come from *training* data only.
- **Node fragmentation** ``F_n(M) = sum_m p_m F_n(m)``: when class ``m`` fits the node
  (GPU model accepted, enough GPUs with free share >= gpu_milli, enough CPU), only the
  GPUs whose free share is smaller than ``m``'s gpu_milli are fragments; otherwise,
  and always for CPU-only classes, all idle GPU of the node is a fragment. Memory is
  not part of the model.
- Cluster fragmentation = ``sum_n F_n``; fragmentation *rate* = fragmented / idle GPU;
  fragment *amount* = fragmented / all GPU.

The identity ``F_n = idle_n - sum_{m fits} p_m * (free GPU share on GPUs >= q_m)``
(since the frequencies sum to 1) lets ``F`` be computed for thousands of hypothetical
node states per pod with a few array operations over the distinct share thresholds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import DEFAULT_MILLI_CPU_REQUEST, MILLI_PER_GPU, ClusterState, PodTable

POPULARITY_THRESHOLD = 0.95


@dataclass(frozen=True)
class TypicalPods:
    """FGD's target workload: GPU task classes and their popularity."""

    cpu: np.ndarray  # int64 non-zero CPU milli
    gpu_milli: np.ndarray  # int64 per-GPU share; 0 for CPU-only classes
    num_gpu: np.ndarray  # int64
    spec_mask: np.ndarray  # int64 accepted models (0 = any)
    freq: np.ndarray  # float64, sums to 1

    def __len__(self) -> int:
        return len(self.freq)

    @classmethod
    def from_pods(cls, pods: PodTable, threshold: float = POPULARITY_THRESHOLD) -> TypicalPods:
        cpu = np.where(pods.cpu > 0, pods.cpu, DEFAULT_MILLI_CPU_REQUEST)
        counts = Counter(zip(cpu.tolist(), pods.gpu_milli.tolist(), pods.num_gpu.tolist(),
                             pods.spec_mask.tolist(), strict=True))
        if not counts:
            raise ValueError("no pods to derive typical pods from")
        # Most popular first; among equal counts the larger request first (upstream order).
        keys = sorted(counts, key=lambda k: (-counts[k], tuple(-x for x in k)))
        total = sum(counts.values())
        kept, cum = [], 0
        for k in keys:
            if cum >= threshold * total:
                break
            kept.append(k)
            cum += counts[k]
        arr = np.array(kept, dtype=np.int64)
        freq = np.array([counts[k] for k in kept], dtype=np.float64) / cum
        return cls(cpu=arr[:, 0], gpu_milli=arr[:, 1], num_gpu=arr[:, 2], spec_mask=arr[:, 3],
                   freq=freq)


class FragmentationModel:
    """Computes ``F_n(M)`` for batches of node states against fixed typical pods."""

    def __init__(self, typical: TypicalPods, n_models: int) -> None:
        self.typical = typical
        gpu = typical.gpu_milli > 0
        self.gpu_classes = np.flatnonzero(gpu)
        self.thresholds, self.class_threshold = np.unique(typical.gpu_milli[gpu],
                                                          return_inverse=True)
        self.cpu = typical.cpu[gpu]
        self.num = typical.num_gpu[gpu]
        self.freq = typical.freq[gpu]
        # type_ok[model + 1, c]: row 0 is "node has no GPU model".
        spec = typical.spec_mask[gpu]
        models = np.arange(-1, n_models)
        bit = (spec[None, :] >> np.maximum(models, 0)[:, None]) & 1
        self.type_ok = (spec[None, :] == 0) | ((models[:, None] >= 0) & (bit == 1))

    def node_frag(self, cpu_left: np.ndarray, gpu_left: np.ndarray,
                  model: np.ndarray) -> np.ndarray:
        """``F`` (milli-GPU) for node states: cpu_left[K], gpu_left[K, G], model[K]."""
        if len(self.freq) == 0:  # no typical GPU pod: F is the idle GPU share (frag_from_parts' idle)
            return gpu_left.sum(axis=1).astype(np.float64)
        return self.frag_from_parts(*self.gpu_parts(gpu_left), cpu_left, model)

    def gpu_parts(self, gpu_left: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(idle[K], cnt[K, J], tot[K, J]): per share threshold ``J``, how many GPUs have at
        least that free share and how much they hold together (``tot`` whole numbers in float64,
        so that :meth:`frag_from_parts` multiplies in BLAS)."""
        idle = gpu_left.sum(axis=1).astype(np.float64)
        # A loop over the (at most 8) GPU slots of [K, J] arrays beats reducing [K, G, J].
        thr = self.thresholds[None, :]
        cnt = np.zeros((len(gpu_left), len(self.thresholds)), dtype=np.int64)
        tot = np.zeros(cnt.shape)
        for g in range(gpu_left.shape[1]):
            col = gpu_left[:, g:g + 1]
            if not col.any():
                continue
            ge = col >= thr
            cnt += ge
            tot += ge * col
        return idle, cnt, tot

    def frag_from_parts(self, idle: np.ndarray, cnt: np.ndarray, tot: np.ndarray, cpu_left: np.ndarray,
                        model: np.ndarray) -> np.ndarray:
        if len(self.freq) == 0:
            return idle
        cnt_ge = cnt[:, self.class_threshold]  # [K, C]
        sum_ge = tot[:, self.class_threshold]
        fits = (cnt_ge >= self.num) & (cpu_left[:, None] >= self.cpu) & self.type_ok.take(model + 1, axis=0)
        return idle - (fits * sum_ge) @ self.freq


def fragmentation_ratio(cpu_free: np.ndarray, cpu_cap: np.ndarray, mem_free: np.ndarray,
                        mem_cap: np.ndarray) -> float:
    """The cluster fragmentation ratio: ``1 - min(a_cpu, a_mem) / max(a_cpu, a_mem)``.

    ``a_r`` is the cluster's available share of resource ``r`` (free / capacity).
    """
    a_cpu = float(cpu_free.sum()) / max(float(cpu_cap.sum()), 1.0)
    a_mem = float(mem_free.sum()) / max(float(mem_cap.sum()), 1.0)
    hi = max(a_cpu, a_mem)
    return 0.0 if hi <= 0 else 1.0 - min(a_cpu, a_mem) / hi


class NodeFragCache:
    """Per-node ``gpu_parts`` and ``F`` of one cluster state, kept across pods.

    Only nodes whose ``state.version`` moved since the last call are recomputed, so scoring
    a pod costs one pass over the nodes that changed instead of over every candidate.
    """

    def __init__(self, fm: FragmentationModel) -> None:
        self.fm = fm
        self._state_serial = -1
        self._version = np.zeros(0, dtype=np.int64)

    def get(self, state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, ...]:
        """(idle, cnt, tot, F) of ``nodes`` now."""
        n = len(state.nodes)
        if self._state_serial != state.serial or len(self._version) != n:
            self._state_serial = state.serial
            self._version = np.full(n, -1, dtype=np.int64)
            j = len(self.fm.thresholds)
            self._idle, self._f = np.zeros(n), np.zeros(n)
            self._cnt, self._tot = np.zeros((n, j), np.int64), np.zeros((n, j))
        stale = nodes[self._version[nodes] != state.version[nodes]]
        if len(stale):
            idle, cnt, tot = self.fm.gpu_parts(state.gpu_free[stale])
            self._idle[stale], self._cnt[stale], self._tot[stale] = idle, cnt, tot
            cpu_left = state.nodes.cpu[stale] - state.cpu_req[stale]
            self._f[stale] = self.fm.frag_from_parts(idle, cnt, tot, cpu_left, state.nodes.model[stale])
            self._version[stale] = state.version[stale]
        return self._idle[nodes], self._cnt[nodes], self._tot[nodes], self._f[nodes]


def placement_deltas(fm: FragmentationModel, cpu_left: np.ndarray, free: np.ndarray, model: np.ndarray,
                     pod_cpu: int, num_gpu: int, gpu_milli: int,
                     parts: tuple[np.ndarray, ...] | None = None,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fragmentation removed by placing a pod, per candidate placement.

    Inputs are the candidate nodes' states (``cpu_left[K]``, ``free[K, G]``, ``model[K]``)
    and the pod (non-zero CPU, GPU count and share). Returns ``(rows, gpus, delta)``:
    candidate ``i`` puts the pod on node ``rows[i]`` (GPU ``gpus[i]`` for a sharing pod,
    -1 otherwise) and changes ``F`` by ``-delta[i]`` (positive delta: less fragmentation).
    A sharing pod has one candidate per distinct free share among the node's fitting
    GPUs (equal shares give equal results; the lowest index stands for them), in node
    order then GPU index order. Whole-GPU pods take fully free GPUs (which ones does not
    change ``F``); CPU-only pods change only the CPU left. The fourth array is ``F`` of each
    node now. ``parts`` may pass ``(idle, cnt, tot, F)`` of the nodes from a
    :class:`NodeFragCache` instead of recomputing them.
    """
    if parts is None:
        idle, cnt, tot = fm.gpu_parts(free)
        before = fm.frag_from_parts(idle, cnt, tot, cpu_left, model)
    else:
        idle, cnt, tot, before = parts
    cpu_after = cpu_left - pod_cpu
    thr = fm.thresholds[None, :]
    share = num_gpu == 1 and gpu_milli < MILLI_PER_GPU
    if not share:
        # Whole GPUs are fully free GPUs: each counts at every threshold (all <= 1000).
        take = num_gpu * MILLI_PER_GPU
        after = fm.frag_from_parts(idle - take, cnt - num_gpu, tot - take, cpu_after, model)
        rows = np.arange(len(free))
        return rows, np.full(len(free), -1), _exact(before - after), before
    rows, gpus = np.nonzero(free >= gpu_milli)  # row-major: node order, then GPU index
    # Keep the first GPU of each (node, free share): unique's return_index is the first occurrence.
    _, first = np.unique(rows * (MILLI_PER_GPU + 1) + free[rows, gpus], return_index=True)
    first.sort()
    rows, gpus = rows[first], gpus[first]
    # GPU (row, gpu) goes from share f to f - q: it leaves the thresholds in (f - q, f].
    f = free[rows, gpus][:, None]
    was, now = f >= thr, (f - gpu_milli) >= thr
    after = fm.frag_from_parts(idle[rows] - gpu_milli, cnt[rows] - was + now,
                               tot[rows] - was * f + now * (f - gpu_milli), cpu_after[rows], model[rows])
    return rows, gpus, _exact(before[rows] - after), before


def _exact(delta: np.ndarray) -> np.ndarray:
    """Drop float noise (F of the same state computed in batches of different sizes can
    differ in the last bits): FGD truncates sigmoid(delta) to integers, and a no-change
    delta of -1e-13 would score 49 instead of 50; it would also round to -0.0, which adding 0.0
    makes 0.0, so that the same state gives the same bits however it was batched)."""
    return np.round(delta, 6) + 0.0


def best_per_node(n: int, rows: np.ndarray, gpus: np.ndarray,
                  values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the max of ``values`` over its candidates and the first GPU reaching it."""
    if len(rows) == n and np.array_equal(rows, np.arange(n)):  # one candidate per node
        return values.astype(np.float64), gpus.astype(np.int64)
    best = np.full(n, -np.inf)
    np.maximum.at(best, rows, values)
    at_best = values == best[rows]
    first_rows, first = np.unique(rows[at_best], return_index=True)
    gpu = np.full(n, -1, dtype=np.int64)
    gpu[first_rows] = gpus[at_best][first]
    return best, gpu
