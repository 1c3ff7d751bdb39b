"""The one feature builder: (cluster state, pod, candidate nodes) -> policy input.

The simulator's Gymnasium environment, the evaluation and the serving extender all call
:meth:`FeatureBuilder.build`, so training and serving cannot drift apart. Features are
scale-free (fractions of a node's capacity or of fixed maximum specs) so that one set of
weights scores clusters of any size and shape. ``FEATURE_SCHEMA_VERSION`` changes
whenever a feature's meaning or order changes; checkpoints record it.

Per candidate node (``NODE_FEATURES``): free CPU/memory/GPU shares, node size, the free
share of each GPU (sorted, descending), what placing the pod would leave, the
fragmentation it would remove (FGD's measure against the training workload's typical
pods, in GPUs), BestFit's leftover, the resulting CPU/memory imbalance, real usage and
its trend, overload/OOM history, disk-I/O and network headroom, and GPU-tag affinity.
Schema 2 adds what predicts trouble online: the windowed mean, peak and risk (mean + one
deviation) of the node's measured use (``node_load``, the load-aware baselines' reading), the
headroom after placement against the hot-node threshold (``HOT_THRESHOLD`` minus the windowed
mean, or peak, plus the pod's *expected* use) and against memory capacity (OOM), and the pods
on the node. Per pod (``POD_FEATURES``): requests, GPU kind, QoS, and its expected use per
request (:func:`expected_use_ratios`: its application's observed ratio where siblings run, else
the cluster's) with a flag saying which. Cluster context (``CONTEXT_FEATURES``): allocation,
fragmentation, spread of utilisation, pending queue, share of feasible nodes, and the
cluster's observed use per request. Where nothing measures use (packing mode, serving without
telemetry) use is requests, the ratios are 1 and the windowed figures are the requested
shares: the same quantities in every mode.

Real use (``cpu_used`` / ``mem_used`` and the ``util_*`` context) is ``state.cpu_used`` /
``state.mem_used`` under the one definition of
:class:`~fedsched.common.model.cluster.ClusterState`: requests where nothing measures a node
(packing mode, serving without telemetry), measured use where something does (replay's usage
model, serving's telemetry). The builder does not change the vector with it; it records which
it had per candidate in ``Features.use_measured`` (not policy input, not in the decision log).

The GPU a sharing pod takes on the chosen node is the one that removes the most
fragmentation (FGD's rule) when typical pods are known, else the best-fitting one; ``build``
computes it for every candidate anyway, so ``select_gpus`` answers from the last build of a pod of
the same shape while the node has not changed (``ClusterState.version``).

Speed (the simulator, evaluation and serving all pay this per decision): the request-determined
node columns are kept per node and recomputed only for nodes whose version moved
(:class:`NodeColumnCache`, in Python scalars for the usual one or two); the columns that move
with the pod or the live signals are written in place into one block. Every value is computed
by the same float64 operations as a fresh builder's, so cached and fresh features are the same
bits. A cluster without GPUs skips the fragmentation model
altogether (:meth:`FeatureBuilder.frag_model`): its fragmentation columns are 0 either way. The
per-pod columns and the windowed load are one compiled loop over the candidates
(``features_kernel``, the same operations on the same operands, so the same bits; the numpy form,
:meth:`FeatureBuilder._block_numpy`, stands in without numba): one path for the simulator, the
evaluation and serving alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsched.common.learning.features_kernel import GATHER, KERNEL, TOTALS
from fedsched.common.model.cluster import MAX_GPUS_PER_NODE, MILLI_PER_GPU, ClusterState, NodeTable, Pod
from fedsched.common.model.fragmentation import (
    FragmentationModel,
    NodeFragCache,
    TypicalPods,
    best_per_node,
    placement_deltas,
)
from fedsched.common.model.load_metrics import LoadMetricsConfig
from fedsched.common.schedulers.base import default_gpu_choice
from fedsched.common.schedulers.best_fit import MAX_SPEC_CPU, MAX_SPEC_GPU
from fedsched.common.schedulers.load_stats import node_load

FEATURE_SCHEMA_VERSION = 2
HOT_THRESHOLD = LoadMetricsConfig().threshold  # the online metrics' hot-node threshold (0.85)
MAX_USE_RATIO = 10.0  # expected use / request is clipped to this
MAX_SPEC_MEM_MIB = 1024.0 * 1024.0  # 1 TiB

NODE_FEATURES = (
    "cpu_free", "mem_free", "gpu_free", "has_gpu", "gpu_count", "cpu_size", "mem_size",
    *(f"gpu_free_{i}" for i in range(MAX_GPUS_PER_NODE)),
    "cpu_after", "mem_after", "gpu_after", "frag_removed", "frag_before", "bestfit_leftover",
    "imbalance_after", "cpu_used", "mem_used", "cpu_trend", "mem_trend", "overloaded",
    "overload_history", "oom_history", "io_after", "net_after", "same_tag", "other_tag",
    "cpu_mean_w", "cpu_peak_w", "cpu_risk", "mem_mean_w", "mem_peak_w", "cpu_headroom_after",
    "cpu_peak_headroom_after", "mem_headroom_after", "pods_on_node",
)
POD_FEATURES = ("cpu", "mem", "num_gpu", "gpu_milli", "is_share", "is_whole", "is_cpu_only",
                "qos_be", "qos_burstable", "qos_ls", "qos_guaranteed", "gpu_constrained",
                "exp_cpu_ratio", "exp_mem_ratio", "app_observed")
CONTEXT_FEATURES = ("alloc_cpu", "alloc_mem", "alloc_gpu", "frag_rate", "util_mean", "util_std",
                    "queue", "feasible_share", "log_nodes", "use_ratio_cpu", "use_ratio_mem")


@dataclass
class Telemetry:
    """Live per-node signals beyond requests (replay's usage model, or Prometheus).

    Trends in milli-CPU and MiB per second; counts are cumulative. A ``ClusterState``
    carries one in ``state.telemetry`` when the source has them.

    Windowed statistics (optional; the load-aware baselines and the policy features read them
    through :func:`fedsched.common.schedulers.load_stats.node_load`): ``cpu_mean`` /
    ``cpu_std`` / ``mem_mean`` / ``mem_std`` are the mean and the standard deviation of the
    node's measured utilisation over a window, as fractions of its capacity, and ``cpu_peak`` /
    ``mem_peak`` its largest sample over the same window (serving: PromQL ``avg_over_time`` /
    ``stddev_over_time`` / ``max_over_time`` of the recording rules over Trimaran's 15-minute
    window, see ``agent/cluster/telemetry.py``; replay: the same statistics of the simulated
    use over ``ReplayConfig.stats_window_s``). ``metrics_age_s`` is how old each node's newest
    sample was at the last refresh, in seconds (``inf``: never seen). A field is None when the
    source has none (packing mode, serving before any telemetry), and an entry is NaN for a node
    the source has no value for; readers then use ``state.cpu_used / capacity`` as the mean and
    the peak, 0 as the deviation, and treat the node's metrics as fresh. Whether
    ``state.cpu_used`` is then measured or the node's requests is ``state.cpu_measured`` /
    ``mem_measured`` (``ClusterState``'s one definition of real use).

    ``queue_len`` counts the pods waiting for a node, the pod being decided included (the
    replay simulator's pending queue, serving's unbound pods); the ``queue`` feature is the
    others, ``log1p(queue_len - 1)``, so packing mode (no telemetry: 0) and a lone pod in
    replay or serving (1) read the same.

    ``app_usage(app)`` (optional) is what the running pods of application ``app`` (a
    ``Pod.app`` code, >= 0) really use relative to their requests, ``(CPU use / CPU request,
    memory use / memory request)`` over those pods (non-zero requests), or None when none of
    them runs or is measured (replay: the usage model's current use; serving: per-pod container
    metrics). The features use it to predict a new pod's use from its siblings'.
    """

    cpu_trend: np.ndarray
    mem_trend: np.ndarray
    overloaded: np.ndarray
    overload_count: np.ndarray
    oom_count: np.ndarray
    queue_len: int = 0
    cpu_mean: np.ndarray | None = None
    cpu_std: np.ndarray | None = None
    mem_mean: np.ndarray | None = None
    mem_std: np.ndarray | None = None
    metrics_age_s: np.ndarray | None = None
    cpu_peak: np.ndarray | None = None
    mem_peak: np.ndarray | None = None
    app_usage: Callable[[int], tuple[float, float] | None] | None = None
    peak_fn: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None

    def peaks(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(cpu_peak, mem_peak)``: from ``peak_fn`` when the source computes them on demand
        (the replay simulator), else the fields (serving)."""
        return self.peak_fn() if self.peak_fn is not None else (self.cpu_peak, self.mem_peak)

    @classmethod
    def zeros(cls, n: int) -> Telemetry:
        """No signal: zero trends and counts, no windowed statistics (None)."""
        z = np.zeros(n)
        return cls(z, z, z, z, z, 0)


@dataclass
class Features:
    nodes: np.ndarray  # float32 [K, len(NODE_FEATURES)]
    pod: np.ndarray  # float32 [len(POD_FEATURES)]
    context: np.ndarray  # float32 [len(CONTEXT_FEATURES)]
    # Not policy input: per candidate, whether its cpu_used / mem_used columns were measured use
    # (True) or its requests (False), as ClusterState.cpu_measured & mem_measured; None if unknown.
    use_measured: np.ndarray | None = None


# The integer totals over a cluster's alive nodes (cluster_totals), in order.
TOTALS_FIELDS = ("alive", "cpu_req", "mem_req", "cpu", "mem", "gpu", "gpu_free", "cpu_req_nz_measured",
                 "mem_req_nz_measured", "cpu_measured", "mem_measured")


def cluster_totals(state: ClusterState) -> np.ndarray:
    """The integer totals of ``TOTALS_FIELDS`` over the alive nodes (int64): alive nodes, their
    requests, capacities, GPUs and free GPU milli, and the non-zero requests and the count of the
    alive nodes whose CPU / memory use is measured. Exact, so the compiled pass
    (``features_kernel.TOTALS``) and numpy's sums are the same numbers."""
    out = np.zeros(len(TOTALS_FIELDS), dtype=np.int64)
    if TOTALS is not None:
        TOTALS(state.alive, state.cpu_req, state.mem_req, state.cpu_req_nz, state.mem_req_nz,
               state.cpu_measured, state.mem_measured, state.nodes.cpu, state.nodes.mem, state.nodes.gpu,
               state.gpu_free, out)
        return out
    a, nt = state.alive, state.nodes
    cm, mm = state.cpu_measured & a, state.mem_measured & a
    out[:] = (a.sum(), state.cpu_req[a].sum(), state.mem_req[a].sum(), nt.cpu[a].sum(), nt.mem[a].sum(),
              nt.gpu[a].sum(), state.gpu_free[a].sum(), state.cpu_req_nz[cm].sum(),
              state.mem_req_nz[mm].sum(), cm.sum(), mm.sum())
    return out


def cluster_use_ratios(state: ClusterState, totals: np.ndarray | None = None) -> tuple[float, float]:
    """What the measured alive nodes use relative to the non-zero requests counted on them,
    ``(CPU, memory)``; 1.0 for a resource no alive node measures (its use is its requests).
    ``totals``: :func:`cluster_totals` of the state, when the caller has them."""
    t = cluster_totals(state) if totals is None else totals
    out = []
    for used, measured, total, count in ((state.cpu_used, state.cpu_measured, t[7], t[9]),
                                         (state.mem_used, state.mem_measured, t[8], t[10])):
        if count == len(used):  # every node alive and measured: the whole array's sum, the same bits
            use = float(used.sum())
        else:
            use = float(used[measured & state.alive].sum()) if count else 0.0
        out.append(min(use / float(total), MAX_USE_RATIO) if total > 0 else 1.0)
    return out[0], out[1]


def expected_use_ratios(state: ClusterState, pod: Pod, totals: np.ndarray | None = None
                        ) -> tuple[float, float, bool, float, float]:
    """A new pod's expected use relative to its (non-zero) requests, CPU and memory.

    Its application's observed ratio (``telemetry.app_usage``) where its siblings run, else
    the cluster's (:func:`cluster_use_ratios`; ``totals`` as there). Returns ``(cpu, mem, from_app,
    cluster_cpu, cluster_mem)``; ratios are clipped to ``[0, MAX_USE_RATIO]``."""
    cluster_cpu, cluster_mem = cluster_use_ratios(state, totals)
    fn = getattr(state.telemetry, "app_usage", None)
    seen = fn(pod.app) if fn is not None and pod.app >= 0 else None
    if seen is None:
        return cluster_cpu, cluster_mem, False, cluster_cpu, cluster_mem
    cpu, mem = (min(max(float(x), 0.0), MAX_USE_RATIO) for x in seen)
    return cpu, mem, True, cluster_cpu, cluster_mem


# Node feature columns that the node table and the node's requests alone determine: kept per node
# by NodeColumnCache. Every other column depends on the pod or on live signals.
_REQUEST_COLUMNS = ("cpu_free", "mem_free", "gpu_free", "has_gpu", "gpu_count", "cpu_size", "mem_size",
                    *(f"gpu_free_{i}" for i in range(MAX_GPUS_PER_NODE)), "frag_before", "pods_on_node")
_DYNAMIC_COLUMNS = tuple(c for c in NODE_FEATURES if c not in _REQUEST_COLUMNS)
_REQUEST_INDEX = np.array([NODE_FEATURES.index(c) for c in _REQUEST_COLUMNS])
# The same columns as one leading slice and two single columns (NodeColumnCache._refresh_few).
_REQUEST_HEAD = slice(0, len(_REQUEST_COLUMNS) - 2)
_FRAG_BEFORE, _PODS_ON_NODE = NODE_FEATURES.index("frag_before"), NODE_FEATURES.index("pods_on_node")
assert list(_REQUEST_INDEX) == [*range(_REQUEST_HEAD.stop), _FRAG_BEFORE, _PODS_ON_NODE]
# The per-node quantities the dynamic columns are computed from (float64 rows of NodeColumnCache.aux).
# What is left of each resource, then each capacity, in the same order (FeatureBuilder.build divides
# one block by the other).
_AUX = ("cpu_left", "mem_left", "gpu_left", "io_left", "net_left",
        "cap_cpu", "cap_mem", "gpu_cap", "io_cap", "net_cap", "tagged", "n_tagged", "frag_before")
_LEFT, _CAP = slice(0, 5), slice(5, 10)
# The dynamic columns in the order build computes them (resource groups first).
_BLOCK = ("cpu_after", "mem_after", "gpu_after", "io_after", "net_after", "frag_removed", "bestfit_leftover",
          "imbalance_after", "cpu_used", "mem_used", "cpu_trend", "mem_trend", "overloaded",
          "overload_history", "oom_history", "same_tag", "other_tag", "cpu_mean_w", "cpu_peak_w", "cpu_risk",
          "mem_mean_w", "mem_peak_w", "cpu_headroom_after", "cpu_peak_headroom_after", "mem_headroom_after")
assert sorted(_BLOCK) == sorted(_DYNAMIC_COLUMNS)
_BLOCK_INDEX = np.array([NODE_FEATURES.index(c) for c in _BLOCK])


SCALAR_REFRESH_MAX = 4  # up to this many changed nodes: their columns are recomputed in Python scalars


class NodeColumnCache:
    """The request-determined node feature columns (``_REQUEST_COLUMNS``) and the per-node
    quantities of the others (``_AUX``) for one cluster state, kept across pods.

    Only ``ClusterState.allocate`` / ``release`` change a node's requests, and both move its
    ``state.version``; a node is recomputed when its version moved (the rule of
    :class:`~fedsched.common.model.fragmentation.NodeFragCache`, which this holds for the
    fragmentation parts), and everything when the state changes (``state.serial``). Values are
    computed elementwise exactly as for a cold cache, so a warm cache gives the same bits; a few
    changed nodes (a bind or a departure since the last pod, the usual case) are recomputed in
    Python floats, IEEE double operations like numpy's float64 ones.
    """

    def __init__(self, fm: FragmentationModel | None) -> None:
        self.fm = fm
        self.frag = NodeFragCache(fm) if fm is not None else None
        self._serial = -1
        self._version = np.zeros(0, dtype=np.int64)
        self._log_pods = np.zeros(0)

    def get(self, state: ClusterState, nodes: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...] | None]:
        """(features [K, len(NODE_FEATURES)] float32, a new array with the request-determined
        columns filled, the others to be written; aux [len(_AUX), K] float64; the
        fragmentation parts ``(idle, cnt, tot, F)`` of ``nodes`` or None without a model)."""
        n = len(state.nodes)
        if self._serial != state.serial or len(self._version) != n:
            self._serial = state.serial
            self._version = np.full(n, -1, dtype=np.int64)
            self._rows = np.zeros((n, len(NODE_FEATURES)), dtype=np.float32)
            self._aux = np.zeros((len(_AUX), n))
        parts = self.frag.get(state, nodes) if self.frag is not None else None
        if GATHER is not None:
            return self._get_compiled(state, nodes, parts)
        at = np.flatnonzero(self._version[nodes] != state.version[nodes])
        if len(at):
            stale = nodes[at]
            frag_before = parts[3][at] if parts is not None else np.zeros(len(at))
            if len(at) > SCALAR_REFRESH_MAX:
                self._refresh(state, stale, frag_before)
            else:
                self._refresh_few(state, stale.tolist(), frag_before.tolist())
        return self._rows.take(nodes, axis=0), self._aux.take(nodes, axis=1), parts

    def _get_compiled(self, state: ClusterState, nodes: np.ndarray, parts: tuple[np.ndarray, ...] | None
                      ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...] | None]:
        """:meth:`get`'s refresh and copy in one compiled pass (``features_kernel.GATHER``)."""
        k, nt = len(nodes), state.nodes
        rows, aux = np.empty((k, len(NODE_FEATURES)), dtype=np.float32), np.empty((len(_AUX), k))
        frag_f = parts[3] if parts is not None else _ABSENT
        while True:
            short = GATHER(nodes, self._version, state.version, self._rows, self._aux, nt.cpu, nt.mem, nt.gpu,
                           nt.disk_io, nt.net, state.cpu_req, state.mem_req, state.io_req, state.net_req,
                           state.gpu_free, state.gpu_tag_pods, state.n_pods, frag_f, self._log_pods, rows,
                           aux,
                           _REQUEST_HEAD.stop, _FRAG_BEFORE, _PODS_ON_NODE, float(MILLI_PER_GPU),
                           float(MAX_GPUS_PER_NODE), MAX_SPEC_CPU, MAX_SPEC_MEM_MIB)
            if short < 0:
                return rows, aux, parts
            self._pods_column(np.array([short]))  # the log1p table grows; nothing was changed

    def _pods_column(self, n_pods: np.ndarray) -> np.ndarray:
        """``log1p(pods) / 5`` from a table computed by numpy's ``log1p`` (the same bits as numpy's
        ``log1p`` of any slice; libm's, ``math.log1p``, may differ in the last place)."""
        top = int(n_pods.max()) if len(n_pods) else 0
        if top >= len(self._log_pods):
            self._log_pods = np.log1p(np.arange(max(2 * top, 64), dtype=np.float64)) / 5.0
        return self._log_pods[n_pods]

    def _refresh_few(self, state: ClusterState, stale: list[int], frag_before: list[float]) -> None:
        """:meth:`_refresh` one node at a time in Python scalars (the same numbers)."""
        nt = state.nodes
        log_pods = self._pods_column(state.n_pods[stale]).tolist()
        for i, node in enumerate(stale):
            v = int(state.version[node])
            cap_cpu, cap_mem = float(nt.cpu[node]), float(nt.mem[node])
            n_gpu = float(nt.gpu[node])
            gpu_cap = max(n_gpu * MILLI_PER_GPU, 1.0)
            cpu_left = int(nt.cpu[node]) - int(state.cpu_req[node])
            mem_left = float(int(nt.mem[node]) - int(state.mem_req[node]))
            free = state.gpu_free[node].tolist()
            gpu_left = float(sum(free))
            tagged = sum(state.gpu_tag_pods[node].tolist())
            disk_io, net = float(nt.disk_io[node]), float(nt.net[node])
            self._aux[:, node] = (cpu_left, mem_left, gpu_left, disk_io - float(state.io_req[node]),
                                  net - float(state.net_req[node]), cap_cpu, cap_mem, gpu_cap,
                                  max(disk_io, 1.0), max(net, 1.0), tagged, max(tagged, 1), frag_before[i])
            row = self._rows[node]
            row[_REQUEST_HEAD] = (
                cpu_left / cap_cpu, mem_left / cap_mem, gpu_left / gpu_cap, float(n_gpu > 0),
                n_gpu / MAX_GPUS_PER_NODE, cap_cpu / MAX_SPEC_CPU, cap_mem / MAX_SPEC_MEM_MIB,
                *(f / MILLI_PER_GPU for f in sorted(free, reverse=True)),
            )
            row[_FRAG_BEFORE] = frag_before[i] / gpu_cap
            row[_PODS_ON_NODE] = log_pods[i]
            self._version[node] = v

    def _refresh(self, state: ClusterState, s: np.ndarray, frag_before: np.ndarray) -> None:
        nt = state.nodes
        v = state.version[s]
        cap_cpu = nt.cpu[s].astype(np.float64)
        cap_mem = nt.mem[s].astype(np.float64)
        n_gpu = nt.gpu[s].astype(np.float64)
        gpu_cap = np.maximum(n_gpu * MILLI_PER_GPU, 1.0)
        cpu_left = nt.cpu[s] - state.cpu_req[s]
        mem_left = (nt.mem[s] - state.mem_req[s]).astype(np.float64)
        free = state.gpu_free[s]
        gpu_left = free.sum(axis=1).astype(np.float64)
        tagged = state.gpu_tag_pods[s].sum(axis=1)
        disk_io, net = nt.disk_io[s], nt.net[s]
        self._aux[:, s] = (cpu_left, mem_left, gpu_left, disk_io - state.io_req[s], net - state.net_req[s],
                           cap_cpu, cap_mem, gpu_cap, np.maximum(disk_io, 1.0), np.maximum(net, 1.0),
                           tagged, np.maximum(tagged, 1), frag_before)
        cols = [
            cpu_left / cap_cpu, mem_left / cap_mem, gpu_left / gpu_cap, (n_gpu > 0).astype(float),
            n_gpu / MAX_GPUS_PER_NODE, cap_cpu / MAX_SPEC_CPU, cap_mem / MAX_SPEC_MEM_MIB,
            *(-np.sort(-free, axis=1) / MILLI_PER_GPU).T,
            frag_before / gpu_cap, self._pods_column(state.n_pods[s]),
        ]
        self._rows[np.ix_(s, _REQUEST_INDEX)] = np.array(cols, dtype=np.float32).T
        self._version[s] = v


class FeatureBuilder:
    """Builds policy inputs; ``typical`` are the training workload's typical pods."""

    def __init__(self, typical: TypicalPods | None) -> None:
        self.typical = typical
        self._models: dict[int, FragmentationModel] = {}
        self._columns: dict[int, NodeColumnCache] = {}
        # build's FGD GPU pick per candidate of the last sharing pod: (state serial, pod shape,
        # nodes, GPU per node, node versions).
        self._picks: tuple[int, tuple[int, int, int], np.ndarray, np.ndarray, np.ndarray] | None = None
        # the last node table seen, and whether it has GPUs
        self._has_gpus: tuple[NodeTable, bool] | None = None

    def frag_model(self, state: ClusterState) -> FragmentationModel | None:
        """FGD's fragmentation model of the typical pods for this cluster's GPU models; None
        without typical pods, and on a cluster without GPUs, where every node's fragmentation
        and every placement's change of it are 0 (the features are the same bits without it)."""
        if self.typical is None:
            return None
        seen = self._has_gpus
        if seen is None or seen[0] is not state.nodes:
            seen = self._has_gpus = (state.nodes, bool(state.nodes.gpu.any()))
        if not seen[1]:
            return None
        n = len(state.nodes.models)
        if n not in self._models:
            self._models[n] = FragmentationModel(self.typical, n)
        return self._models[n]

    def _column_cache(self, fm: FragmentationModel | None) -> NodeColumnCache:
        cols = self._columns.get(id(fm))
        if cols is None:
            cols = self._columns[id(fm)] = NodeColumnCache(fm)
        return cols

    def pod_features(self, pod: Pod, ratios: tuple[float, float, bool] = (1.0, 1.0, False)) -> np.ndarray:
        """The pod's features; ``ratios`` is :func:`expected_use_ratios`' answer for it."""
        qos = np.zeros(4)
        qos[pod.qos] = 1.0
        return np.array([
            pod.cpu / MAX_SPEC_CPU, pod.mem / MAX_SPEC_MEM_MIB, pod.num_gpu / MAX_GPUS_PER_NODE,
            pod.gpu_milli / MILLI_PER_GPU, float(pod.is_gpu_share),
            float(pod.num_gpu > 0 and not pod.is_gpu_share), float(pod.num_gpu == 0), *qos,
            float(pod.num_gpu > 0 and pod.spec_mask != 0), ratios[0], ratios[1], float(ratios[2]),
        ], dtype=np.float32)

    def build(self, state: ClusterState, pod: Pod, nodes: np.ndarray,
              n_feasible: int | None = None) -> Features:
        """Features of the candidate ``nodes`` (node ids) for ``pod``; live signals beyond
        requests come from ``state.telemetry`` (zeros when it is None)."""
        fm = self.frag_model(state)
        cols = self._column_cache(fm)
        node_feats, aux, parts = cols.get(state, nodes)
        k = len(nodes)
        cpu_left, gpu_left, frag_before = aux[0], aux[2], aux[12]
        if fm is not None:
            rows, gpus, delta, _ = placement_deltas(fm, cpu_left, state.gpu_free[nodes],
                                                    state.nodes.model[nodes], pod.cpu_nonzero, pod.num_gpu,
                                                    pod.gpu_milli, parts=parts)
            frag_removed, best_gpu = best_per_node(k, rows, gpus, delta)
            frag_removed = np.where(np.isfinite(frag_removed), frag_removed, 0.0)
            if pod.is_gpu_share:  # the GPU select_gpus gives the chosen node, while nothing moved
                self._picks = (state.serial, _gpu_key(pod), nodes, best_gpu, state.version[nodes])
        else:
            frag_removed = np.zeros(k)
        tel = state.telemetry or Telemetry.zeros(len(state.nodes))
        same = state.gpu_tag_pods[nodes, pod.gpu_tag] if pod.num_gpu else np.zeros(k)
        totals = cluster_totals(state)
        r_cpu, r_mem, app_seen, cluster_cpu, cluster_mem = expected_use_ratios(state, pod, totals)
        request = np.array([pod.cpu, pod.mem, pod.gpu_request, pod.disk_io, pod.net], dtype=np.float64)
        if KERNEL is not None:
            measured = self._block_compiled(node_feats, state, pod, nodes, aux, request, frag_removed, tel,
                                            same, r_cpu, r_mem)
        else:
            measured = self._block_numpy(node_feats, state, pod, nodes, aux, request, frag_removed, tel,
                                         same, r_cpu, r_mem)
        nt = state.nodes
        n_alive = int(totals[0])
        # All nodes are alive outside the simulator's node churn: a view then, not a copy.
        alive = slice(None) if n_alive == len(nt) else state.alive
        u = state.cpu_used[alive] / nt.cpu[alive]
        gpu_total = float(totals[5]) * MILLI_PER_GPU
        gpu_idle = float(totals[6])
        frag_rate = 0.0
        if fm is not None and gpu_idle > 0 and k:
            # Cluster-wide rate approximated on the candidates (cheap, and what the pod can see).
            frag_rate = float(frag_before.sum() / max(gpu_left.sum(), 1.0))
        context = np.array([
            totals[1] / max(totals[3], 1),
            totals[2] / max(totals[4], 1),
            (gpu_total - gpu_idle) / gpu_total if gpu_total else 0.0,
            frag_rate, *_mean_std(u),
            np.log1p(max(tel.queue_len - 1, 0)),
            (n_feasible if n_feasible is not None else k) / max(n_alive, 1),
            np.log(max(n_alive, 1)) / 10.0, cluster_cpu, cluster_mem,
        ], dtype=np.float32)
        return Features(node_feats, self.pod_features(pod, (r_cpu, r_mem, app_seen)), context, measured)

    @staticmethod
    def _block_numpy(node_feats: np.ndarray, state: ClusterState, pod: Pod, nodes: np.ndarray,
                     aux: np.ndarray, request: np.ndarray, frag_removed: np.ndarray, tel: Telemetry,
                     same: np.ndarray, r_cpu: float, r_mem: float) -> np.ndarray:
        """The columns that depend on the pod or on live signals (``_BLOCK``) written into
        ``node_feats`` by numpy operations; the candidates' ``NodeLoad.measured``."""
        k = len(nodes)
        cpu_left, gpu_left, cap_cpu, cap_mem = aux[0], aux[2], aux[5], aux[6]
        tagged, n_tagged = aux[10], aux[11]
        load = node_load(state, nodes, with_peaks=True)
        exp_cpu = pod.cpu_nonzero * r_cpu / cap_cpu  # the pod's expected use, share of the node
        exp_mem = pod.mem_nonzero * r_mem / cap_mem
        # As rows in _BLOCK's order, written in place (the same operations per element as one
        # expression per column); the rest are the column cache's, already in place.
        b = np.empty((len(_BLOCK), k))
        np.subtract(aux[_LEFT], request[:, None], out=b[0:5])  # cpu/mem/gpu/io/net_after
        np.divide(b[0:5], aux[_CAP], out=b[0:5])
        np.divide(frag_removed, MILLI_PER_GPU, out=b[5])
        b[6] = (0.5 * (cpu_left - pod.cpu_nonzero) / MAX_SPEC_CPU
                + 0.5 * (gpu_left - pod.gpu_request) / MAX_SPEC_GPU)
        b[7] = np.abs((1 - b[0]) - (1 - b[1])) / 2
        np.divide(state.cpu_used[nodes], cap_cpu, out=b[8])
        np.divide(state.mem_used[nodes], cap_mem, out=b[9])
        np.multiply(tel.cpu_trend[nodes], 60.0, out=b[10])
        b[10] /= cap_cpu
        np.multiply(tel.mem_trend[nodes], 60.0, out=b[11])
        b[11] /= cap_mem
        b[12] = tel.overloaded[nodes]
        b[13] = np.log1p(tel.overload_count[nodes])
        b[14] = np.log1p(tel.oom_count[nodes])
        np.divide(same, n_tagged, out=b[15])
        np.divide(tagged - same, n_tagged, out=b[16])
        b[17], b[18] = load.cpu_mean, load.cpu_peak
        np.add(load.cpu_mean, load.cpu_std, out=b[19])
        b[20], b[21] = load.mem_mean, load.mem_peak
        np.add(load.cpu_mean, exp_cpu, out=b[22])
        np.subtract(HOT_THRESHOLD, b[22], out=b[22])
        np.add(load.cpu_peak, exp_cpu, out=b[23])
        np.subtract(HOT_THRESHOLD, b[23], out=b[23])
        np.add(load.mem_peak, exp_mem, out=b[24])
        np.subtract(1.0, b[24], out=b[24])
        node_feats[:, _BLOCK_INDEX] = b.T
        return load.measured

    @staticmethod
    def _block_compiled(node_feats: np.ndarray, state: ClusterState, pod: Pod, nodes: np.ndarray,
                        aux: np.ndarray, request: np.ndarray, frag_removed: np.ndarray, tel: Telemetry,
                        same: np.ndarray, r_cpu: float, r_mem: float) -> np.ndarray:
        """:meth:`_block_numpy` in one compiled loop (``features_kernel``): the same bits."""
        live = state.telemetry  # node_load reads the windowed fields of this, by name, when present
        cpu_peak, mem_peak = live.peaks() if hasattr(live, "peaks") else (None, None)
        nt = state.nodes
        KERNEL(node_feats, _BLOCK_INDEX, nodes, aux, request, float(pod.cpu_nonzero), float(pod.gpu_request),
               frag_removed, nt.cpu, nt.mem, state.cpu_used, state.mem_used,
               _float_array(tel.cpu_trend), _float_array(tel.mem_trend), tel.overloaded,
               np.log1p(tel.overload_count[nodes]), np.log1p(tel.oom_count[nodes]), same,
               _field(live, "cpu_mean"), _field(live, "cpu_std"), _field(live, "mem_mean"),
               _float_array(cpu_peak), _float_array(mem_peak),
               pod.cpu_nonzero * r_cpu, pod.mem_nonzero * r_mem, HOT_THRESHOLD, float(MILLI_PER_GPU),
               MAX_SPEC_CPU, MAX_SPEC_GPU)
        return state.cpu_measured[nodes] & state.mem_measured[nodes]

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        """The GPU(s) for ``pod`` on ``node``: FGD's rule for sharing pods when possible."""
        if pod.is_gpu_share and self.typical is not None:
            g = int(self.build_gpu_choice(state, pod, node))
            if g >= 0:
                return (g,)
        return default_gpu_choice(state, pod, node)

    def build_gpu_choice(self, state: ClusterState, pod: Pod, node: int) -> int:
        """The GPU of ``node`` that removes the most fragmentation for the sharing ``pod`` (-1:
        none fits): :meth:`build`'s pick for it when the last build was of a pod of this shape on
        this state and ``node`` has not changed since (the deltas of a batch agree with one node's
        to their 1e-6 rounding), else computed."""
        picks = self._picks
        if picks is not None and picks[0] == state.serial and picks[1] == _gpu_key(pod):
            at = np.flatnonzero(picks[2] == node)
            if len(at) and picks[4][at[0]] == state.version[node]:
                return int(picks[3][at[0]])
        fm = self.frag_model(state)
        assert fm is not None
        one = np.array([node])
        rows, gpus, delta, _ = placement_deltas(fm, state.nodes.cpu[one] - state.cpu_req[one],
                                                state.gpu_free[one], state.nodes.model[one],
                                                pod.cpu_nonzero, pod.num_gpu, pod.gpu_milli)
        return int(best_per_node(1, rows, gpus, delta)[1][0])


_ABSENT = np.zeros(0)


def _float_array(arr: np.ndarray | None) -> np.ndarray:
    """``arr`` as float64 (itself when it is; ``_ABSENT``, empty, when None: the kernel's "no field")."""
    return _ABSENT if arr is None else np.asarray(arr, dtype=np.float64)


def _field(telemetry: object, name: str) -> np.ndarray:
    """A windowed field of ``telemetry`` as :func:`~fedsched.common.schedulers.load_stats.node_load`
    reads it (by name; absent or None: ``_ABSENT``)."""
    return _float_array(getattr(telemetry, name, None))


def _mean_std(u: np.ndarray) -> tuple[float, float]:
    """``(u.mean(), u.std())`` (0, 0 when empty) with numpy's own operations, without its
    per-call argument handling."""
    n = len(u)
    if not n:
        return 0.0, 0.0
    mean = np.add.reduce(u) / n
    x = u - mean
    np.square(x, out=x)
    return float(mean), float(np.sqrt(np.add.reduce(x) / n))


def _gpu_key(pod: Pod) -> tuple[int, int, int]:
    """What FGD's GPU choice depends on of a pod."""
    return (pod.cpu_nonzero, pod.num_gpu, pod.gpu_milli)
