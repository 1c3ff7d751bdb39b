"""The cluster model: node and pod tables, and the mutable allocation state.

Everything is kept as numpy arrays (struct of arrays) so that scoring a pod against
every node of a 1500-node cluster is a handful of vectorised operations.

Units: CPU in milli-cores, memory in MiB, GPU shares in milli-GPU (1000 = one GPU),
disk I/O in MB/s and network in Mbit/s.

GPU semantics (reference section 4, the openb trace): a node has ``gpu`` GPUs of 1000
milli each; a pod with ``num_gpu == 1`` and ``gpu_milli < 1000`` shares one GPU; a pod
with ``num_gpu >= 1`` and ``gpu_milli == 1000`` takes whole GPUs; ``gpu_spec``
restricts the GPU models a pod accepts (empty: any).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

MILLI_PER_GPU = 1000
MAX_GPUS_PER_NODE = 8
# kube-scheduler's GetNonzeroRequests: a container without requests counts as 100m CPU
# and 200 MiB for *scoring* (never for fitting).
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST_MIB = 200

# QoS classes, lowest priority first. OOM kills the lowest class first.
QOS_CLASSES = ("BE", "Burstable", "LS", "Guaranteed")
QOS_ALIASES = {
    "be": 0, "besteffort": 0,
    "burstable": 1, "": 1,
    "ls": 2, "lsr": 2,
    "guaranteed": 3,
}


@dataclass(frozen=True)
class NodeTable:
    """Static capacities of the nodes of one cluster (index = node id)."""

    names: tuple[str, ...]
    cpu: np.ndarray  # int64 milli
    mem: np.ndarray  # int64 MiB
    gpu: np.ndarray  # int64 number of GPUs
    model: np.ndarray  # int64 index into ``models``, -1 for nodes without GPUs
    models: tuple[str, ...]  # GPU model vocabulary of this cluster
    disk_io: np.ndarray  # float64 MB/s
    net: np.ndarray  # float64 Mbit/s

    def __post_init__(self) -> None:
        n = len(self.names)
        for name in ("cpu", "mem", "gpu", "model", "disk_io", "net"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"NodeTable.{name} has {len(getattr(self, name))} rows, expected {n}")
        if n and int(self.gpu.max()) > MAX_GPUS_PER_NODE:
            raise ValueError(f"a node has more than {MAX_GPUS_PER_NODE} GPUs")

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpu.sum()) * MILLI_PER_GPU

    def select(self, idx: np.ndarray) -> NodeTable:
        """A new table with the rows ``idx`` (for slices of a cluster)."""
        idx = np.asarray(idx)
        return NodeTable(
            names=tuple(self.names[i] for i in idx),
            cpu=self.cpu[idx].copy(), mem=self.mem[idx].copy(), gpu=self.gpu[idx].copy(),
            model=self.model[idx].copy(), models=self.models,
            disk_io=self.disk_io[idx].copy(), net=self.net[idx].copy(),
        )


@dataclass(frozen=True)
class PodTable:
    """A list of pod requests (index = position in the trace file)."""

    names: tuple[str, ...]
    cpu: np.ndarray  # int64 milli
    mem: np.ndarray  # int64 MiB
    num_gpu: np.ndarray  # int64
    gpu_milli: np.ndarray  # int64, share of one GPU (1000 for whole GPUs, 0 for CPU pods)
    spec_mask: np.ndarray  # int64 bit mask over NodeTable.models; 0 = any model
    qos: np.ndarray  # int64 index into QOS_CLASSES
    creation: np.ndarray  # float64 seconds, NaN when unknown
    deletion: np.ndarray  # float64 seconds, NaN when unknown
    # Optional per-pod disk-I/O and network demand (MB/s, Mbit/s); zeros in openb.
    disk_io: np.ndarray = field(default_factory=lambda: np.zeros(0))
    net: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        n = len(self.names)
        if len(self.disk_io) == 0 and n:
            object.__setattr__(self, "disk_io", np.zeros(n))
        if len(self.net) == 0 and n:
            object.__setattr__(self, "net", np.zeros(n))

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_request(self) -> np.ndarray:
        """Total milli-GPU requested per pod (num_gpu * gpu_milli)."""
        return self.num_gpu * self.gpu_milli

    def select(self, idx: np.ndarray) -> PodTable:
        idx = np.asarray(idx, dtype=np.int64)
        return PodTable(
            names=tuple(self.names[i] for i in idx),
            cpu=self.cpu[idx], mem=self.mem[idx], num_gpu=self.num_gpu[idx],
            gpu_milli=self.gpu_milli[idx], spec_mask=self.spec_mask[idx], qos=self.qos[idx],
            creation=self.creation[idx], deletion=self.deletion[idx],
            disk_io=self.disk_io[idx], net=self.net[idx],
        )


@dataclass(frozen=True)
class Pod:
    """One pod request, the unit every scheduler scores."""

    index: int  # row in its PodTable
    cpu: int
    mem: int
    num_gpu: int
    gpu_milli: int
    spec_mask: int
    qos: int
    disk_io: float = 0.0
    net: float = 0.0

    @property
    def cpu_nonzero(self) -> int:
        return self.cpu if self.cpu > 0 else DEFAULT_MILLI_CPU_REQUEST

    @property
    def mem_nonzero(self) -> int:
        return self.mem if self.mem > 0 else DEFAULT_MEMORY_REQUEST_MIB

    @property
    def is_gpu_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def gpu_request(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def gpu_tag(self) -> int:
        """GpuClustering's tag: 0 for a sharing pod, k for k whole GPUs (CPU pods: 0, unused)."""
        return 0 if self.is_gpu_share else self.num_gpu

    @classmethod
    def from_table(cls, pods: PodTable, i: int) -> Pod:
        return cls(
            index=i, cpu=int(pods.cpu[i]), mem=int(pods.mem[i]), num_gpu=int(pods.num_gpu[i]),
            gpu_milli=int(pods.gpu_milli[i]), spec_mask=int(pods.spec_mask[i]),
            qos=int(pods.qos[i]), disk_io=float(pods.disk_io[i]), net=float(pods.net[i]),
        )


_STATE_SERIAL = itertools.count()


class ClusterState:
    """Requested resources per node and free share per GPU; the simulator mutates it.

    ``gpu_free[n, g]`` is the free milli-GPU of GPU ``g`` on node ``n``; slots past the
    node's GPU count hold 0, which no request (always >= 1 milli) can use, so padded
    slots never count as free or as fragments.
    """

    def __init__(self, nodes: NodeTable) -> None:
        self.nodes = nodes
        # Unique per state object (unlike id(), never reused): caches key on it.
        self.serial = next(_STATE_SERIAL)
        n = len(nodes)
        self.cpu_req = np.zeros(n, dtype=np.int64)
        self.mem_req = np.zeros(n, dtype=np.int64)
        self.cpu_req_nz = np.zeros(n, dtype=np.int64)  # non-zero requests, for kube scoring
        self.mem_req_nz = np.zeros(n, dtype=np.int64)
        self.io_req = np.zeros(n, dtype=np.float64)
        self.net_req = np.zeros(n, dtype=np.float64)
        slots = np.arange(MAX_GPUS_PER_NODE)
        self.gpu_exists = slots[None, :] < nodes.gpu[:, None]
        self.gpu_free = np.where(self.gpu_exists, MILLI_PER_GPU, 0).astype(np.int64)
        self.alive = np.ones(n, dtype=bool)
        # Bumped on every allocate/release of a node: caches of per-node derived values
        # (e.g. fragmentation) recompute only the nodes whose version moved.
        self.version = np.zeros(n, dtype=np.int64)
        # Pods per node by GPU tag (GpuClustering's affinity): column 0 counts GPU-sharing
        # pods ("share-gpu"), column k pods taking k whole GPUs ("k-gpu").
        self.gpu_tag_pods = np.zeros((n, MAX_GPUS_PER_NODE + 1), dtype=np.int64)
        # Live signals beyond requests (a features.Telemetry: usage trends, overload and OOM
        # history, queue length), set by the replay simulator or by serving; None otherwise.
        self.telemetry = None
        # Real usage (replay mode's usage model); stays zero in packing mode.
        self.cpu_used = np.zeros(n, dtype=np.float64)
        self.mem_used = np.zeros(n, dtype=np.float64)

    def copy(self) -> ClusterState:
        c = ClusterState.__new__(ClusterState)
        c.nodes = self.nodes
        c.serial = next(_STATE_SERIAL)
        for k in ("cpu_req", "mem_req", "cpu_req_nz", "mem_req_nz", "io_req", "net_req", "gpu_exists",
                  "gpu_free", "alive", "version", "gpu_tag_pods", "cpu_used", "mem_used"):
            setattr(c, k, getattr(self, k).copy())
        c.telemetry = self.telemetry
        return c

    # ---- derived views -------------------------------------------------------------
    @property
    def cpu_free(self) -> np.ndarray:
        return self.nodes.cpu - self.cpu_req

    @property
    def mem_free(self) -> np.ndarray:
        return self.nodes.mem - self.mem_req

    @property
    def gpu_free_total(self) -> np.ndarray:
        return self.gpu_free.sum(axis=1)

    # ---- feasibility ---------------------------------------------------------------
    def model_ok(self, pod: Pod) -> np.ndarray:
        if pod.num_gpu == 0 or pod.spec_mask == 0:
            return np.ones(len(self.nodes), dtype=bool)
        m = self.nodes.model
        return (m >= 0) & (((pod.spec_mask >> np.maximum(m, 0)) & 1) == 1)

    def feasible(self, pod: Pod) -> np.ndarray:
        """Boolean mask of the nodes where ``pod`` fits now (NodeResourcesFit + GPU share)."""
        ok = self.alive & (self.cpu_free >= pod.cpu) & (self.mem_free >= pod.mem)
        if pod.num_gpu == 0:
            return ok
        ok &= self.model_ok(pod)
        if pod.is_gpu_share:
            ok &= (self.gpu_free >= pod.gpu_milli).any(axis=1)
        else:
            ok &= (self.gpu_free >= MILLI_PER_GPU).sum(axis=1) >= pod.num_gpu
        return ok

    # ---- mutation ------------------------------------------------------------------
    def allocate(self, node: int, pod: Pod, gpus: tuple[int, ...]) -> None:
        """Bind ``pod`` to ``node`` using GPU slots ``gpus`` (empty for CPU pods)."""
        self.version[node] += 1
        self.cpu_req[node] += pod.cpu
        self.mem_req[node] += pod.mem
        self.cpu_req_nz[node] += pod.cpu_nonzero
        self.mem_req_nz[node] += pod.mem_nonzero
        self.io_req[node] += pod.disk_io
        self.net_req[node] += pod.net
        for g in gpus:
            self.gpu_free[node, g] -= pod.gpu_milli
        if pod.num_gpu:
            self.gpu_tag_pods[node, pod.gpu_tag] += 1
        if (self.cpu_req[node] > self.nodes.cpu[node] or self.mem_req[node] > self.nodes.mem[node]
                or (self.gpu_free[node] < 0).any()):
            raise AssertionError(f"node {self.nodes.names[node]} over-allocated by pod {pod.index}")

    def release(self, node: int, pod: Pod, gpus: tuple[int, ...]) -> None:
        """Undo ``allocate`` (pod completion, eviction or OOM kill)."""
        self.version[node] += 1
        self.cpu_req[node] -= pod.cpu
        self.mem_req[node] -= pod.mem
        self.cpu_req_nz[node] -= pod.cpu_nonzero
        self.mem_req_nz[node] -= pod.mem_nonzero
        self.io_req[node] -= pod.disk_io
        self.net_req[node] -= pod.net
        for g in gpus:
            self.gpu_free[node, g] += pod.gpu_milli
        if pod.num_gpu:
            self.gpu_tag_pods[node, pod.gpu_tag] -= 1
