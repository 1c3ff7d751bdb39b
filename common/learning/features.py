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
Per pod (``POD_FEATURES``): requests, GPU kind, QoS. Cluster context
(``CONTEXT_FEATURES``): allocation, fragmentation, spread of utilisation, pending queue,
share of feasible nodes.

Real use (``cpu_used`` / ``mem_used`` and the ``util_*`` context) is ``state.cpu_used`` /
``state.mem_used`` under the one definition of
:class:`~fedsched.common.model.cluster.ClusterState`: requests where nothing measures a node
(packing mode, serving without telemetry), measured use where something does (replay's usage
model, serving's telemetry). The builder does not change the vector with it; it records which
it had per candidate in ``Features.use_measured`` (not policy input, not in the decision log).

The GPU a sharing pod takes on the chosen node is the one that removes the most
fragmentation (FGD's rule) when typical pods are known, else the best-fitting one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import MAX_GPUS_PER_NODE, MILLI_PER_GPU, ClusterState, Pod
from fedsched.common.model.fragmentation import (
    FragmentationModel,
    NodeFragCache,
    TypicalPods,
    best_per_node,
    placement_deltas,
)
from fedsched.common.schedulers.base import default_gpu_choice
from fedsched.common.schedulers.best_fit import MAX_SPEC_CPU, MAX_SPEC_GPU

FEATURE_SCHEMA_VERSION = 1
MAX_SPEC_MEM_MIB = 1024.0 * 1024.0  # 1 TiB

NODE_FEATURES = (
    "cpu_free", "mem_free", "gpu_free", "has_gpu", "gpu_count", "cpu_size", "mem_size",
    *(f"gpu_free_{i}" for i in range(MAX_GPUS_PER_NODE)),
    "cpu_after", "mem_after", "gpu_after", "frag_removed", "frag_before", "bestfit_leftover",
    "imbalance_after", "cpu_used", "mem_used", "cpu_trend", "mem_trend", "overloaded",
    "overload_history", "oom_history", "io_after", "net_after", "same_tag", "other_tag",
)
POD_FEATURES = ("cpu", "mem", "num_gpu", "gpu_milli", "is_share", "is_whole", "is_cpu_only",
                "qos_be", "qos_burstable", "qos_ls", "qos_guaranteed", "gpu_constrained")
CONTEXT_FEATURES = ("alloc_cpu", "alloc_mem", "alloc_gpu", "frag_rate", "util_mean", "util_std",
                    "queue", "feasible_share", "log_nodes")


@dataclass
class Telemetry:
    """Live per-node signals beyond requests (replay's usage model, or Prometheus).

    Trends in milli-CPU and MiB per second; counts are cumulative. A ``ClusterState``
    carries one in ``state.telemetry`` when the source has them.

    Windowed statistics (optional, for the load-aware baselines; not policy features):
    ``cpu_mean`` / ``cpu_std`` / ``mem_mean`` / ``mem_std`` are the mean and the standard
    deviation of the node's measured utilisation over a window, as fractions of its capacity
    (serving: PromQL ``avg_over_time`` / ``stddev_over_time`` of the recording rules over
    Trimaran's 15-minute window, see ``agent/cluster/telemetry.py``). ``metrics_age_s`` is how
    old each node's newest sample was at the last refresh, in seconds (``inf``: never seen).
    A field is None when the source has none (packing mode, the replay simulator, serving
    before any telemetry), and an entry is NaN for a node the source has no value for; the
    baselines then use ``state.cpu_used / capacity`` as the mean, 0 as the deviation, and
    treat the node's metrics as fresh. Whether ``state.cpu_used`` is then measured or the
    node's requests is ``state.cpu_measured`` / ``mem_measured`` (``ClusterState``'s one
    definition of real use).
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


class FeatureBuilder:
    """Builds policy inputs; ``typical`` are the training workload's typical pods."""

    def __init__(self, typical: TypicalPods | None) -> None:
        self.typical = typical
        self._models: dict[int, FragmentationModel] = {}
        self._caches: dict[int, NodeFragCache] = {}

    def frag_model(self, state: ClusterState) -> FragmentationModel | None:
        if self.typical is None:
            return None
        n = len(state.nodes.models)
        if n not in self._models:
            self._models[n] = FragmentationModel(self.typical, n)
        return self._models[n]

    def pod_features(self, pod: Pod) -> np.ndarray:
        qos = np.zeros(4)
        qos[pod.qos] = 1.0
        return np.array([
            pod.cpu / MAX_SPEC_CPU, pod.mem / MAX_SPEC_MEM_MIB, pod.num_gpu / MAX_GPUS_PER_NODE,
            pod.gpu_milli / MILLI_PER_GPU, float(pod.is_gpu_share),
            float(pod.num_gpu > 0 and not pod.is_gpu_share), float(pod.num_gpu == 0), *qos,
            float(pod.num_gpu > 0 and pod.spec_mask != 0),
        ], dtype=np.float32)

    def build(self, state: ClusterState, pod: Pod, nodes: np.ndarray,
              telemetry: Telemetry | None = None, n_feasible: int | None = None) -> Features:
        """Features of the candidate ``nodes`` (node ids) for ``pod``."""
        nt = state.nodes
        k = len(nodes)
        cap_cpu = nt.cpu[nodes].astype(np.float64)
        cap_mem = nt.mem[nodes].astype(np.float64)
        n_gpu = nt.gpu[nodes].astype(np.float64)
        gpu_cap = np.maximum(n_gpu * MILLI_PER_GPU, 1.0)
        cpu_left = nt.cpu[nodes] - state.cpu_req[nodes]
        mem_left = (nt.mem[nodes] - state.mem_req[nodes]).astype(np.float64)
        free = state.gpu_free[nodes]
        gpu_left = free.sum(axis=1).astype(np.float64)
        fm = self.frag_model(state)
        if fm is not None:
            model = nt.model[nodes]
            cache = self._caches.setdefault(id(fm), NodeFragCache(fm))
            rows, gpus, delta, frag_before = placement_deltas(fm, cpu_left, free, model, pod.cpu_nonzero,
                                                              pod.num_gpu, pod.gpu_milli,
                                                              parts=cache.get(state, nodes))
            frag_removed, _ = best_per_node(k, rows, gpus, delta)
            frag_removed = np.where(np.isfinite(frag_removed), frag_removed, 0.0)
        else:
            frag_removed = np.zeros(k)
            frag_before = np.zeros(k)
        tel = telemetry or state.telemetry or Telemetry.zeros(len(nt))
        tags = state.gpu_tag_pods[nodes]
        same = tags[:, pod.gpu_tag] if pod.num_gpu else np.zeros(k)
        n_tagged = np.maximum(tags.sum(axis=1), 1)
        f_cpu_after = (cpu_left - pod.cpu) / cap_cpu
        f_mem_after = (mem_left - pod.mem) / cap_mem
        cols = [
            cpu_left / cap_cpu, mem_left / cap_mem, gpu_left / gpu_cap, (n_gpu > 0).astype(float),
            n_gpu / MAX_GPUS_PER_NODE, cap_cpu / MAX_SPEC_CPU, cap_mem / MAX_SPEC_MEM_MIB,
            *(-np.sort(-free, axis=1) / MILLI_PER_GPU).T,
            f_cpu_after, f_mem_after, (gpu_left - pod.gpu_request) / gpu_cap,
            frag_removed / MILLI_PER_GPU, frag_before / gpu_cap,
            0.5 * (cpu_left - pod.cpu_nonzero) / MAX_SPEC_CPU
            + 0.5 * (gpu_left - pod.gpu_request) / MAX_SPEC_GPU,
            np.abs((1 - f_cpu_after) - (1 - f_mem_after)) / 2,
            state.cpu_used[nodes] / cap_cpu, state.mem_used[nodes] / cap_mem,
            tel.cpu_trend[nodes] * 60.0 / cap_cpu, tel.mem_trend[nodes] * 60.0 / cap_mem,
            tel.overloaded[nodes].astype(float),
            np.log1p(tel.overload_count[nodes]), np.log1p(tel.oom_count[nodes]),
            (nt.disk_io[nodes] - state.io_req[nodes] - pod.disk_io) / np.maximum(nt.disk_io[nodes], 1.0),
            (nt.net[nodes] - state.net_req[nodes] - pod.net) / np.maximum(nt.net[nodes], 1.0),
            same / n_tagged, (tags.sum(axis=1) - same) / n_tagged,
        ]
        node_feats = np.ascontiguousarray(np.array(cols, dtype=np.float32).T)
        # All nodes are alive outside the simulator's node churn: a view then, not a copy.
        alive = slice(None) if state.alive.all() else state.alive
        n_alive = len(nt) if isinstance(alive, slice) else int(alive.sum())
        u = state.cpu_used[alive] / nt.cpu[alive]
        gpu_total = float(nt.gpu[alive].sum()) * MILLI_PER_GPU
        gpu_idle = float(state.gpu_free[alive].sum())
        frag_rate = 0.0
        if fm is not None and gpu_idle > 0 and k:
            # Cluster-wide rate approximated on the candidates (cheap, and what the pod can see).
            frag_rate = float(frag_before.sum() / max(gpu_left.sum(), 1.0))
        context = np.array([
            state.cpu_req[alive].sum() / max(nt.cpu[alive].sum(), 1),
            state.mem_req[alive].sum() / max(nt.mem[alive].sum(), 1),
            (gpu_total - gpu_idle) / gpu_total if gpu_total else 0.0,
            frag_rate, float(u.mean()) if len(u) else 0.0, float(u.std()) if len(u) else 0.0,
            np.log1p(tel.queue_len), (n_feasible if n_feasible is not None else k) / max(n_alive, 1),
            np.log(max(n_alive, 1)) / 10.0,
        ], dtype=np.float32)
        measured = state.cpu_measured[nodes] & state.mem_measured[nodes]
        return Features(node_feats, self.pod_features(pod), context, measured)

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        """The GPU(s) for ``pod`` on ``node``: FGD's rule for sharing pods when possible."""
        if pod.is_gpu_share and self.typical is not None:
            g = int(self.build_gpu_choice(state, pod, node))
            if g >= 0:
                return (g,)
        return default_gpu_choice(state, pod, node)

    def build_gpu_choice(self, state: ClusterState, pod: Pod, node: int) -> int:
        fm = self.frag_model(state)
        assert fm is not None
        one = np.array([node])
        rows, gpus, delta, _ = placement_deltas(fm, state.nodes.cpu[one] - state.cpu_req[one],
                                             state.gpu_free[one], state.nodes.model[one],
                                             pod.cpu_nonzero, pod.num_gpu, pod.gpu_milli)
        return int(best_per_node(1, rows, gpus, delta)[1][0])
