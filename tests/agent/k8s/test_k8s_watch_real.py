"""The agent's Kubernetes watch (:class:`fedsched.agent.cluster.k8s_watch.KubeWatcher`) against a real
kube-apiserver v1.37.2, feeding the real :class:`fedsched.agent.cluster.cache.ClusterCache`.

Each module fixture is a control plane of its own (:func:`bench.harness.control_plane.control_plane`),
so that restarting its kube-apiserver or compacting its etcd disturbs no other test; the
watcher gets its client from the control plane's admin kubeconfig (:func:`load_kube_config`).

The oracle for "nothing lost" is a second ``ClusterCache`` filled with one fresh ``replace_all``
of what the API server lists now: after every change the watched cache must come to hold the same
nodes, the same counted and queued pods and the same per-node requests.

What is shown:

- the initial paged list (continue tokens from the real server), then ADDED/MODIFIED/DELETED
  watch events for nodes (register, cordon, label, delete) and pods (create bound, bind a
  pending pod through the ``binding`` subresource, a pod ending, delete) reach the cache, with
  no relist;
- a watch the server ends (``timeoutSeconds``) is resumed, not relisted (the apiserver's own
  ``apiserver_request_total{verb="WATCH"}`` counts the new watch requests);
- a namespaced watcher sees only its namespace's pods;
- 410 Gone, twice: with the watch cache off (``--watch-cache=false``) etcd's history is compacted
  between the list and the watch (etcd's v3 gateway ``kv/compaction``), so the watch from the
  list's resourceVersion gets etcd's "too old" (an ERROR event, code 410); with the default
  watch cache the apiserver is restarted between the list and the watch, and the new watch cache
  answers "too old resource version" (410). Both times the watcher relists and loses nothing,
  including the changes made in between;
- a crashed kube-apiserver (SIGKILL while the watches are open), started again on the same port
  and etcd: the watcher backs off while it is down, relists when it is back, and sees the changes
  made after the restart through its new watches.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from bench.harness.control_plane import ControlPlane, KubeAPI, control_plane, create_nodes
from bench.harness.polling import wait_for
from fedsched.agent.cluster.cache import EXCLUDE_LABEL, ClusterCache
from fedsched.agent.cluster.k8s_watch import KubeWatcher, load_kube_config
from fedsched.common.model.cluster import NodeTable
from fedsched.common.model.traces import builtin_trace, load_nodes
from tests.k8s_support import k8s_binaries

NS = "watched"
OTHER_NS = "elsewhere"
SYNC_S = 60.0  # generous: a shared 2-core machine; a wait, never an assertion on time


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane with kube-apiserver's default flags (watch cache on), restartable."""
    with control_plane(tmp_path_factory.mktemp("watch-cp"), k8s_binaries()) as c:
        for ns in (NS, OTHER_NS):
            c.api.ensure_namespace(ns)
        yield c


@pytest.fixture(scope="module")
def cp_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane whose apiserver serves every watch from etcd (``--watch-cache=false``)."""
    with control_plane(tmp_path_factory.mktemp("watch-cp-etcd"), k8s_binaries(),
                       ("--watch-cache=false",)) as c:
        c.api.ensure_namespace(NS)
        yield c


_TRACE: NodeTable | None = None


def openb_nodes(start: int, count: int) -> NodeTable:
    """``count`` consecutive nodes of the openb GPU cluster (distinct slices: distinct names)."""
    global _TRACE
    if _TRACE is None:
        _TRACE = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    return _TRACE.select(list(range(start, start + count)))


# ---- objects ----------------------------------------------------------------------------------

def pod_object(name: str, node: str | None = None, cpu: str = "500m", mem: str = "256Mi",
               gpus: int = 0) -> dict:
    res: dict[str, Any] = {"requests": {"cpu": cpu, "memory": mem}}
    if gpus:
        res["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                            "resources": res}],
                            "automountServiceAccountToken": False}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": spec}


def create_pod(api: KubeAPI, name: str, node: str | None = None, ns: str = NS, **kw: Any) -> dict:
    return api.create(f"/api/v1/namespaces/{ns}/pods", pod_object(name, node, **kw))


def bind(api: KubeAPI, name: str, node: str, ns: str = NS) -> None:
    """What kube-scheduler does: a Binding through the pod's ``binding`` subresource."""
    api.create(f"/api/v1/namespaces/{ns}/pods/{name}/binding",
               {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


def set_phase(api: KubeAPI, name: str, phase: str, ns: str = NS) -> None:
    """What the kubelet does when a pod ends: its phase through ``/status``."""
    api.merge_patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {"phase": phase}})


def delete_pod(api: KubeAPI, name: str, ns: str = NS) -> None:
    api.delete(f"/api/v1/namespaces/{ns}/pods/{name}")


def patch_node(api: KubeAPI, name: str, patch: dict) -> None:
    api.merge_patch(f"/api/v1/nodes/{quote(name)}", patch)


# ---- the oracle ------------------------------------------------------------------------------

def snapshot(cache: ClusterCache) -> dict[str, Any]:
    """What must agree between the watched cache and one built from a fresh list (application
    codes are numbered in order of first sight, so the pods are compared by their resources)."""
    with cache.lock:
        st = cache.state
        return {
            "nodes": {n.name: n for n in cache.infos},
            "schedulable": {n.name: bool(cache.schedulable[i]) for i, n in enumerate(cache.infos)},
            "excluded": {n.name: bool(cache.excluded[i]) for i, n in enumerate(cache.infos)},
            "pods": {uid: (b.node, b.pod.cpu, b.pod.mem, b.pod.num_gpu, b.pod.gpu_milli)
                     for uid, b in cache.pods.items()},
            "requests": {n.name: (int(st.cpu_req[i]), int(st.mem_req[i]), int(st.n_pods[i]))
                         for i, n in enumerate(cache.infos)},
            # pods on a node the cache does not know (a fresh list: ``waiting``; a watched cache
            # also ``detached``: counted on a node that was deleted)
            "waiting": sorted({*cache.waiting, *cache.detached}),
            "queued": sorted(cache.queued),
        }


def listed_cache(api: KubeAPI, namespace: str | None = None) -> ClusterCache:
    fresh = ClusterCache()
    fresh.replace_all(api.items("/api/v1/nodes"), api.pods(namespace))
    return fresh


def in_step(w: Watching, what: str) -> dict[str, Any]:
    """Wait until the watched cache equals a freshly listed one; returns that snapshot."""
    def same() -> dict[str, Any] | None:
        want = snapshot(listed_cache(w.api, w.namespace))
        return want if snapshot(w.cache) == want else None

    try:
        return wait_for(same, SYNC_S, 0.1, what)
    except TimeoutError:
        want, got = snapshot(listed_cache(w.api, w.namespace)), snapshot(w.cache)
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        state = f"relists={w.watcher.relists} last_error={w.watcher.last_error!r}"
        raise AssertionError(f"{what}: the watched cache differs from a fresh list (watched, listed): "
                             f"{diff}; watcher: {state}") from None


def uid(api: KubeAPI, name: str, ns: str = NS) -> str:
    return api.get(f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]["uid"]


# ---- the watcher ------------------------------------------------------------------------------

class HeldCache(ClusterCache):
    """A ClusterCache whose first ``replace_all`` can hold the watcher between its first list and
    the start of its watches (its supervisor starts them once ``replace_all`` returns) until the
    test thread has done what it wants in between (:meth:`Watching.__enter__`)."""

    def __init__(self, hold: bool = False) -> None:
        super().__init__()
        self.listed, self.go_on = threading.Event(), threading.Event()
        if not hold:
            self.go_on.set()
        self.lists = 0

    def replace_all(self, nodes: list[dict], pods: list[dict]) -> None:
        super().replace_all(nodes, pods)
        self.lists += 1
        self.listed.set()
        assert self.go_on.wait(SYNC_S), "the test never let the watcher go on"


class Watching:
    """A started KubeWatcher on ``cp`` into a ClusterCache; errors collected. ``between`` runs in
    the test's thread after the watcher's first list and before its watches start (processes
    must be started from the test's thread: ``PR_SET_PDEATHSIG`` kills them with the thread
    that started them)."""

    def __init__(self, cp: ControlPlane, namespace: str | None = None,
                 between: Callable[[], None] | None = None, **kw: Any) -> None:
        self.cp, self.api, self.namespace = cp, cp.api, namespace
        self.cache = HeldCache(hold=between is not None)
        self.between = between
        self.errors: list[tuple[str, Exception]] = []
        self.lock = threading.Lock()
        kw.setdefault("resync_backoff_s", 0.2)
        kw.setdefault("max_backoff_s", 1.0)
        self.watcher = KubeWatcher(self.cache, load_kube_config(str(cp.kubeconfig)), namespace=namespace,
                                   on_error=self._on_error, **kw)

    def _on_error(self, where: str, exc: Exception) -> None:
        with self.lock:
            self.errors.append((where, exc))

    def statuses(self) -> list[tuple[str, int | None]]:
        with self.lock:
            return [(w, getattr(e, "status", None)) for w, e in self.errors]

    def __enter__(self) -> Watching:
        self.watcher.start()
        try:
            if self.between is not None:
                try:
                    assert self.cache.listed.wait(SYNC_S), f"no first list: {self.watcher.last_error}"
                    self.between()
                finally:
                    self.cache.go_on.set()
            assert self.watcher.wait_synced(SYNC_S), f"no first list: {self.watcher.last_error}"
        except BaseException:
            self.watcher.stop(10)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cache.go_on.set()
        assert self.watcher.stop(10)


def count_watches(w: Watching, kind: str = "nodes") -> Callable[[], int]:
    """Wrap the watcher's list function for ``kind`` so that its watch requests are counted
    (``watch=True`` calls; lists are not); returns the counter."""
    name = "list_node" if kind == "nodes" else "list_pod_for_all_namespaces"
    fn = getattr(w.watcher.core, name)
    calls = [0]

    @functools.wraps(fn)
    def counted(*args: Any, **kw: Any) -> Any:
        if kw.get("watch"):
            calls[0] += 1
        return fn(*args, **kw)

    setattr(w.watcher.core, name, counted)
    return lambda: calls[0]


# ---- list + watch --------------------------------------------------------------------------

def test_list_then_watch_events_reach_the_cache_without_a_relist(cp: ControlPlane) -> None:
    api = cp.api
    nodes = openb_nodes(0, 5)
    n = nodes.names
    create_nodes(api, nodes.select([0, 1, 2, 3]))
    create_pod(api, "bound-a", n[0], cpu="1", mem="1Gi")
    create_pod(api, "bound-b", n[1], cpu="2", mem="2Gi", gpus=1 if nodes.gpu[1] else 0)
    create_pod(api, "pending", None, cpu="250m")
    create_pod(api, "done", n[2])
    set_phase(api, "done", "Succeeded")

    # page_size 2: the real server's continue tokens (5 nodes in 3 pages at the end)
    with Watching(cp, page_size=2) as w:
        assert w.watcher.synced and w.cache.lists == 1
        got = in_step(w, "the initial list")
        assert set(n[:4]) <= set(got["nodes"])
        assert got["pods"][uid(api, "bound-a")][:3] == (n[0], 1000, 1024)
        assert got["pods"][uid(api, "bound-b")][:3] == (n[1], 2000, 2048)
        assert uid(api, "pending") in got["queued"] and uid(api, "done") not in got["pods"]

        create_nodes(api, nodes.select([4]))  # ADDED, then MODIFIED (Ready, untainted)
        got = in_step(w, "a node registered")
        assert n[4] in got["nodes"] and got["schedulable"][n[4]]

        patch_node(api, n[1], {"spec": {"unschedulable": True}})
        patch_node(api, n[2], {"metadata": {"labels": {EXCLUDE_LABEL: "true"}}})
        got = in_step(w, "a node cordoned, one labelled excluded")
        assert not got["schedulable"][n[1]] and got["excluded"][n[2]]

        bind(api, "pending", n[4])
        got = in_step(w, "a pending pod bound")
        assert got["pods"][uid(api, "pending")][0] == n[4] and uid(api, "pending") not in got["queued"]
        assert got["requests"][n[4]] == (250, 256, 1)

        create_pod(api, "late", n[3], cpu="1500m")
        set_phase(api, "bound-a", "Failed")
        got = in_step(w, "a pod created bound, one failed")
        assert got["pods"][uid(api, "late")][0] == n[3] and uid(api, "bound-a") not in got["pods"]

        b_uid = uid(api, "bound-b")
        delete_pod(api, "bound-b")
        api.delete(f"/api/v1/nodes/{quote(n[3])}")
        got = in_step(w, "a pod and a node deleted")
        assert b_uid not in got["pods"] and n[3] not in got["nodes"]
        assert got["requests"][n[1]] == (0, 0, 0)
        assert uid(api, "late") in got["waiting"]  # its pod still exists (no pod GC runs here)

        create_nodes(api, nodes.select([3]))  # the node registers again (as a kubelet does)
        got = in_step(w, "a deleted node registered again, its pod counted again")
        assert got["pods"][uid(api, "late")][0] == n[3] and got["requests"][n[3]] == (1500, 256, 1)

        assert w.watcher.relists == 0 and w.cache.lists == 1
        assert w.watcher.last_error == "" and not w.errors
        assert w.watcher.events >= 10


def test_a_watch_the_server_ends_is_resumed_not_relisted(cp: ControlPlane) -> None:
    """``timeoutSeconds=1``: the apiserver ends each watch after a second; the watcher watches
    again from the last resourceVersion it saw (events or bookmarks), without listing again."""
    api = cp.api
    nodes = openb_nodes(10, 3)
    create_nodes(api, nodes.select([0]))
    w = Watching(cp, watch_timeout_s=1)
    watches = count_watches(w)
    with w:
        in_step(w, "the initial list")
        wait_for(lambda: watches() >= 1, SYNC_S, 0.05, "the first watch")
        for i in (1, 2):
            # each change after the server has ended one more watch and the watcher watched again
            seen = watches()
            wait_for(lambda s=seen: watches() > s, SYNC_S, 0.1, "a new watch after the server ended one")
            create_nodes(api, nodes.select([i]))
            create_pod(api, f"resumed-{i}", nodes.names[i])
            got = in_step(w, f"change {i} after a resumed watch")
            assert nodes.names[i] in got["nodes"] and uid(api, f"resumed-{i}") in got["pods"]
        assert watches() >= 3
        assert w.watcher.relists == 0 and w.cache.lists == 1
        assert w.watcher.last_error == "" and not w.errors


def test_a_namespaced_watcher_sees_only_its_namespace(cp: ControlPlane) -> None:
    api = cp.api
    nodes = openb_nodes(20, 1)
    create_nodes(api, nodes)
    node = nodes.names[0]
    create_pod(api, "mine-1", node)
    create_pod(api, "theirs-1", node, ns=OTHER_NS)
    with Watching(cp, namespace=NS) as w:
        in_step(w, "the initial list")
        create_pod(api, "mine-2", node)
        create_pod(api, "theirs-2", node, ns=OTHER_NS)
        got = in_step(w, "pods created in both namespaces")
        ours = {uid(api, "mine-1"), uid(api, "mine-2")}
        theirs = {uid(api, "theirs-1", OTHER_NS), uid(api, "theirs-2", OTHER_NS)}
        assert ours <= set(got["pods"]) and not theirs & set(got["pods"])
        assert w.watcher.relists == 0 and not w.errors


# ---- 410 Gone -----------------------------------------------------------------------------

def changes_in_between(api: KubeAPI, nodes: NodeTable, tag: str) -> Callable[[], None]:
    """Changes made after the list and before the watch: a node registered, one cordoned, a pod
    created bound, one deleted (several etcd revisions)."""
    def run() -> None:
        create_nodes(api, nodes.select([2]))
        patch_node(api, nodes.names[0], {"spec": {"unschedulable": True}})
        create_pod(api, f"{tag}-new", nodes.names[2], cpu="3")
        delete_pod(api, f"{tag}-old")
    return run


def assert_relisted_after_410(w: Watching, api: KubeAPI, nodes: NodeTable, tag: str,
                              message: str) -> None:
    got = in_step(w, "the relist after the 410")
    statuses = w.statuses()
    assert any(s == 410 for _, s in statuses), f"no 410 among the watch errors: {statuses}"
    assert re.search(message, w.watcher.last_error + " ".join(str(e) for _, e in w.errors))
    assert w.watcher.relists >= 1 and w.cache.lists >= 2
    # nothing lost: every change made between the list and the watch is in the cache
    assert nodes.names[2] in got["nodes"] and not got["schedulable"][nodes.names[0]]
    assert got["pods"][uid(api, f"{tag}-new")][:2] == (nodes.names[2], 3000)
    assert not any(p[0] == nodes.names[1] for p in got["pods"].values())  # the old pod's node
    # and the watches after the relist deliver again
    create_pod(api, f"{tag}-after", nodes.names[2])
    got = in_step(w, "a change after the relist")
    assert uid(api, f"{tag}-after") in got["pods"]


def test_a_compacted_resource_version_is_a_410_and_a_relist_loses_nothing(cp_etcd: ControlPlane) -> None:
    """Watch cache off: the watch goes to etcd, which refuses a revision older than its compaction."""
    api = cp_etcd.api
    nodes = openb_nodes(30, 3)
    create_nodes(api, nodes.select([0, 1]))
    create_pod(api, "c-old", nodes.names[1])
    between = changes_in_between(api, nodes, "c")
    compacted: list[int] = []

    def then_compact() -> None:
        between()
        compacted.append(cp_etcd.compact_etcd())

    with Watching(cp_etcd, between=then_compact) as w:
        assert_relisted_after_410(w, api, nodes, "c", r"resourceVersion for the provided watch is too old")
    assert compacted


def test_a_restarted_apiserver_between_list_and_watch_is_a_410_and_a_relist(cp: ControlPlane) -> None:
    """Watch cache on (the default): a restarted apiserver's new watch cache starts at etcd's
    current revision, and refuses a watch from before it ("too old resource version")."""
    api = cp.api
    nodes = openb_nodes(40, 3)
    create_nodes(api, nodes.select([0, 1]))
    create_pod(api, "r-old", nodes.names[1])
    between = changes_in_between(api, nodes, "r")

    def then_restart() -> None:
        listed_by_then = cp.etcd_revision()  # the watcher's lists were at or before this revision
        between()
        cp.stop_apiserver(kill=True)
        cp.start_apiserver()
        # /readyz can answer before the new watch caches serve (a watch then gets a 429, or is
        # served from etcd, which still has the history): wait until they refuse that revision.
        wait_for(lambda: watch_status(api, "/api/v1/pods", listed_by_then) == 410 and
                 watch_status(api, "/api/v1/nodes", listed_by_then) == 410, SYNC_S, 0.2,
                 "the restarted apiserver's watch caches refusing the old resourceVersion")

    with Watching(cp, between=then_restart) as w:
        assert_relisted_after_410(w, api, nodes, "r", r"too old resource version")


def watch_status(api: KubeAPI, path: str, rv: int) -> int | None:
    """The code of the ERROR event a watch from ``rv`` opens with (None: it delivered events or
    nothing), or the HTTP status when the watch itself is refused."""
    params = {"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "1"}
    r = api.session.get(api.url + path, params=params, stream=True, timeout=30)
    with r:
        if r.status_code != 200:
            return r.status_code
        for line in r.iter_lines():
            event = json.loads(line)
            return event["object"].get("code") if event.get("type") == "ERROR" else None
    return None


# ---- a crashed and restarted apiserver -----------------------------------------------------

def test_a_crashed_apiserver_is_survived_and_changes_after_its_restart_are_seen(cp: ControlPlane) -> None:
    api = cp.api
    nodes = openb_nodes(50, 3)
    create_nodes(api, nodes.select([0]))
    create_pod(api, "k-before", nodes.names[0])
    with Watching(cp) as w:
        in_step(w, "the initial list")
        with contextlib.ExitStack() as restart:
            restart.callback(lambda: cp.apiserver or cp.start_apiserver())  # never leave it down
            cp.stop_apiserver(kill=True)  # every watch connection is reset
            wait_for(lambda: w.errors, SYNC_S, 0.05, "the watcher noticing the crash")
            cp.start_apiserver()
        create_nodes(api, nodes.select([1, 2]))
        create_pod(api, "k-after", nodes.names[1], cpu="2")
        delete_pod(api, "k-before")
        patch_node(api, nodes.names[0], {"spec": {"unschedulable": True}})
        got = in_step(w, "changes after the restart")
        assert {nodes.names[1], nodes.names[2]} <= set(got["nodes"])
        assert got["pods"][uid(api, "k-after")][:2] == (nodes.names[1], 2000)
        assert not any(p[0] == nodes.names[0] for p in got["pods"].values())
        assert not got["schedulable"][nodes.names[0]]
        assert w.watcher.relists >= 1 and w.watcher.running
        wheres = {where for where, _ in w.errors}
        assert wheres & {"nodes", "pods"}, w.errors  # the reset watches
