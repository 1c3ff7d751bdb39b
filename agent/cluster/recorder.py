"""The member's recording of its own cluster: a rolling, size-bounded openb-schema trace.

A deployed member judges a candidate model on its own workload (the gate's and the member's
validation twin: :func:`fedsched.common.federation.members.member_from_node_config` reads the
node config's ``nodes-csv`` and ``pods-csv``). :class:`ClusterRecorder` keeps that workload:
it is a :class:`fedsched.agent.cluster.k8s_watch.ClusterSink` (the agent's list + watch feeds it
Node and Pod JSON) and takes Prometheus snapshots
(:class:`fedsched.agent.cluster.telemetry.TelemetrySnapshot`, per-pod use) through
:meth:`ClusterRecorder.apply_telemetry`; :meth:`ClusterRecorder.flush` writes, into its output
directory,

- ``nodes.csv`` (:data:`NODES_FILE`): the node inventory now, in the openb node schema
  (``sn,cpu_milli,memory_mib,gpu,model``: allocatable CPU and memory, GPUs and GPU model as
  :func:`fedsched.agent.cluster.k8s_objects.node_from_json` reads them);
- ``pods.csv`` (:data:`PODS_FILE`): every pod seen (:data:`POD_HEADER`), in the openb pod schema
  ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
  deletion_time,scheduled_time`` (requests as kube-scheduler counts them,
  :func:`~fedsched.agent.cluster.k8s_objects.pod_from_json`; ``gpu_spec`` the pod's GPU models
  joined by ``|``; times in unix seconds) plus what the trace loader reads of a real cluster
  (``app``: the owner, :func:`fedsched.agent.cluster.apps.owner_key` written
  ``namespace/Kind/name``; ``cpu_limit_milli`` / ``memory_limit_mib``, 0 when a container has
  none) and columns the loader ignores: ``node`` (where it was bound), ``uid``, ``gpu_models``
  (every GPU model the pod accepts; ``gpu_spec`` keeps those some node has), the pod's own
  mean measured use ``cpu_use_milli`` / ``memory_use_mib`` over ``use_samples`` Prometheus
  samples, and its application's measured use per request ``app_cpu_use_ratio`` /
  ``app_mem_use_ratio`` (the sum of the measured means of the application's pods over the sum
  of their non-zero requests: the ratio the serving cache's ``Telemetry.app_usage`` and the
  replay usage model's ``app_usage`` report; empty when none was measured);
- ``pods-unloadable.csv``: pods whose GPU models no node of ``nodes.csv`` has (the trace
  loader refuses such a row, so it is kept aside until a node of the model is back);
- ``summary.json``: the counts (pods, live and finished, nodes, skipped objects by kind,
  dropped pods, telemetry samples, flushes).

Times (whole-second API stamps made sub-second by when the recorder saw the change, :func:`refine`).
``creation_time`` is ``metadata.creationTimestamp``; ``scheduled_time`` the
``PodScheduled`` condition's ``lastTransitionTime`` when it is True, else when the recorder
saw ``spec.nodeName`` appear (the creation time for a pod bound when first seen: created with
its node, as a DaemonSet's); ``deletion_time`` when the pod ended (the latest container
``finishedAt`` of a Succeeded/Failed pod, else when that phase was seen) or was deleted (the
DELETED event; a pod missing from a relist, e.g. deleted while the recorder was down, at the
time of that relist), never before its creation. A pod without a deletion time is running or
pending (the replay keeps it to the end).

Durability. Each file is replaced atomically (:func:`fedsched.common.files.atomic_write`:
temporary file, fsync, ``os.replace``); nodes first, then pods. A recorder started on a directory
that holds these files loads them (and the summary's counters) and continues, so a restart,
even a ``kill -9``, loses only what came after the last flush.

Bounds. At most ``max_pods`` pods are kept (:data:`DEFAULT_MAX_PODS`): past it the oldest
finished pods (by deletion time) are dropped first, then the oldest live ones (by creation);
the state may run 10% past the bound between flushes, never the files.

Bad objects. A Node or Pod that cannot be read (missing name, unparsable quantity, a GPU count
past the model's, garbage) is skipped and counted by kind each time it arrives (in a list or a
watch event; ``skipped``: ``nodes``, ``pods``, ``rows`` for unreadable rows of a file loaded at
start), with a warning logged the first time an object is skipped; nothing in the input is fatal.

May import: ``fedsched.common`` (and this sub-package's ``k8s_objects`` and ``apps``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from fedsched.agent.cluster.apps import owner_key
from fedsched.agent.cluster.k8s_objects import (
    GPU_MODEL_ANNOTATION,
    MIB,
    NodeInfo,
    ObjectError,
    node_from_json,
    parse_quantity,
    pod_from_json,
)
from fedsched.common.files import atomic_write
from fedsched.common.model.cluster import (
    DEFAULT_MEMORY_REQUEST_MIB,
    DEFAULT_MILLI_CPU_REQUEST,
    MILLI_PER_GPU,
    QOS_ALIASES,
    QOS_CLASSES,
)

log = logging.getLogger(__name__)

NODES_FILE = "nodes.csv"
PODS_FILE = "pods.csv"
UNLOADABLE_FILE = "pods-unloadable.csv"
SUMMARY_FILE = "summary.json"
DEFAULT_MAX_PODS = 20_000
MAX_TRACE_GPU_MODELS = 62  # the trace loader's limit (common/model/traces.py load_nodes)
TERMINAL_PHASES = ("Succeeded", "Failed")
WARNED_KEEP = 10_000  # object keys remembered as already warned about (then the set restarts)

NODE_HEADER = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_HEADER = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
              "creation_time", "deletion_time", "scheduled_time", "app", "cpu_limit_milli",
              "memory_limit_mib", "node", "uid", "gpu_models", "cpu_use_milli", "memory_use_mib",
              "use_samples", "app_cpu_use_ratio", "app_mem_use_ratio")


class RecorderError(ValueError):
    """An output directory the recorder cannot use (the message says why)."""


@dataclass
class PodRecord:
    """What the recorder keeps of one pod (a row of ``pods.csv``)."""

    uid: str
    name: str  # namespace/name
    cpu: int  # milli
    mem: int  # MiB
    num_gpu: int
    gpu_milli: int
    gpu_models: tuple[str, ...]
    qos: int  # index into QOS_CLASSES
    phase: str
    node: str
    creation: float  # unix seconds
    scheduled: float = math.nan
    deletion: float = math.nan
    app: str = ""
    cpu_limit: int = 0
    mem_limit: int = 0
    use_cpu_sum: float = 0.0  # milli-CPU summed over the samples
    use_mem_sum: float = 0.0  # MiB summed over the samples
    use_samples: int = 0

    @property
    def finished(self) -> bool:
        return not math.isnan(self.deletion)

    @property
    def ref(self) -> tuple[str, str]:
        ns, _, name = self.name.partition("/")
        return ns, name


@dataclass
class RecorderCounts:
    """Cumulative counters (kept across restarts through ``summary.json``)."""

    skipped: dict[str, int] = field(default_factory=lambda: {"nodes": 0, "pods": 0, "rows": 0})
    dropped: int = 0  # pods dropped by the size bound
    samples: int = 0  # per-pod use samples taken from Prometheus
    refreshes: int = 0  # telemetry snapshots applied (up)
    flushes: int = 0


# ---- reading Kubernetes objects ------------------------------------------------------------------

def parse_time(value: Any) -> float:
    """An RFC 3339 timestamp (``2026-12-02T15:36:08Z``, fractions and offsets too) in unix seconds;
    NaN when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return math.nan
    try:
        t = datetime.fromisoformat(value.strip().replace("z", "Z")).timestamp()
    except ValueError:
        return math.nan
    return t if math.isfinite(t) else math.nan


def refine(stamp: float, seen: float) -> float:
    """A whole-second API timestamp (``creationTimestamp``, a condition's ``lastTransitionTime``,
    ``finishedAt``: RFC 3339 without fractions) made sub-second by the moment the recorder saw the
    change, where that moment can be its time: ``seen`` within the stamp's second, or just after
    it (the watch delivered it late) clipped to the second's end. The order of the changes within
    one second is then the order the recorder saw them (the API server's), not an arbitrary one:
    a replay that orders a pod's binding and another pod's end within one second wrongly
    schedules on another state (measured: whole seconds alone put 7.5% of a web twin's
    kube-default bindings outside its best-scored nodes). A stamp with a fraction, a missing one
    (NaN), or a change seen more than a second late (a relist after a restart) keep the stamp."""
    if math.isnan(stamp) or not float(stamp).is_integer() or not stamp <= seen < stamp + 2.0:
        return stamp
    return min(seen, stamp + 0.999)


def _limits(obj: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU milli, memory MiB) limits of a pod: every container's limit summed (an init
    container's when larger), plus the overhead; 0 for a resource some container has no limit for."""
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    out = []
    for res, scale in (("cpu", 1000.0), ("memory", 1.0 / MIB)):
        total, known = 0.0, True
        containers = spec.get("containers")
        for c in containers if isinstance(containers, list) else []:
            lim = ((c.get("resources") or {}).get("limits") or {}) if isinstance(c, Mapping) else {}
            if not isinstance(lim, Mapping) or res not in lim:
                known = False
                break
            total += parse_quantity(lim[res], f"limits[{res}]")
        init = spec.get("initContainers")
        for c in init if isinstance(init, list) else []:
            lim = ((c.get("resources") or {}).get("limits") or {}) if isinstance(c, Mapping) else {}
            if isinstance(lim, Mapping) and res in lim:
                total = max(total, parse_quantity(lim[res], f"limits[{res}]"))
        overhead = spec.get("overhead")
        if isinstance(overhead, Mapping) and res in overhead:
            total += parse_quantity(overhead[res], f"overhead[{res}]")
        out.append(math.ceil(total * scale - 1e-9) if known and total > 0 else 0)
    return out[0], out[1]


def _scheduled_at(status: Mapping[str, Any]) -> float:
    conds = status.get("conditions")
    for c in conds if isinstance(conds, list) else []:
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "True":
            return parse_time(c.get("lastTransitionTime"))
    return math.nan


def _finished_at(status: Mapping[str, Any]) -> float:
    """The latest ``finishedAt`` of the pod's terminated containers (NaN when none says)."""
    best = math.nan
    statuses = status.get("containerStatuses")
    for s in statuses if isinstance(statuses, list) else []:
        term = ((s.get("state") or {}).get("terminated") or {}) if isinstance(s, Mapping) else {}
        t = parse_time(term.get("finishedAt")) if isinstance(term, Mapping) else math.nan
        if not math.isnan(t) and (math.isnan(best) or t > best):
            best = t
    return best


def pod_record(obj: Any, now: float) -> PodRecord:
    """The record of a Pod object as first seen at ``now``; :class:`ObjectError` when unreadable."""
    if not isinstance(obj, Mapping):
        raise ObjectError(f"Pod: expected an object, got {type(obj).__name__}")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ObjectError("Pod: metadata is missing")
    name, ns = meta.get("name"), meta.get("namespace") or ""
    if not isinstance(name, str) or not name or not isinstance(ns, str):
        raise ObjectError("Pod: metadata.name is missing")
    uid = meta.get("uid")
    uid = uid if isinstance(uid, str) and uid else f"{ns}/{name}"
    pod = pod_from_json(dict(obj))
    cpu_limit, mem_limit = _limits(obj)
    ann = meta.get("annotations")
    models: tuple[str, ...] = ()
    if pod.num_gpu and isinstance(ann, Mapping) and ann.get(GPU_MODEL_ANNOTATION):
        models = tuple(sorted({m.strip() for m in str(ann[GPU_MODEL_ANNOTATION]).split(",") if m.strip()}))
    created = refine(parse_time(meta.get("creationTimestamp")), now)
    if math.isnan(created):
        raise ObjectError("Pod: metadata.creationTimestamp is missing or unreadable")
    key = owner_key(obj)
    rec = PodRecord(uid=uid, name=f"{ns}/{name}", cpu=pod.cpu, mem=pod.mem, num_gpu=pod.num_gpu,
                    gpu_milli=pod.gpu_milli, gpu_models=models, qos=pod.qos, phase="", node="",
                    creation=created, app="/".join(key) if key else "",
                    cpu_limit=cpu_limit if cpu_limit >= pod.cpu else 0,
                    mem_limit=mem_limit if mem_limit >= pod.mem else 0)
    _update_status(rec, obj, now, first=True)
    return rec


def _update_status(rec: PodRecord, obj: Mapping[str, Any], now: float, first: bool = False) -> None:
    """Phase, node, scheduling and end times from a (newer) Pod object; ``first``: the pod's
    first sight, where a bound pod without a ``PodScheduled`` condition (created with its
    ``spec.nodeName``, no scheduler involved) was bound when it was created."""
    spec = obj.get("spec")
    status = obj.get("status")
    spec = spec if isinstance(spec, Mapping) else {}
    status = status if isinstance(status, Mapping) else {}
    phase = status.get("phase")
    if isinstance(phase, str) and phase:
        rec.phase = phase
    node = spec.get("nodeName")
    if isinstance(node, str) and node:
        rec.node = node
        if math.isnan(rec.scheduled):
            at = refine(_scheduled_at(status), now)
            rec.scheduled = max(at if not math.isnan(at) else rec.creation if first else now, rec.creation)
    if rec.phase in TERMINAL_PHASES and not rec.finished:
        at = refine(_finished_at(status), now)
        rec.deletion = max(at if not math.isnan(at) else now, rec.creation)


def node_record(obj: Any) -> NodeInfo:
    """The node of a Node object, refused (:class:`ObjectError`) when the trace loader could not
    take it (no CPU or memory)."""
    info = node_from_json(obj)
    if info.cpu <= 0 or info.mem <= 0:
        raise ObjectError(f"node {info.name}: no allocatable CPU or memory")
    return info


# ---- the CSV rows ----------------------------------------------------------------------------------

def _num(x: float) -> str:
    if math.isnan(x):
        return ""
    return str(int(x)) if float(x).is_integer() else format(x, ".17g")


def _float(s: str) -> float:
    s = s.strip()
    if not s:
        return math.nan
    v = float(s)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"not a finite non-negative number: {s!r}")
    return v


def _int(s: str) -> int:
    v = _float(s)
    if math.isnan(v) or v != int(v):
        raise ValueError(f"not an integer: {s!r}")
    return int(v)


def record_from_row(row: Mapping[str, str]) -> PodRecord:
    """A pod record back from its ``pods.csv`` row (ValueError/KeyError when unreadable)."""
    qos = QOS_ALIASES.get(row["qos"].strip().lower())
    if qos is None:
        raise ValueError(f"unknown QoS {row['qos']!r}")
    uid, name = row["uid"].strip(), row["name"].strip()
    if not uid or not name:
        raise ValueError("empty uid or name")
    samples = _int(row.get("use_samples") or "0")
    cpu_use, mem_use = _float(row.get("cpu_use_milli") or ""), _float(row.get("memory_use_mib") or "")
    rec = PodRecord(
        uid=uid, name=name, cpu=_int(row["cpu_milli"]), mem=_int(row["memory_mib"]),
        num_gpu=_int(row["num_gpu"]), gpu_milli=_int(row["gpu_milli"]),
        gpu_models=tuple(m for m in (row.get("gpu_models") or row.get("gpu_spec") or "").split("|") if m),
        qos=qos, phase=row.get("pod_phase", ""), node=row.get("node", ""),
        creation=_float(row["creation_time"]), scheduled=_float(row.get("scheduled_time", "")),
        deletion=_float(row.get("deletion_time", "")), app=row.get("app", ""),
        cpu_limit=_int(row.get("cpu_limit_milli") or "0"), mem_limit=_int(row.get("memory_limit_mib") or "0"),
        use_cpu_sum=(0.0 if math.isnan(cpu_use) else cpu_use) * samples,
        use_mem_sum=(0.0 if math.isnan(mem_use) else mem_use) * samples, use_samples=samples)
    if math.isnan(rec.creation):
        raise ValueError("no creation time")
    _check_loadable(rec)
    return rec


def _check_loadable(rec: PodRecord) -> None:
    """ValueError for a record the trace loader would refuse (a row edited by hand): GPU asks
    as :func:`fedsched.common.model.traces.load_pods` checks them, times in order, limits."""
    if rec.gpu_milli > MILLI_PER_GPU or (rec.num_gpu > 0) != (rec.gpu_milli > 0):
        raise ValueError(f"GPU ask {rec.num_gpu} x {rec.gpu_milli} milli")
    if rec.num_gpu > 1 and rec.gpu_milli != MILLI_PER_GPU:
        raise ValueError("a multi-GPU pod must take whole GPUs")
    for t in (rec.deletion, rec.scheduled):
        if t < rec.creation:  # NaN compares False
            raise ValueError("a time before the creation time")
    if 0 < rec.cpu_limit < rec.cpu or 0 < rec.mem_limit < rec.mem:
        raise ValueError("a limit below the request")


def node_from_row(row: Mapping[str, str]) -> NodeInfo:
    name = row["sn"].strip()
    if not name:
        raise ValueError("empty node name")
    gpu = _int(row["gpu"])
    info = NodeInfo(name, _int(row["cpu_milli"]), _int(row["memory_mib"]), gpu,
                    row.get("model", "").strip() if gpu else "")
    if info.cpu <= 0 or info.mem <= 0:
        raise ValueError("no CPU or memory")
    return info


def app_ratios(records: Iterable[PodRecord]) -> dict[str, tuple[float, float]]:
    """Per application (its ``app`` text), (CPU, memory) measured use / non-zero request over its
    measured pods: the sums of their mean use over the sums of their non-zero requests."""
    sums: dict[str, list[float]] = {}
    for r in records:
        if not r.app or r.use_samples <= 0:
            continue
        acc = sums.setdefault(r.app, [0.0, 0.0, 0.0, 0.0])
        acc[0] += r.use_cpu_sum / r.use_samples
        acc[1] += r.use_mem_sum / r.use_samples
        acc[2] += r.cpu if r.cpu > 0 else DEFAULT_MILLI_CPU_REQUEST
        acc[3] += r.mem if r.mem > 0 else DEFAULT_MEMORY_REQUEST_MIB
    return {a: (c / cr, m / mr) for a, (c, m, cr, mr) in sums.items()}


def _pod_row(r: PodRecord, models: Iterable[str], ratios: Mapping[str, tuple[float, float]]) -> list[str]:
    cpu_use = r.use_cpu_sum / r.use_samples if r.use_samples else math.nan
    mem_use = r.use_mem_sum / r.use_samples if r.use_samples else math.nan
    app_cpu, app_mem = ratios.get(r.app, (math.nan, math.nan))
    return [r.name, str(r.cpu), str(r.mem), str(r.num_gpu), str(r.gpu_milli), "|".join(models),
            QOS_CLASSES[r.qos], r.phase, _num(r.creation), _num(r.deletion), _num(r.scheduled), r.app,
            str(r.cpu_limit), str(r.mem_limit), r.node, r.uid, "|".join(r.gpu_models), _num(cpu_use),
            _num(mem_use), str(r.use_samples), _num(app_cpu), _num(app_mem)]


def _csv_bytes(header: Iterable[str], rows: Iterable[list[str]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode("utf-8")


def _read_csv(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of a file this recorder wrote; RecorderError when it is not one."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise RecorderError(f"{path} is not a recorder file (no column {', '.join(missing)}); "
                                    f"choose another --out directory or move it away")
            return list(reader)
    except (UnicodeDecodeError, csv.Error) as e:
        raise RecorderError(f"{path} is not a readable CSV file ({e}); choose another --out directory "
                            f"or move it away") from None


# ---- the recorder ----------------------------------------------------------------------------------

class ClusterRecorder:
    """Nodes and pods of a cluster, recorded to ``out_dir`` (see the module docstring).

    ``max_pods`` bounds the pods kept; ``clock`` gives unix seconds (tests pass their own). The
    constructor loads what ``out_dir`` holds (RecorderError when a file there is not the
    recorder's). Thread-safe: the watch, the telemetry thread and the flushing thread share it.
    """

    def __init__(self, out_dir: str | Path, max_pods: int = DEFAULT_MAX_PODS,
                 clock: Callable[[], float] = time.time) -> None:
        if not isinstance(max_pods, int) or max_pods < 1:
            raise RecorderError(f"max_pods must be a positive integer, got {max_pods!r}")
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise RecorderError(f"{self.out_dir} exists and is not a directory")
        self.max_pods = max_pods
        self.clock = clock
        self.lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, PodRecord] = {}
        self.counts = RecorderCounts()
        self.telemetry_error = ""
        self.omitted = 0  # pods written aside at the last flush (pods-unloadable.csv)
        self._warned: set[str] = set()
        self._logged: tuple[str, ...] = ()
        self.loaded = self._load()

    # ---- paths ----
    @property
    def nodes_csv(self) -> Path:
        return self.out_dir / NODES_FILE

    @property
    def pods_csv(self) -> Path:
        return self.out_dir / PODS_FILE

    # ---- start: what is there ----
    def _load(self) -> int:
        """Load the files of a previous run; returns how many pods were loaded."""
        if self.nodes_csv.is_file():
            for row in _read_csv(self.nodes_csv, NODE_HEADER):
                try:
                    info = node_from_row(row)
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.counts.skipped["rows"] += 1
                    continue
                self.nodes[info.name] = info
        for name in (PODS_FILE, UNLOADABLE_FILE):
            path = self.out_dir / name
            if not path.is_file():
                continue
            for row in _read_csv(path, ("uid", *POD_HEADER[:5], "creation_time")):
                try:
                    rec = record_from_row(row)
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.counts.skipped["rows"] += 1
                    continue
                self.pods[rec.uid] = rec
        summary = self.out_dir / SUMMARY_FILE
        if summary.is_file():
            try:
                prev = json.loads(summary.read_text())
                for k, v in (prev.get("skipped") or {}).items():
                    if k in self.counts.skipped and isinstance(v, int):
                        self.counts.skipped[k] += v
                for k in ("dropped", "samples", "refreshes", "flushes"):
                    if isinstance(prev.get(k), int):
                        setattr(self.counts, k, getattr(self.counts, k) + prev[k])
            except (OSError, ValueError, AttributeError):
                log.warning("recorder: %s unreadable; counters start at 0", summary)
        return len(self.pods)

    # ---- skipping ----
    def _skip(self, kind: str, key: str, err: Exception) -> None:
        self.counts.skipped[kind] += 1
        if key not in self._warned:
            if len(self._warned) >= WARNED_KEEP:
                self._warned.clear()
            self._warned.add(key)
            log.warning("recorder: skipped a %s (%s): %s (skipped %s so far: %d)", kind[:-1], key or "?",
                        " ".join(str(err).split())[:300], kind, self.counts.skipped[kind])

    @staticmethod
    def _key(obj: Any) -> str:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping):
            return ""
        return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")[:200]

    # ---- ClusterSink ----
    def replace_all(self, nodes: list[dict], pods: list[dict]) -> None:
        """A full list: the nodes now; every listed pod upserted, and the live recorded pods
        missing from it deleted now (they went while nobody watched)."""
        now = self.clock()
        with self.lock:
            self.nodes = {}
            for obj in nodes:
                self._upsert_node(obj)
            seen = set()
            for obj in pods:
                uid = self._upsert_pod(obj, now)
                if uid is not None:
                    seen.add(uid)
            for uid, rec in self.pods.items():
                if uid not in seen and not rec.finished:
                    rec.deletion = max(now, rec.creation)
            self._bound(slack=True)

    def upsert_node(self, obj: dict) -> None:
        with self.lock:
            self._upsert_node(obj)

    def upsert_nodes(self, objs: list[dict]) -> None:
        with self.lock:
            for obj in objs:
                self._upsert_node(obj)

    def delete_node(self, name: str) -> None:
        with self.lock:
            self.nodes.pop(name, None)

    def upsert_pod(self, obj: dict) -> None:
        now = self.clock()
        with self.lock:
            self._upsert_pod(obj, now)
            self._bound(slack=True)

    def delete_pod(self, uid: str) -> None:
        now = self.clock()
        with self.lock:
            rec = self.pods.get(uid)
            if rec is not None and not rec.finished:
                rec.deletion = max(now, rec.creation)

    def _upsert_node(self, obj: Any) -> None:
        try:
            info = node_record(obj)
        except (ObjectError, ValueError, TypeError, KeyError, AttributeError) as e:
            self._skip("nodes", self._key(obj), e)
            return
        self.nodes[info.name] = info

    def _upsert_pod(self, obj: Any, now: float) -> str | None:
        try:
            new = pod_record(obj, now)
            rec = self.pods.setdefault(new.uid, new)
            if rec is not new and not rec.finished:
                _update_status(rec, obj, now)
        except (ObjectError, ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
            self._skip("pods", self._key(obj), e)
            return None
        return rec.uid

    # ---- bounding ----
    def _bound(self, slack: bool = False) -> None:
        """Drop pods past ``max_pods`` (oldest finished first, then oldest live); with ``slack``
        only once the state is 10% past the bound (amortised: one sort per many inserts)."""
        limit = self.max_pods + (self.max_pods // 10 if slack else 0)
        excess = len(self.pods) - self.max_pods
        if len(self.pods) <= limit or excess <= 0:
            return
        order = sorted(self.pods.values(), key=lambda r: (0, r.deletion, r.creation) if r.finished
                       else (1, r.creation, 0.0))
        for r in order[:excess]:
            del self.pods[r.uid]
        self.counts.dropped += excess

    # ---- telemetry ----
    def apply_telemetry(self, snapshot: Any) -> None:
        """One Prometheus snapshot (``up``, ``pods``: (namespace, pod) -> (cores, bytes)): a use
        sample for every live bound pod it measures (CPU and memory both known)."""
        if not getattr(snapshot, "up", False):
            self.telemetry_error = str(getattr(snapshot, "error", "") or "down")
            return
        pods = getattr(snapshot, "pods", None) or {}
        with self.lock:
            self.counts.refreshes += 1
            self.telemetry_error = str(getattr(snapshot, "pods_error", "") or "")
            if not pods:
                return
            for rec in self.pods.values():
                if rec.finished or not rec.node:
                    continue
                use = pods.get(rec.ref)
                if use is None:
                    continue
                try:
                    cores, nbytes = float(use[0]), float(use[1])
                except (TypeError, ValueError, IndexError):
                    continue
                if not (math.isfinite(cores) and math.isfinite(nbytes)) or cores < 0 or nbytes < 0:
                    continue
                rec.use_cpu_sum += cores * 1000.0
                rec.use_mem_sum += nbytes / MIB
                rec.use_samples += 1
                self.counts.samples += 1

    # ---- writing ----
    def _written_nodes(self) -> list[NodeInfo]:
        """The nodes the trace loader accepts: by name; past its GPU-model limit, the nodes of
        the models after the first :data:`MAX_TRACE_GPU_MODELS` (by name) are left out."""
        nodes = sorted(self.nodes.values(), key=lambda n: n.name)
        models = sorted({n.model for n in nodes if n.gpu and n.model})
        if len(models) > MAX_TRACE_GPU_MODELS:
            keep = set(models[:MAX_TRACE_GPU_MODELS])
            nodes = [n for n in nodes if not (n.gpu and n.model) or n.model in keep]
        return nodes

    def flush(self) -> dict[str, Any]:
        """Write the files (atomically, nodes first) and return the summary written."""
        with self._write_lock:  # one flush at a time: files never go back to an older state
            return self._flush()

    def _flush(self) -> dict[str, Any]:
        with self.lock:
            self._bound()
            nodes = self._written_nodes()
            models = {n.model for n in nodes if n.gpu and n.model}
            records = sorted(self.pods.values(), key=lambda r: (r.creation, r.name, r.uid))
            ratios = app_ratios(records)
            rows, aside = [], []
            for r in records:
                wanted = [m for m in r.gpu_models if m in models]
                if r.num_gpu and r.gpu_models and not wanted:
                    aside.append(_pod_row(r, r.gpu_models, ratios))
                else:
                    rows.append(_pod_row(r, wanted, ratios))
            self.counts.flushes += 1
            self.omitted = len(aside)
            summary = self._summary(len(nodes))
            node_bytes = _csv_bytes(NODE_HEADER, ([n.name, str(n.cpu), str(n.mem), str(n.gpu),
                                                   n.model if n.gpu else ""] for n in nodes))
            pod_bytes = _csv_bytes(POD_HEADER, rows)
            aside_bytes = _csv_bytes(POD_HEADER, aside)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.nodes_csv, node_bytes)
        atomic_write(self.pods_csv, pod_bytes)
        atomic_write(self.out_dir / UNLOADABLE_FILE, aside_bytes)
        atomic_write(self.out_dir / SUMMARY_FILE, (json.dumps(summary, indent=1) + "\n").encode())
        counts = tuple(str(summary[k]) for k in ("nodes", "pods", "live", "finished", "omitted", "skipped",
                                                  "dropped"))
        log.log(logging.INFO if counts != self._logged else logging.DEBUG,
                "recorder: wrote %d nodes, %d pods (%d live, %d finished, %d aside); skipped %s; "
                "dropped %d", summary["nodes"], summary["pods"], summary["live"], summary["finished"],
                summary["omitted"], summary["skipped"], summary["dropped"])
        self._logged = counts  # a flush that changed no count is logged at debug level
        return summary

    def _summary(self, n_nodes: int) -> dict[str, Any]:
        finished = sum(1 for r in self.pods.values() if r.finished)
        c = self.counts
        return {"written_at": self.clock(), "nodes": n_nodes, "pods": len(self.pods) - self.omitted,
                "live": len(self.pods) - finished, "finished": finished, "omitted": self.omitted,
                "max_pods": self.max_pods, "skipped": dict(c.skipped), "dropped": c.dropped,
                "samples": c.samples, "refreshes": c.refreshes, "flushes": c.flushes,
                "telemetry_error": self.telemetry_error}

    def summary(self) -> dict[str, Any]:
        """The counts now (what the next flush would write, less its own count)."""
        with self.lock:
            return self._summary(len(self._written_nodes()))
