"""The cluster model: node and pod tables, and the mutable allocation state.

Everything is kept as numpy arrays (struct of arrays) so that scoring a pod against
every node of a 1500-node cluster is a handful of vectorised operations.

Units: CPU in milli-cores, memory in MiB, GPU shares in milli-GPU (1000 = one GPU),
disk I/O in MB/s and network in Mbit/s.

GPU semantics (the openb trace's and the FGD simulator's): a node has ``gpu`` GPUs of 1000
milli each; a pod with ``num_gpu == 1`` and ``gpu_milli < 1000`` shares one GPU; a pod
with ``num_gpu >= 1`` and ``gpu_milli == 1000`` takes whole GPUs; ``gpu_spec``
restricts the GPU models a pod accepts (empty: any).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedsched.common.model.fit_kernel import FIT_KERNEL

MILLI_PER_GPU = 1000
MAX_GPUS_PER_NODE = 8
# kube-scheduler's GetNonzeroRequests: a container without requests counts as 100m CPU
# and 200 MiB for *scoring* (never for fitting).
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST_MIB = 200
FIT_CACHE_SIZE = 1024  # pod shapes whose feasibility a ClusterState keeps (cleared when full) ...
FIT_CACHE_BYTES = 16 << 20  # ... and no more than this many bytes of them (9 bytes a node)
FIT_SCALAR_MAX = 16  # up to this many changed nodes: feasible() checks them one by one in Python

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
    # Optional: what a real cluster knows about a pod beyond its requests. ``app`` is the
    # application / owner (Deployment, Job, ...) as an int64 code, -1 when unknown (the
    # pod is then an application of its own); the loader numbers codes 0, 1, ... in order
    # of first appearance. ``cpu_limit`` (milli) and ``mem_limit`` (MiB) are the pod's limits, 0
    # when unknown (the replay usage model then uses its QoS class's default limit).
    app: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cpu_limit: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    mem_limit: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Optional: the pod's measured mean use (CPU milli, memory MiB; float64, NaN when not
    # measured), as a recording of a real cluster carries it (``fedsched record``). The replay
    # usage model then runs the pod at this level instead of drawing one.
    cpu_use: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mem_use: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        n = len(self.names)
        if len(self.disk_io) == 0 and n:
            object.__setattr__(self, "disk_io", np.zeros(n))
        if len(self.net) == 0 and n:
            object.__setattr__(self, "net", np.zeros(n))
        if len(self.app) == 0 and n:
            object.__setattr__(self, "app", np.full(n, -1, dtype=np.int64))
        for name in ("cpu_limit", "mem_limit"):
            if len(getattr(self, name)) == 0 and n:
                object.__setattr__(self, name, np.zeros(n, dtype=np.int64))
        for name in ("cpu_use", "mem_use"):
            if len(getattr(self, name)) == 0 and n:
                object.__setattr__(self, name, np.full(n, np.nan))
        for name in ("app", "cpu_limit", "mem_limit", "cpu_use", "mem_use"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"PodTable.{name} has {len(getattr(self, name))} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_request(self) -> np.ndarray:
        """Total milli-GPU requested per pod (num_gpu * gpu_milli)."""
        return self.num_gpu * self.gpu_milli

    @classmethod
    def from_pods(cls, pods: Sequence[Pod], names: Sequence[str] | None = None) -> PodTable:
        """A table of ``pods`` (their requests, QoS, demands, applications and limits; no times,
        no measured use), named ``names`` or by position."""
        def col(attr: str, dtype: type) -> np.ndarray:
            return np.array([getattr(p, attr) for p in pods], dtype=dtype)

        n = len(pods)
        if names is not None and len(names) != n:
            raise ValueError(f"{len(names)} names for {n} pods")
        return cls(
            names=tuple(names) if names is not None else tuple(map(str, range(n))),
            cpu=col("cpu", np.int64), mem=col("mem", np.int64), num_gpu=col("num_gpu", np.int64),
            gpu_milli=col("gpu_milli", np.int64), spec_mask=col("spec_mask", np.int64),
            qos=col("qos", np.int64), creation=np.full(n, np.nan), deletion=np.full(n, np.nan),
            disk_io=col("disk_io", np.float64), net=col("net", np.float64), app=col("app", np.int64),
            cpu_limit=col("cpu_limit", np.int64), mem_limit=col("mem_limit", np.int64),
        )

    def select(self, idx: np.ndarray) -> PodTable:
        idx = np.asarray(idx, dtype=np.int64)
        return PodTable(
            names=tuple(self.names[i] for i in idx),
            cpu=self.cpu[idx], mem=self.mem[idx], num_gpu=self.num_gpu[idx],
            gpu_milli=self.gpu_milli[idx], spec_mask=self.spec_mask[idx], qos=self.qos[idx],
            creation=self.creation[idx], deletion=self.deletion[idx],
            disk_io=self.disk_io[idx], net=self.net[idx],
            app=self.app[idx], cpu_limit=self.cpu_limit[idx], mem_limit=self.mem_limit[idx],
            cpu_use=self.cpu_use[idx], mem_use=self.mem_use[idx],
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
    app: int = -1  # application / owner code in its PodTable, -1 unknown
    cpu_limit: int = 0  # milli, 0 unknown
    mem_limit: int = 0  # MiB, 0 unknown

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
    def many_from_table(cls, pods: PodTable, rows: np.ndarray) -> list[Pod]:
        """``[Pod.from_table(pods, i) for i in rows]``, the columns read once (the same values)."""
        idx = np.asarray(rows, dtype=np.int64)
        cols = [getattr(pods, k)[idx].tolist() for k in (
            "cpu", "mem", "num_gpu", "gpu_milli", "spec_mask", "qos", "disk_io", "net", "app", "cpu_limit",
            "mem_limit")]
        return [cls(index=i, cpu=int(c), mem=int(m), num_gpu=int(ng), gpu_milli=int(gm),
                    spec_mask=int(sm), qos=int(q), disk_io=float(d), net=float(nw), app=int(a),
                    cpu_limit=int(cl), mem_limit=int(ml))
                for i, c, m, ng, gm, sm, q, d, nw, a, cl, ml in zip(idx.tolist(), *cols, strict=True)]

    @classmethod
    def from_table(cls, pods: PodTable, i: int) -> Pod:
        return cls(
            index=i, cpu=int(pods.cpu[i]), mem=int(pods.mem[i]), num_gpu=int(pods.num_gpu[i]),
            gpu_milli=int(pods.gpu_milli[i]), spec_mask=int(pods.spec_mask[i]),
            qos=int(pods.qos[i]), disk_io=float(pods.disk_io[i]), net=float(pods.net[i]),
            app=int(pods.app[i]), cpu_limit=int(pods.cpu_limit[i]), mem_limit=int(pods.mem_limit[i]),
        )


_STATE_SERIAL = itertools.count()


USE_REQUESTS = "requests"
USE_MEASURED = "measured"
USE_SOURCES = (USE_REQUESTS, USE_MEASURED)


class ClusterState:
    """Requested resources per node and free share per GPU; the simulator mutates it.

    ``gpu_free[n, g]`` is the free milli-GPU of GPU ``g`` on node ``n``; slots past the
    node's GPU count hold 0, which no request (always >= 1 milli) can use, so padded
    slots never count as free or as fragments.

    **A node's real use** (``cpu_used`` milli-CPU, ``mem_used`` MiB; the one definition every
    mode shares, the policy's ``cpu_used`` / ``mem_used`` features and the load-aware scorers
    read it): the best known value of what the node's pods really use *now*, per node and per
    resource from one of two sources:

    - *requests* (``cpu_measured[n]`` / ``mem_measured[n]`` False): nothing measures the node,
      so its use **is the sum of the requests** (``Pod.cpu`` / ``Pod.mem``, not the non-zero
      scoring defaults) of the pods counted on it; :meth:`allocate` and :meth:`release` keep it
      so. Packing mode (``fedsched.common.sim.packing``) and serving without telemetry
      (``agent/cluster/cache.py``) are this case, so they hand the policy the same number.
    - *measured* (the flag True): a measurement source sets the value and ``allocate`` /
      ``release`` leave it alone: replay's usage model (``fedsched.common.sim.replay.usage``:
      the running pods' use, CPU clipped at capacity, a bound pod adds nothing until it starts)
      and serving with telemetry (the Prometheus recording rules' ratio x allocatable, set with
      :meth:`set_measured_use`; a node or resource Prometheus has no value for stays on requests).

    ``use_source`` (the constructor argument) sets the flags of every node: ``"requests"`` or
    ``"measured"`` (the default, for a caller that writes ``cpu_used`` itself and wants it left
    alone; the replay simulator passes it explicitly). :attr:`real_use` says whether every alive
    node is measured; the feature builder records the flags of the candidates in
    ``Features.use_measured``.
    """

    def __init__(self, nodes: NodeTable, use_source: str = USE_MEASURED) -> None:
        if use_source not in USE_SOURCES:
            raise ValueError(f"use_source must be one of {', '.join(USE_SOURCES)}, got {use_source!r}")
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
        # (fragmentation, feature columns, feasible(), kube-default's scores) recompute only the
        # nodes whose version moved. Code that writes the request or GPU arrays directly must
        # bump it too.
        self.version = np.zeros(n, dtype=np.int64)
        # Pods per node by GPU tag (GpuClustering's affinity): column 0 counts GPU-sharing
        # pods ("share-gpu"), column k pods taking k whole GPUs ("k-gpu").
        self.gpu_tag_pods = np.zeros((n, MAX_GPUS_PER_NODE + 1), dtype=np.int64)
        self.n_pods = np.zeros(n, dtype=np.int64)  # pods counted on each node (allocate - release)
        # Live signals beyond requests (a features.Telemetry: usage trends, overload and OOM
        # history, queue length), set by the replay simulator or by serving; None otherwise.
        self.telemetry = None
        # Real use (see the class docstring for the one definition): requests, or measured.
        self.cpu_used = np.zeros(n, dtype=np.float64)
        self.mem_used = np.zeros(n, dtype=np.float64)
        measured = use_source == USE_MEASURED
        self.cpu_measured = np.full(n, measured, dtype=bool)
        self.mem_measured = np.full(n, measured, dtype=bool)
        # feasible()'s answers per pod shape, with the node versions they were computed at.
        self._fit_cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def __setstate__(self, d: dict) -> None:
        # A deep copy or an unpickled state is another state: a serial of its own (a cache keyed
        # on the original's would give the copy's diverging nodes the original's answers, and a
        # serial from another process may name one of this process's states) and no cache.
        self.__dict__.update(d)
        self.serial = next(_STATE_SERIAL)
        self._fit_cache = {}

    #: The per-node arrays besides ``version`` (what :meth:`copy` and :meth:`sync_rows` carry).
    ROW_FIELDS = ("cpu_req", "mem_req", "cpu_req_nz", "mem_req_nz", "io_req", "net_req", "gpu_exists",
                  "gpu_free", "alive", "gpu_tag_pods", "n_pods", "cpu_used", "mem_used", "cpu_measured",
                  "mem_measured")

    def copy(self) -> ClusterState:
        c = ClusterState.__new__(ClusterState)
        c.nodes = self.nodes
        c.serial = next(_STATE_SERIAL)
        for k in (*self.ROW_FIELDS, "version"):
            setattr(c, k, getattr(self, k).copy())
        c.telemetry = self.telemetry
        c._fit_cache = {}
        return c

    def sync_rows(self, src: ClusterState, rows: np.ndarray) -> None:
        """Make nodes ``rows`` of this state equal to ``src``'s (same nodes) and move their
        ``version`` (this state's own counter, so caches keyed on this state recompute exactly
        those nodes); ``alive`` and ``telemetry`` are taken whole."""
        if src.nodes is not self.nodes:
            raise ValueError("sync_rows needs a state of the same node table")
        for k in self.ROW_FIELDS:
            getattr(self, k)[rows] = getattr(src, k)[rows]
        self.alive[:] = src.alive
        self.telemetry = src.telemetry
        self.version[rows] += 1

    # ---- real use ------------------------------------------------------------------
    @property
    def real_use(self) -> bool:
        """True when every alive node's CPU and memory use is measured (no request stands in)."""
        a = self.alive
        return bool(self.cpu_measured[a].all() and self.mem_measured[a].all())

    @property
    def use_source(self) -> str:
        """``"requests"`` (no alive node measured), ``"measured"`` (all) or ``"mixed"``."""
        a = self.alive
        flags = np.concatenate([self.cpu_measured[a], self.mem_measured[a]])
        if flags.all():
            return USE_MEASURED
        return "mixed" if flags.any() else USE_REQUESTS

    def set_measured_use(self, node: int, cpu: float | None = None, mem: float | None = None) -> None:
        """Set ``node``'s measured CPU (milli) and/or memory (MiB) use; from now on ``allocate`` /
        ``release`` leave that resource's use alone."""
        if cpu is not None:
            self.cpu_used[node] = cpu
            self.cpu_measured[node] = True
        if mem is not None:
            self.mem_used[node] = mem
            self.mem_measured[node] = True

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
    def model_ok(self, pod: Pod, ids: np.ndarray | None = None) -> np.ndarray:
        """Per node (of ``ids``, default all): the pod accepts the node's GPU model."""
        if pod.num_gpu == 0 or pod.spec_mask == 0:
            return np.ones(len(self.nodes) if ids is None else len(ids), dtype=bool)
        m = self.nodes.model if ids is None else self.nodes.model[ids]
        return (m >= 0) & (((pod.spec_mask >> np.maximum(m, 0)) & 1) == 1)

    def feasible(self, pod: Pod, ids: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask of the nodes where ``pod`` fits now (NodeResourcesFit + GPU share); with
        ``ids``, of those nodes only (in their order), which costs a pass over them alone.

        Over all nodes (``ids`` None) the answer is kept per pod shape (:meth:`fit_key`) and
        only the nodes whose ``version`` moved since are checked again (requests and GPU shares
        change only through :meth:`allocate` / :meth:`release`, which move it); ``alive`` is
        applied on every call. The same booleans as a full pass."""
        if ids is None:
            return self._feasible_all(pod)
        return self.alive[ids] & self.fits(pod, ids)

    @staticmethod
    def fit_key(pod: Pod) -> tuple[int, ...]:
        """What feasibility depends on of a pod: two pods with the same key fit the same nodes."""
        if pod.num_gpu == 0:
            return (pod.cpu, pod.mem)
        return (pod.cpu, pod.mem, pod.num_gpu, pod.gpu_milli, pod.spec_mask)

    def fits(self, pod: Pod, ids: np.ndarray | None) -> np.ndarray:
        """Whether ``pod`` fits each node of ``ids`` (all: None) by requests and GPUs, alive or not
        (:meth:`feasible` applies ``alive``). Depends only on what moves a node's ``version``."""
        sel = slice(None) if ids is None else ids
        nt = self.nodes
        ok = ((nt.cpu[sel] - self.cpu_req[sel]) >= pod.cpu) & ((nt.mem[sel] - self.mem_req[sel]) >= pod.mem)
        if pod.num_gpu == 0:
            return ok
        ok &= self.model_ok(pod, ids)
        free = self.gpu_free[sel]
        if pod.is_gpu_share:
            ok &= (free >= pod.gpu_milli).any(axis=1)
        else:
            ok &= (free >= MILLI_PER_GPU).sum(axis=1) >= pod.num_gpu
        return ok

    def _feasible_all(self, pod: Pod) -> np.ndarray:
        cache = self._fit_cache
        key = self.fit_key(pod)
        hit = cache.get(key)
        # Each node's version is read before it is checked: an answer computed while an allocate
        # moves the node is kept under the older version and checked again next time.
        if hit is None:
            if len(cache) >= min(FIT_CACHE_SIZE, max(1, FIT_CACHE_BYTES // (9 * max(len(self.version), 1)))):
                cache.clear()
            seen = self.version.copy()
            hit = cache[key] = (self.fits(pod, None), seen)
        elif FIT_KERNEL is not None:
            out = np.empty(len(self.version), dtype=bool)
            nt = self.nodes
            FIT_KERNEL(hit[0], hit[1], self.version, self.alive, nt.cpu, self.cpu_req, nt.mem, self.mem_req,
                       nt.model, self.gpu_free, pod.cpu, pod.mem, pod.num_gpu, pod.gpu_milli, pod.spec_mask,
                       pod.is_gpu_share, MILLI_PER_GPU, out)
            return out
        else:
            fits, seen = hit
            stale = np.flatnonzero(seen != self.version)
            if len(stale) > FIT_SCALAR_MAX:
                v = self.version[stale]
                fits[stale] = self.fits(pod, stale)
                seen[stale] = v
            elif len(stale):  # a few nodes changed (a bind, a departure): Python scalars beat numpy calls
                for n in stale.tolist():
                    v = self.version[n]
                    fits[n] = self.fits_one(pod, n)
                    seen[n] = v
        return hit[0] & self.alive

    def fits_one(self, pod: Pod, n: int) -> bool:
        """:meth:`fits` of one node in Python scalars (integer comparisons: the same answer)."""
        nt = self.nodes
        if int(nt.cpu[n]) - int(self.cpu_req[n]) < pod.cpu or int(nt.mem[n]) - int(self.mem_req[n]) < pod.mem:
            return False
        if pod.num_gpu == 0:
            return True
        if pod.spec_mask != 0:
            m = int(nt.model[n])
            if m < 0 or not (pod.spec_mask >> m) & 1:
                return False
        free = self.gpu_free[n].tolist()
        if pod.is_gpu_share:
            return any(f >= pod.gpu_milli for f in free)
        return sum(f >= MILLI_PER_GPU for f in free) >= pod.num_gpu

    _fits = fits  # the names the cache tests use
    _fits_one = fits_one

    # ---- mutation ------------------------------------------------------------------
    def allocate(self, node: int, pod: Pod, gpus: tuple[int, ...]) -> None:
        """Bind ``pod`` to ``node`` using GPU slots ``gpus`` (empty for CPU pods)."""
        self.version[node] += 1
        self.cpu_req[node] += pod.cpu
        self.mem_req[node] += pod.mem
        self.cpu_req_nz[node] += pod.cpu_nonzero
        self.mem_req_nz[node] += pod.mem_nonzero
        # x + 0.0 is x bit for bit (but for -0.0, which a sum of requests never is): skipped.
        if pod.disk_io:
            self.io_req[node] += pod.disk_io
        if pod.net:
            self.net_req[node] += pod.net
        for g in gpus:
            self.gpu_free[node, g] -= pod.gpu_milli
        if pod.num_gpu:
            self.gpu_tag_pods[node, pod.gpu_tag] += 1
        self.n_pods[node] += 1
        if not self.cpu_measured[node]:  # use = requests (class docstring)
            self.cpu_used[node] += pod.cpu
        if not self.mem_measured[node]:
            self.mem_used[node] += pod.mem
        # Only the slots this pod took can have gone below 0.
        if (self.cpu_req[node] > self.nodes.cpu[node] or self.mem_req[node] > self.nodes.mem[node]
                or (gpus and min(self.gpu_free[node].tolist()) < 0)):
            raise AssertionError(f"node {self.nodes.names[node]} over-allocated by pod {pod.index}")

    def release(self, node: int, pod: Pod, gpus: tuple[int, ...]) -> None:
        """Undo ``allocate`` (pod completion, eviction or OOM kill)."""
        self.version[node] += 1
        self.cpu_req[node] -= pod.cpu
        self.mem_req[node] -= pod.mem
        self.cpu_req_nz[node] -= pod.cpu_nonzero
        self.mem_req_nz[node] -= pod.mem_nonzero
        if pod.disk_io:
            self.io_req[node] -= pod.disk_io
        if pod.net:
            self.net_req[node] -= pod.net
        for g in gpus:
            self.gpu_free[node, g] += pod.gpu_milli
        if pod.num_gpu:
            self.gpu_tag_pods[node, pod.gpu_tag] -= 1
        self.n_pods[node] -= 1
        if not self.cpu_measured[node]:
            self.cpu_used[node] -= pod.cpu
        if not self.mem_measured[node]:
            self.mem_used[node] -= pod.mem
