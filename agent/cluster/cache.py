"""The serving agent's view of its cluster: the simulator's ``ClusterState``, kept live.

kube-scheduler talks to a ``nodeCacheCapable`` extender with node names only, so the agent
keeps its own state of the cluster in the very structure the simulator uses
(:class:`fedsched.common.model.cluster.ClusterState`): the feature builder then turns (state, pod)
into the policy's input with the same code in training and in serving.

Sources that feed it:

- Kubernetes (``agent/k8s_watch.py``): Node and Pod JSON through :meth:`replace_all`,
  :meth:`upsert_node`, :meth:`delete_node`, :meth:`upsert_pod` and :meth:`delete_pod`. A pod
  counts on its node from the moment it has ``spec.nodeName`` until it is deleted or ends
  (phase Succeeded/Failed), as in kube-scheduler's own cache. A pod on a node the cache does
  not know yet waits and is counted when the node arrives; so does a pod whose Node object is
  deleted under it (:attr:`detached`: a kubelet registers its deleted Node again). A pod
  without ``spec.nodeName`` (not ended) of the scheduler :attr:`queue_scheduler` (None: any) is
  *queued*: their number is ``Telemetry.queue_len``, the policy's ``queue`` feature, as the
  replay simulator's pending queue (the pod being decided included).
- A nodes CSV (openb schema, :meth:`from_csv`) for the local mode, with :meth:`bind` as the
  scheduler's bind verb.
- The agent's own decisions, through :meth:`assume` (as kube-scheduler *assumes* a pod on the
  node it chose before the binding is written): the pod counts on the node the policy picked
  from the moment of the answer, so the next decision sees it, as the simulator's next one does,
  instead of a state that lags by the watch. The pod's watch event confirms it (nothing moves
  then); an event with another node moves it there, one without a node, its deletion or
  :data:`ASSUME_TTL_S` without an event drop it again.
- Telemetry (``agent/telemetry.py``) through :meth:`apply_telemetry`: real CPU and memory use
  set ``state.cpu_used`` / ``state.mem_used`` (measured, per node and resource), and a
  :class:`~fedsched.common.learning.features.Telemetry` (usage trend, overload flag and
  history) computed as the replay simulator computes it, with the windowed statistics the
  load-aware baselines and the policy features read: ``cpu_mean`` / ``cpu_std`` / ``mem_mean``
  / ``mem_std`` / ``cpu_peak`` / ``mem_peak`` (Prometheus' ``avg_over_time`` /
  ``stddev_over_time`` / ``max_over_time`` of the ratios; NaN for a node without them) and
  ``metrics_age_s`` (per node, the age of its newest sample at the last good refresh:
  ``fetched_at - timestamp``; ``inf`` for a node Prometheus never had; None until the first
  good refresh). While Prometheus is down the ages are not refreshed.
- Per-pod use (the snapshot's ``pods``, cAdvisor) through :meth:`apply_telemetry` as
  ``Telemetry.app_usage``: for each application, the CPU use (milli-CPU) and memory working set
  (MiB) summed over its bound pods that Prometheus measures (CPU and memory both known),
  divided by the sums of their non-zero requests (``Pod.cpu_nonzero`` / ``mem_nonzero``), as
  the replay simulator's ``app_usage`` does over its running pods; None for an application
  without such pods. The table is rebuilt at every good refresh and swapped in whole (readers
  need no lock); ``Telemetry.app_usage`` is None until the first good refresh (packing mode's
  "no source"). A pod counted through :meth:`bind` is matched when the caller gives its ``ref``.

Applications: every pod the cache reads (:meth:`pod`, the pods it counts and the pods the
decider scores) gets ``Pod.app``, the int code of its owner (``agent/cluster/apps.py``: the
Deployment of a ReplicaSet's pod, else the controller's kind and name, else the pod itself;
namespaced), numbered in order of first sight and stable while the cache lives (codes of owners
without pods are forgotten only once more than :data:`APP_CODES_KEPT` keys are held).

Real use (``state.cpu_used`` / ``state.mem_used``) follows the one definition of
:class:`~fedsched.common.model.cluster.ClusterState`: until telemetry measures a node (and for a
resource Prometheus has no value for) it is the requests of the pods counted on the node, as in
packing mode, where the shipped policy was trained; from a node's first measurement on it is the
measured use (as replay mode's usage model). ``state.cpu_measured`` / ``mem_measured`` say which,
per node; a rebuild of the tables (a node change) puts every node back on requests until the
next refresh.

Node changes rebuild the tables (they are rare); pod changes update the state in place. A burst
of new nodes (5,000 joining at once) is one rebuild, not one per node, when they come together:
:meth:`upsert_nodes` (the watch hands it the node events that queued up while the cache was busy)
and :meth:`add_nodes` rebuild once per call. All mutations and every read that must be consistent
hold :attr:`lock`.

Learned nodes: with full ``Nodes`` requests (``nodeCacheCapable: false``) the extender adds the
nodes a request names that the cache does not know (:meth:`add_nodes`), so that it can answer
before the watch reports them. Anyone who reaches the extender's port can name nodes, so these
are bounded: the watch's (or the CSV's) nodes are authoritative and never dropped for them; at
most :attr:`max_learned_nodes` learned ones are kept (:attr:`learned`, least recently named
first), and learning one more forgets the least recently named (its pods wait, as for a deleted
node). Evicting rather than refusing, because refusing would let whoever filled the table first
keep it full for good, and kube-scheduler's own requests name the nodes again each time: a node
it still uses is named again and so kept, or learned again at one rebuild's cost. A request that
names more new nodes than the limit learns the first :attr:`max_learned_nodes` only (the rest
stay unknown: filter refuses them). A learned node the watch then reports (:meth:`upsert_node`)
is the watch's from then on; a relist (:meth:`replace_all`) forgets every learned node.
"""

from __future__ import annotations

import calendar
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import islice, repeat
from pathlib import Path

import numpy as np

from fedsched.agent.cluster.apps import AppCodes, owner_key
from fedsched.agent.cluster.k8s_objects import (
    NodeInfo,
    ObjectError,
    bound_gpu_models,
    node_from_json,
    node_table,
    pod_from_json,
)
from fedsched.common.learning.features import Telemetry
from fedsched.common.model.cluster import USE_REQUESTS, ClusterState, NodeTable, Pod
from fedsched.common.model.traces import load_nodes
from fedsched.common.schedulers.base import default_gpu_choice
from fedsched.common.sim.replay import ReplayConfig

TERMINAL_PHASES = ("Succeeded", "Failed")
EXCLUDE_LABEL = "fedsched.io/exclude"  # nodes labelled with it = "true" are not for the policy
APP_CODES_KEPT = 4096  # application keys held before those without bound pods are forgotten
MILLI_PER_CORE = 1000.0
BYTES_PER_MIB = float(2**20)


@dataclass
class BoundPod:
    uid: str
    node: str
    pod: Pod
    gpus: tuple[int, ...]
    created: float  # unix seconds (metadata.creationTimestamp), NaN if unknown
    bound_at: float  # unix seconds when the cache first saw it bound
    ref: tuple[str, str] | None = None  # (namespace, name) of the Pod object; None when bound by uid


def created_time(obj: dict) -> float:
    """metadata.creationTimestamp in unix seconds (NaN when absent or unreadable)."""
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return math.nan
    try:
        return float(calendar.timegm(time.strptime(str(ts), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return math.nan


def pod_ref(obj: dict) -> tuple[str, str] | None:
    """(namespace, name) of a Pod object, the key of its per-pod telemetry; None without a name."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta["name"])) if meta.get("name") else None


ASSUME_TTL_S = 30.0  # an assumed pod without its binding event after this long is dropped
DEFAULT_MAX_LEARNED_NODES = 5000  # nodes learned from requests (module doc) kept at most


class ClusterCache:
    """Node inventory, bound pods and telemetry as one live :class:`ClusterState`."""

    def __init__(
        self,
        nodes: list[NodeInfo] | None = None,
        overload_threshold: float = ReplayConfig.overload_threshold,
        trend_alpha: float = ReplayConfig.trend_alpha,
        max_learned_nodes: int = DEFAULT_MAX_LEARNED_NODES,
    ) -> None:
        if type(max_learned_nodes) is not int or max_learned_nodes < 0:
            raise ValueError(f"max learned nodes must be a non-negative integer, got {max_learned_nodes!r}")
        self.max_learned_nodes = max_learned_nodes
        # names of the nodes add_nodes learned and no watch reported, least recently named first
        self.learned: dict[str, None] = {}
        self.rebuilds = 0  # rebuilds of the node tables (_set_nodes)
        self.lock = threading.RLock()
        self.overload_threshold = overload_threshold
        self.trend_alpha = trend_alpha
        self.pods: dict[str, BoundPod] = {}
        self.waiting: dict[str, tuple[dict, str]] = {}  # uid -> (pod JSON, node) for unknown nodes
        # Pods counted on a node that was then deleted while they still exist (a kubelet
        # re-registers a deleted Node, and its pods keep running): counted again when the node
        # comes back, dropped with their own DELETED event or the next relist.
        self.detached: dict[str, BoundPod] = {}
        self.rejected_objects = 0  # objects that could not be read (logged by the caller)
        self.overcommitted = 0  # pods counted on a node where, by our accounting, they did not fit
        # Bumps on every change a decision could see (state, node flags, telemetry, the pending
        # queue): a ranking computed at one generation holds while the generation stands.
        self.generation = 0
        self.synced = False
        self.last_telemetry: float = 0.0  # unix time of the last applied telemetry snapshot
        self.telemetry_up = False
        self.on_bound: list = []  # callables(BoundPod) run when a pod is newly counted on a node
        self.queue_scheduler: str | None = None  # spec.schedulerName of the queued pods (None: any)
        self.queued: dict[str, None] = {}  # uids of unbound, not ended pods (Telemetry.queue_len)
        self.apps = AppCodes()  # owner key -> Pod.app code
        # Pod.app code -> (CPU use / request, memory use / request); swapped whole, never mutated.
        self.app_table: dict[int, tuple[float, float]] = {}
        # uid -> (monotonic deadline, resourceVersion decided on) of the pods assume() counted and
        # no event has shown bound yet, in order of their deadlines
        self.assumed: dict[str, tuple[float, str]] = {}
        self._set_nodes(list(nodes or []))

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_table(cls, table: NodeTable, **kw) -> ClusterCache:
        infos = [
            NodeInfo(
                table.names[i],
                int(table.cpu[i]),
                int(table.mem[i]),
                int(table.gpu[i]),
                table.models[int(table.model[i])] if table.gpu[i] else "",
            )
            for i in range(len(table))
        ]
        cache = cls(**kw)
        cache._set_nodes(infos, table)
        cache.synced = True
        return cache

    @classmethod
    def from_csv(cls, path: str | Path, **kw) -> ClusterCache:
        """An empty cluster from a nodes CSV (openb schema)."""
        return cls.from_table(load_nodes(path), **kw)

    def _set_nodes(self, infos: list[NodeInfo], table: NodeTable | None = None) -> None:
        # node_table may raise: before any change. A given table (a CSV) is bounded as node_table's.
        table = bound_gpu_models(table) if table is not None else node_table(infos)
        self.infos = infos
        self.table = table
        self.index = {n.name: i for i, n in enumerate(infos)}
        if self.learned:
            self.learned = {n: None for n in self.learned if n in self.index}
        self.state = ClusterState(self.table, use_source=USE_REQUESTS)  # until telemetry measures
        # A node reporting no allocatable CPU or memory cannot run pods (and would divide by zero).
        self.schedulable = np.array(
            [not n.unschedulable and n.ready and n.cpu > 0 and n.mem > 0 for n in infos], dtype=bool
        )
        self.tainted = np.array([bool(n.no_schedule_taints) for n in infos], dtype=bool)
        self.excluded = np.array([dict(n.labels).get(EXCLUDE_LABEL) == "true" for n in infos], dtype=bool)
        # A node without allocatable CPU or memory is no capacity at all: out of the cluster's
        # context features too (they divide by each node's capacity).
        self.state.alive[:] = [n.cpu > 0 and n.mem > 0 for n in infos]
        k = len(infos)
        self.usage_time = np.zeros(k)  # unix time of each node's newest telemetry sample (0: none)
        self.cpu_ratio = np.full(k, np.nan)
        self.mem_ratio = np.full(k, np.nan)
        self.telemetry = Telemetry(
            np.zeros(k),
            np.zeros(k),
            np.zeros(k, dtype=bool),
            np.zeros(k, dtype=np.int64),
            np.zeros(k, dtype=np.int64),
            cpu_mean=np.full(k, np.nan),
            cpu_std=np.full(k, np.nan),
            mem_mean=np.full(k, np.nan),
            mem_std=np.full(k, np.nan),
            cpu_peak=np.full(k, np.nan),
            mem_peak=np.full(k, np.nan),
            app_usage=self.app_usage if self.last_telemetry else None,
        )
        self.telemetry.queue_len = len(self.queued)
        self.state.telemetry = self.telemetry
        old = list(self.pods.values())
        self.pods = {}
        for b in old:
            if b.node in self.index:
                self._account(b.uid, b.node, b.pod, b.created, b.bound_at, b.gpus, new=False, ref=b.ref)
        for uid, b in list(self.detached.items()):
            if b.node in self.index:
                del self.detached[uid]
                self._account(b.uid, b.node, b.pod, b.created, b.bound_at, None, new=False, ref=b.ref)
        for uid, (obj, node) in list(self.waiting.items()):
            if node in self.index:
                del self.waiting[uid]
                self.upsert_pod(obj)
        self.rebuilds += 1
        self.generation += 1

    # ---- lookups ----------------------------------------------------------------------------
    def lookup(self, names: list[str]) -> tuple[np.ndarray, list[str]]:
        """(node ids of the known names, in order; the unknown names)."""
        ids, pos = self.lookup_positions(names)
        known = set(pos.tolist())
        return ids, [n for k, n in enumerate(names) if k not in known]

    def lookup_positions(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(node ids of the known names, their positions in ``names``)."""
        at = np.fromiter(map(self.index.get, names, repeat(-1)), dtype=np.int64, count=len(names))
        pos = np.flatnonzero(at >= 0)
        return at[pos], pos

    def pod(self, obj: dict) -> Pod:
        """The :class:`Pod` of a Pod object, with its application code (``Pod.app``)."""
        pod = pod_from_json(obj, self.table.models)
        app = self.apps.code(owner_key(obj))
        return pod if pod.app == app else replace(pod, app=app)

    def app_usage(self, app: int) -> tuple[float, float] | None:
        """``Telemetry.app_usage``: (CPU use / request, memory use / request) of application
        ``app``'s measured bound pods at the last good refresh; None when it has none."""
        return self.app_table.get(app)

    # ---- Kubernetes sink ----------------------------------------------------------------------
    def replace_all(self, nodes: list[dict], pods: list[dict]) -> None:
        """Resync from full lists (the watch's initial list and every relist)."""
        infos = []
        for obj in nodes:
            try:
                infos.append(node_from_json(obj))
            except ObjectError:
                self.rejected_objects += 1
        with self.lock:
            self.pods, self.waiting, self.queued, self.detached, self.assumed = {}, {}, {}, {}, {}
            self.learned = {}
            self._set_nodes(infos)
            for obj in pods:
                self.upsert_pod(obj)
            self.synced = True

    def upsert_node(self, obj: dict) -> None:
        self.upsert_nodes([obj])

    def upsert_nodes(self, objs: list[dict]) -> None:
        """Node objects added or changed, in order (the watch's ADDED/MODIFIED events), in at most
        one rebuild of the tables: new nodes and capacity changes rebuild, a change of
        schedulability, taints or labels alone is made in place. A node that cannot be read is
        counted (:attr:`rejected_objects`) and left out; a learned node named here is the
        watch's from now on. Should the nodes together be more than the tables can hold, they
        are applied one at a time and the first error is raised after the others."""
        parsed: list[NodeInfo] = []
        for obj in objs:
            try:
                parsed.append(node_from_json(obj))
            except ObjectError:
                self.rejected_objects += 1  # a node we cannot read is left out, not fatal to the watch
        if not parsed:
            return
        with self.lock:
            try:
                self._upsert_infos(parsed)
            except (ValueError, OverflowError):
                if len(parsed) == 1:
                    raise
                first: Exception | None = None
                for info in parsed:
                    try:
                        self._upsert_infos([info])
                    except (ValueError, OverflowError) as e:
                        first = first or e
                if first is not None:
                    raise first from None

    def _upsert_infos(self, parsed: list[NodeInfo]) -> None:
        infos, copied, rebuild = self.infos, False, False
        new: dict[str, NodeInfo] = {}  # in order of first sight, the last version of each
        flags: dict[int, NodeInfo] = {}  # node id -> its new version, same capacity
        for info in parsed:
            i = self.index.get(info.name)
            if i is None:
                new[info.name] = info
                continue
            old = infos[i]
            if old == info:
                continue
            if not copied:
                infos, copied = list(infos), True
            infos[i] = info
            if (old.cpu, old.mem, old.gpu, old.model) == (info.cpu, info.mem, info.gpu, info.model):
                flags[i] = info
            else:
                rebuild = True
        if new or rebuild:
            self._set_nodes([*infos, *new.values()])  # raises before any change
        elif flags:
            # Only schedulability/taints/labels moved: no need to rebuild the state.
            self.infos = infos
            for i, info in flags.items():
                self.schedulable[i] = not info.unschedulable and info.ready and info.cpu > 0 and info.mem > 0
                self.tainted[i] = bool(info.no_schedule_taints)
                self.excluded[i] = dict(info.labels).get(EXCLUDE_LABEL) == "true"
            self.generation += 1
        for info in parsed:
            self.learned.pop(info.name, None)  # the watch's nodes are authoritative

    def add_nodes(self, infos: list[NodeInfo], seen: Iterable[str] = ()) -> tuple[int, int]:
        """Learn the nodes whose names the cache does not know (a request's full ``Nodes``: the
        module doc), in one rebuild of the tables (a rebuild per node, as one :meth:`upsert_node`
        each, makes adding n nodes quadratic); a known name, or a name given again, is left as it
        is. ``seen``: the request's node names, which count as named now for the learned ones.
        At most :attr:`max_learned_nodes` learned nodes are kept: the least recently named are
        evicted to make room. Returns (evicted, refused): the learned nodes forgotten, and the
        new ones not learned because the request alone named more than the limit. Raises
        (ValueError) before any change when the nodes together cannot be held (``node_table``)."""
        with self.lock:
            learned = self.learned
            if learned:
                for name in seen:
                    if name in learned:
                        del learned[name]
                        learned[name] = None  # to the end: the most recently named
            new: dict[str, NodeInfo] = {}
            for info in infos:
                if info.name not in self.index:
                    new.setdefault(info.name, info)
            limit = self.max_learned_nodes
            refused = max(len(new) - limit, 0)
            if refused:
                new = dict(islice(new.items(), limit))
            if not new:
                return 0, refused
            gone = set(islice(learned, max(len(learned) + len(new) - limit, 0)))
            keep = [n for n in self.infos if n.name not in gone] if gone else self.infos
            nodes = [*keep, *new.values()]
            table = node_table(nodes)  # may raise: before any change
            if gone:
                for uid, b in list(self.pods.items()):
                    if b.node in gone:  # they wait for their node, as for a deleted one
                        self.detached[uid] = self.pods.pop(uid)
            self._set_nodes(nodes, table)
            for name in new:
                self.learned[name] = None
            return len(gone), refused

    def delete_node(self, name: str) -> None:
        with self.lock:
            self.learned.pop(name, None)
            if name not in self.index:
                return
            for uid, b in list(self.pods.items()):
                if b.node == name:
                    self.detached[uid] = self.pods.pop(uid)
            self._set_nodes([n for n in self.infos if n.name != name])

    def upsert_pod(self, obj: dict) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        node = (obj.get("spec") or {}).get("nodeName")
        phase = (obj.get("status") or {}).get("phase")
        with self.lock:
            if not node and phase not in TERMINAL_PHASES and uid in self.assumed and (
                    self.assumed[uid][1] == str(meta.get("resourceVersion") or "")):
                return  # the pending pod as it was decided on (a watch that lags): nothing new
            if not node or phase in TERMINAL_PHASES:
                self.delete_pod(uid)
                sched = (obj.get("spec") or {}).get("schedulerName", "default-scheduler")
                if not node and phase not in TERMINAL_PHASES and (
                    self.queue_scheduler is None or sched == self.queue_scheduler
                ):
                    self.queued[uid] = None
                    self.telemetry.queue_len = len(self.queued)
                    self.generation += 1
                return
            try:
                pod = self.pod(obj)
            except ObjectError:
                self.rejected_objects += 1
                return
            ref = pod_ref(obj)
            known = self.pods.get(uid)
            if known is not None and known.node == node and known.pod == pod and known.ref == ref:
                if self.assumed.pop(uid, None) is not None:  # the binding of an assumed pod
                    b = self.pods[uid] = replace(known, bound_at=time.time())
                    for hook in self.on_bound:
                        hook(b)
                return
            if node not in self.index:
                self.delete_pod(uid)
                self.waiting[uid] = (obj, node)
                return
            moved = known is None or known.node != node or uid in self.assumed
            self.delete_pod(uid)
            self._account(
                uid, node, pod, created_time(obj), time.time() if moved else known.bound_at, None, new=moved,
                ref=ref,
            )

    def delete_pod(self, uid: str) -> None:
        with self.lock:
            self.assumed.pop(uid, None)
            self.waiting.pop(uid, None)
            self.detached.pop(uid, None)
            if self.queued.pop(uid, 0) is None:
                self.telemetry.queue_len = len(self.queued)
                self.generation += 1
            b = self.pods.pop(uid, None)
            if b is not None:
                self.state.release(self.index[b.node], b.pod, b.gpus)
                self.generation += 1

    # ---- local mode ---------------------------------------------------------------------------
    def bind(
        self,
        uid: str,
        pod: Pod,
        node: str,
        gpus: tuple[int, ...] | None = None,
        created: float = math.nan,
        ref: tuple[str, str] | None = None,
    ) -> BoundPod:
        """Count ``pod`` on ``node`` (the bind verb of the local mode). Raises KeyError for an
        unknown node and ValueError when the pod is already bound or does not fit. ``ref`` is
        the pod's (namespace, name) (:func:`pod_ref` of its object), which matches it to its
        per-pod telemetry; give ``pod`` as :meth:`pod` reads it, for its application code."""
        with self.lock:
            if node not in self.index:
                raise KeyError(node)
            if uid in self.assumed:  # the binding of a pod assume() counted: count it as bound
                self.delete_pod(uid)
            if uid in self.pods:
                raise ValueError(f"pod {uid} is already bound to {self.pods[uid].node}")
            i = self.index[node]
            if not self.state.feasible(pod, np.array([i]))[0]:
                raise ValueError(f"pod {uid} does not fit on {node}")
            return self._account(uid, node, pod, created, time.time(), gpus, ref=ref)

    def assume(self, obj: dict, pod: Pod, node: str, now: float | None = None) -> bool:
        """Count the pending pod ``obj`` (read as ``pod``) on ``node``, where the agent's answer
        makes kube-scheduler put it, until its binding event (module doc). False, and nothing
        counted, when the pod is already counted, has no uid, or does not fit ``node``."""
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        now = time.monotonic() if now is None else now
        with self.lock:
            self._expire_assumed(now)
            i = self.index.get(node)
            if not uid or uid in self.pods or i is None or not self.state.feasible(pod, np.array([i]))[0]:
                return False
            self._account(uid, node, pod, created_time(obj), time.time(), None, new=False, ref=pod_ref(obj))
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            self.assumed[uid] = (now + ASSUME_TTL_S, version)
            return True

    def forget(self, uid: str) -> None:
        """Drop the assumption of pod ``uid`` (if any): it is pending again, as far as the cache
        knows (a new scheduling attempt of the pod, or its binding never came)."""
        with self.lock:
            if uid in self.assumed:
                self.delete_pod(uid)
                self.queued[uid] = None
                self.telemetry.queue_len = len(self.queued)

    def _expire_assumed(self, now: float) -> None:
        for uid, (deadline, _) in list(self.assumed.items()):
            if deadline > now:
                break  # in order of their deadlines
            self.forget(uid)

    def _account(
        self,
        uid: str,
        node: str,
        pod: Pod,
        created: float,
        bound_at: float,
        gpus: tuple[int, ...] | None,
        new: bool = True,
        ref: tuple[str, str] | None = None,
    ) -> BoundPod:
        i = self.index[node]
        if gpus is None:
            gpus = default_gpu_choice(self.state, pod, i) if pod.num_gpu else ()
            if pod.num_gpu and (
                len(gpus) < (1 if pod.is_gpu_share else pod.num_gpu)
                or (self.state.gpu_free[i, list(gpus)] < pod.gpu_milli).any()
            ):
                gpus = ()  # no GPU left by our accounting: count CPU and memory only
        try:
            self.state.allocate(i, pod, gpus)
        except AssertionError:
            # The cluster runs it, so it is there: count it (allocate already did) and say so.
            self.overcommitted += 1
        b = BoundPod(uid, node, pod, tuple(gpus), created, bound_at, ref)
        self.pods[uid] = b
        if self.queued.pop(uid, 0) is None:
            self.telemetry.queue_len = len(self.queued)
        self.generation += 1
        if new:
            for hook in self.on_bound:
                hook(b)
        return b

    # ---- telemetry ----------------------------------------------------------------------------
    def apply_telemetry(self, snapshot) -> None:
        """Real use from a :class:`fedsched.agent.cluster.telemetry.TelemetrySnapshot`."""
        with self.lock:
            self.telemetry_up = bool(snapshot.up)
            if not snapshot.up:
                return
            dt = snapshot.fetched_at - self.last_telemetry if self.last_telemetry else 0.0
            self.last_telemetry = snapshot.fetched_at
            cap_cpu = self.table.cpu.astype(np.float64)
            cap_mem = self.table.mem.astype(np.float64)
            tel, s = self.telemetry, self.state
            for name, u in snapshot.nodes.items():
                i = self.index.get(name)
                if i is None:
                    continue
                self.usage_time[i] = u.timestamp
                self.cpu_ratio[i] = u.cpu_ratio
                self.mem_ratio[i] = u.mem_ratio
                # A resource without a value keeps its use (measured before, or requests); the
                # trend follows measurements only (not the step from requests to a first one).
                a = self.trend_alpha
                if math.isfinite(u.cpu_ratio):
                    cpu = u.cpu_ratio * cap_cpu[i]
                    if dt > 0 and s.cpu_measured[i]:
                        tel.cpu_trend[i] += a * ((cpu - s.cpu_used[i]) / dt - tel.cpu_trend[i])
                    s.set_measured_use(i, cpu=cpu)
                elif dt > 0:
                    tel.cpu_trend[i] -= a * tel.cpu_trend[i]
                if math.isfinite(u.mem_ratio):
                    mem = u.mem_ratio * cap_mem[i]
                    if dt > 0 and s.mem_measured[i]:
                        tel.mem_trend[i] += a * ((mem - s.mem_used[i]) / dt - tel.mem_trend[i])
                    s.set_measured_use(i, mem=mem)
                elif dt > 0:
                    tel.mem_trend[i] -= a * tel.mem_trend[i]
                over = bool(math.isfinite(u.cpu_ratio) and u.cpu_ratio > self.overload_threshold)
                if over and not tel.overloaded[i]:
                    tel.overload_count[i] += 1
                tel.overloaded[i] = over
                # windowed statistics (NaN when Prometheus has none: the baselines fall back)
                tel.cpu_mean[i], tel.cpu_std[i] = u.cpu_mean, u.cpu_std
                tel.mem_mean[i], tel.mem_std[i] = u.mem_mean, u.mem_std
                tel.cpu_peak[i], tel.mem_peak[i] = u.cpu_peak, u.mem_peak
            seen = self.usage_time > 0
            age = np.full(len(self.usage_time), np.inf)
            age[seen] = np.maximum(snapshot.fetched_at - self.usage_time[seen], 0.0)
            tel.metrics_age_s = age
            self.app_table = self._app_ratios(getattr(snapshot, "pods", None) or {})
            tel.app_usage = self.app_usage
            if len(self.apps) > max(APP_CODES_KEPT, 2 * len(self.pods)):
                self.apps.prune({b.pod.app for b in self.pods.values()})
            self.generation += 1

    def _app_ratios(self, pods: dict) -> dict[int, tuple[float, float]]:
        """Per application, (sum of CPU use / sum of non-zero CPU requests, the same for memory)
        over its bound pods with both values in ``pods`` ((namespace, name) -> (cores, bytes))."""
        sums: dict[int, list[float]] = {}
        if pods:
            for b in self.pods.values():
                if b.pod.app < 0 or b.ref is None:
                    continue
                use = pods.get(b.ref)
                if use is None:
                    continue
                cpu, mem = float(use[0]), float(use[1])
                if not (math.isfinite(cpu) and math.isfinite(mem)):
                    continue
                acc = sums.setdefault(b.pod.app, [0.0, 0.0, 0.0, 0.0])
                acc[0] += cpu * MILLI_PER_CORE
                acc[1] += mem / BYTES_PER_MIB
                acc[2] += b.pod.cpu_nonzero
                acc[3] += b.pod.mem_nonzero
        return {app: (c / cr, m / mr) for app, (c, m, cr, mr) in sums.items() if cr > 0 and mr > 0}

    def record_oom(self, node: str) -> None:
        """An OOM kill seen on ``node`` (the watch sees a container terminated OOMKilled)."""
        with self.lock:
            i = self.index.get(node)
            if i is not None:
                self.telemetry.oom_count[i] += 1
                self.generation += 1
