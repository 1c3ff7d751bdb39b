"""KubeWatcher (agent/k8s_watch.py) against a real HTTP server speaking the Kubernetes API.

kube-apiserver cannot be installed here, so ``tests/k8s_api_stub_server.py`` serves the wire
format (lists with resourceVersion, chunked watch streams, 410 Expired, dropped connections)
and the official ``kubernetes`` client talks to it over TCP. The sink is the real
:class:`fedsched.agent.cluster.cache.ClusterCache`, behind a pass-through that also records the
order of the calls it receives.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import node_from_json, pod_from_json
from fedsched.agent.cluster.k8s_watch import KubeConfigError, KubeWatcher, load_kube_config
from fedsched.common.model.cluster import MILLI_PER_GPU
from tests.k8s_api_stub_server import KubeAPIStub
from tests.paths import TEST_DATA

DATA = TEST_DATA / "k8s"
NODE_LIST = json.loads((DATA / "nodes.json").read_text())
POD_LIST = json.loads((DATA / "pods.json").read_text())
NODES = NODE_LIST["items"]
PODS = POD_LIST["items"]
BOUND = {p["metadata"]["uid"] for p in PODS
         if p["spec"].get("nodeName") and p["status"]["phase"] not in ("Succeeded", "Failed")}


def by_name(items: list[dict], name: str) -> dict:
    return copy.deepcopy(next(o for o in items if o["metadata"]["name"] == name))


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


class RecordingCache:
    """Forwards every sink call to a real ClusterCache and records (method, key, object)."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.cache = ClusterCache()
        self.calls: list[tuple[str, str, object]] = []
        self.fail_on = fail_on  # a pod name whose first upsert raises (a consumer error)
        self.lock = threading.Lock()

    def _rec(self, method: str, key: str, obj: object = None) -> None:
        with self.lock:
            self.calls.append((method, key, obj))

    def of(self, method: str) -> list[tuple[str, str, object]]:
        with self.lock:
            return [c for c in self.calls if c[0] == method]

    def replace_all(self, nodes: list[dict], pods: list[dict]) -> None:
        self._rec("replace_all", f"{len(nodes)}/{len(pods)}", (copy.deepcopy(nodes), copy.deepcopy(pods)))
        self.cache.replace_all(nodes, pods)

    def upsert_node(self, obj: dict) -> None:
        self._rec("upsert_node", obj["metadata"]["name"], obj)
        self.cache.upsert_node(obj)

    def delete_node(self, name: str) -> None:
        self._rec("delete_node", name)
        self.cache.delete_node(name)

    def upsert_pod(self, obj: dict) -> None:
        self._rec("upsert_pod", obj["metadata"]["uid"], obj)
        if self.fail_on and obj["metadata"]["name"] == self.fail_on:
            self.fail_on = None
            raise RuntimeError(f"consumer rejected {obj['metadata']['name']}")
        self.cache.upsert_pod(obj)

    def delete_pod(self, uid: str) -> None:
        self._rec("delete_pod", uid)
        self.cache.delete_pod(uid)


@pytest.fixture
def api() -> Iterator[KubeAPIStub]:
    with KubeAPIStub(NODES, PODS) as server:
        yield server


def client_for(api: KubeAPIStub) -> kubernetes.client.ApiClient:
    return kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url))


class Running:
    """A started KubeWatcher with its recording sink and collected on_error calls."""

    def __init__(self, api: KubeAPIStub, **kw) -> None:
        self.sink = RecordingCache(kw.pop("fail_on", None))
        self.errors: list[tuple[str, Exception]] = []
        kw.setdefault("resync_backoff_s", 0.05)
        kw.setdefault("max_backoff_s", 0.2)
        self.watcher = KubeWatcher(self.sink, client_for(api),
                                   on_error=lambda w, e: self.errors.append((w, e)), **kw)
        self.api = api

    def __enter__(self) -> Running:
        self.watcher.start()
        assert self.watcher.wait_synced(5)
        assert self.api.wait_watching("nodes") and self.api.wait_watching("pods")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.watcher.stop(5)


def new_pod(name: str, node: str | None, cpu: str = "300m", template: str = "web-7d9c5b6f8-m4kqt") -> dict:
    pod = by_name(PODS, template)
    meta = pod["metadata"]
    meta["name"] = name
    meta.pop("uid")
    meta.pop("resourceVersion")
    meta.pop("managedFields")
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    if node is None:
        pod["spec"].pop("nodeName")
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    else:
        pod["spec"]["nodeName"] = node
    return pod


# ---- the fixtures are what the API serves, and what the cache reads --------------------------

def test_fixtures_are_api_lists_with_the_required_variety() -> None:
    for doc, kind in ((NODE_LIST, "NodeList"), (POD_LIST, "PodList")):
        assert doc["kind"] == kind and doc["apiVersion"] == "v1"
        assert doc["metadata"]["resourceVersion"].isdigit()
        for item in doc["items"]:
            assert "kind" not in item and "apiVersion" not in item  # list items, as the API server sends
            assert item["metadata"]["uid"] and item["metadata"]["managedFields"]
    # The official client's models accept every object (types and field names of the API).
    typed = kubernetes.client.ApiClient()
    nl = typed.deserialize(json.dumps(NODE_LIST), "V1NodeList", "application/json")
    pl = typed.deserialize(json.dumps(POD_LIST), "V1PodList", "application/json")
    assert [n.metadata.name for n in nl.items] == [n["metadata"]["name"] for n in NODES]
    assert [p.metadata.uid for p in pl.items] == [p["metadata"]["uid"] for p in PODS]

    info = {n["metadata"]["name"]: node_from_json(n) for n in NODES}
    assert info["cpu-node-a"].cpu == 7910 and info["cpu-node-a"].gpu == 0 and info["cpu-node-a"].ready
    assert info["gpu-v100-0"].gpu == 8 and info["gpu-v100-0"].model == "Tesla-V100-SXM2-16GB"
    assert info["gpu-t4-0"].model == "Tesla-T4" and info["gpu-t4-0"].no_schedule_taints == ("nvidia.com/gpu",)
    assert info["cpu-node-c"].unschedulable
    assert not info["gpu-v100-1"].ready
    assert "node.kubernetes.io/not-ready" in info["gpu-v100-1"].no_schedule_taints

    pods = {p["metadata"]["name"]: p for p in PODS}
    assert "nodeName" not in pods["llama-finetune-9fz2c"]["spec"]
    assert pods["llama-finetune-9fz2c"]["status"]["phase"] == "Pending"
    assert pods["db-backup-28930800-7hxkd"]["status"]["phase"] == "Succeeded"
    whole = pod_from_json(pods["resnet50-train-x7k2p"])
    assert (whole.num_gpu, whole.gpu_milli) == (2, MILLI_PER_GPU)
    share = pod_from_json(pods["bert-infer-6c8d7f9b5-2xvqp"])
    assert (share.num_gpu, share.gpu_milli, share.cpu) == (1, 500, 2000)
    etl = pod_from_json(pods["etl-nightly-28930860-q9wzl"])
    assert (etl.cpu, etl.mem) == (2000, 4096)  # the init container's request dominates
    assert pods["debug-shell"]["status"]["qosClass"] == "BestEffort"
    assert pod_from_json(pods["debug-shell"]).cpu == 0


# ---- list + watch ------------------------------------------------------------------------------

def test_initial_sync_delivers_every_object_through_replace_all(api: KubeAPIStub) -> None:
    with Running(api, page_size=4) as r:
        w, sink = r.watcher, r.sink
        assert w.synced and w.relists == 0 and w.events == 0 and w.last_error == ""
        (call,) = sink.of("replace_all")
        nodes, pods = call[2]
        assert [n["metadata"]["name"] for n in nodes] == [n["metadata"]["name"] for n in NODES]
        assert [p["metadata"]["uid"] for p in pods] == [p["metadata"]["uid"] for p in PODS]
        assert all(type(o) is dict for o in nodes + pods)  # raw JSON, not client models
        assert sink.calls[0][0] == "replace_all"
        cache = sink.cache
        assert cache.synced and set(cache.index) == {n["metadata"]["name"] for n in NODES}
        assert set(cache.pods) == BOUND  # the Pending and the Succeeded pod are not counted
        assert cache.pods["6a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"].node == "gpu-v100-0"
        # Paged lists (limit=4: 6 nodes in 2 pages, 9 pods in 3) ...
        assert [q.get("continue") is not None for q in api.calls("nodes", watch=False)] == [False, True]
        assert len(api.calls("pods", watch=False)) == 3
        # ... then both watches start at the list's resourceVersion, with bookmarks asked for.
        for kind in ("nodes", "pods"):
            (q,) = api.calls(kind, watch=True)
            assert q["resourceVersion"] == api.resource_version and q["allowWatchBookmarks"] == "true"
            assert q["timeoutSeconds"] == "300"


def test_namespaced_watch_lists_and_watches_one_namespace(api: KubeAPIStub) -> None:
    with Running(api, namespace="ml") as r:
        _, pods = r.sink.of("replace_all")[0][2]
        assert sorted(p["metadata"]["name"] for p in pods) == [
            "bert-infer-6c8d7f9b5-2xvqp", "llama-finetune-9fz2c", "resnet50-train-x7k2p"]
        assert any(path == "/api/v1/namespaces/ml/pods" for path, _ in api.requests)
        api.add("pods", new_pod("elsewhere", "cpu-node-a"))  # namespace shop: not watched
        ml_pod = new_pod("ml-extra", "cpu-node-b")
        ml_pod["metadata"]["namespace"] = "ml"
        api.add("pods", ml_pod)
        assert wait_until(lambda: r.watcher.events == 1)
        assert [c[2]["metadata"]["name"] for c in r.sink.of("upsert_pod")] == ["ml-extra"]


def test_watch_events_reach_the_sink_in_order(api: KubeAPIStub) -> None:
    with Running(api) as r:
        sink, cache = r.sink, r.sink.cache
        rv_add = api.add("pods", new_pod("web-extra", "cpu-node-a", cpu="300m"))
        uid = next(o for o in api.objects("pods") if o["metadata"]["name"] == "web-extra")["metadata"]["uid"]
        assert wait_until(lambda: uid in cache.pods)
        assert cache.pods[uid].pod.cpu == 300
        changed = new_pod("web-extra", "cpu-node-a", cpu="700m")
        rv_mod = api.update("pods", changed)
        assert wait_until(lambda: cache.pods.get(uid) is not None and cache.pods[uid].pod.cpu == 700)
        rv_del = api.delete("pods", "shop/web-extra")
        new_node = by_name(NODES, "gpu-v100-0")
        new_node["metadata"]["name"] = "gpu-v100-2"
        new_node["metadata"].pop("uid")
        api.add("nodes", new_node)
        cordoned = copy.deepcopy(new_node)
        cordoned["spec"]["unschedulable"] = True
        api.update("nodes", cordoned)
        api.delete("nodes", "gpu-v100-2")
        assert wait_until(lambda: r.watcher.events == 6)

        pod_calls = [(m, k) for m, k, _ in sink.calls if m in ("upsert_pod", "delete_pod")]
        assert pod_calls == [("upsert_pod", uid), ("upsert_pod", uid), ("delete_pod", uid)]
        versions = [c[2]["metadata"]["resourceVersion"] for c in sink.of("upsert_pod")]
        assert versions == [rv_add, rv_mod]
        assert all(c[2]["kind"] == "Pod" and type(c[2]) is dict for c in sink.of("upsert_pod"))
        node_calls = [(m, k) for m, k, _ in sink.calls if m in ("upsert_node", "delete_node")]
        assert node_calls == [("upsert_node", "gpu-v100-2"), ("upsert_node", "gpu-v100-2"),
                              ("delete_node", "gpu-v100-2")]
        assert sink.of("upsert_node")[1][2]["spec"]["unschedulable"] is True
        assert uid not in cache.pods and "gpu-v100-2" not in cache.index
        assert set(cache.pods) == BOUND and r.watcher.relists == 0 and r.watcher.last_error == ""
        assert int(rv_del) > int(rv_mod) > int(rv_add)


@pytest.mark.parametrize(("code", "reason"), [(410, "Expired"), (500, "InternalError")])
def test_an_error_event_relists_and_resyncs(api: KubeAPIStub, code: int, reason: str) -> None:
    with Running(api) as r:
        # Changes the watch never reports (lost while it is broken) must come back by the relist.
        api.add("pods", new_pod("while-broken", "cpu-node-b"), notify=False)
        api.delete("pods", "shop/redis-0", notify=False)
        if code == 410:
            api.expire("pods")
        else:
            api.send_error("pods", code, reason, "etcdserver: request timed out")
        assert wait_until(lambda: r.watcher.relists == 1)
        assert len(r.sink.of("replace_all")) == 2
        assert f"HTTP {code}" in r.watcher.last_error and r.watcher.last_error.startswith("pods:")
        ((where, exc),) = r.errors
        assert where == "pods" and isinstance(exc, ApiException) and exc.status == code
        # Both collections were listed again, and the cache holds the server's state.
        assert len(api.calls("nodes", watch=False)) == 2 and len(api.calls("pods", watch=False)) == 2
        _, pods = r.sink.of("replace_all")[1][2]
        names = {p["metadata"]["name"] for p in pods}
        assert "while-broken" in names and "redis-0" not in names
        cache = r.sink.cache
        assert {b.pod.cpu for u, b in cache.pods.items() if u not in BOUND} == {300}
        assert "3e5f7a9b-1c2d-4e6f-8a0b-2c4d6e8f0a1b" not in cache.pods  # redis-0
        # The new watches start from the relist's resourceVersion and keep delivering.
        assert api.wait_watching("pods") and api.wait_watching("nodes")
        assert api.calls("pods", watch=True)[-1]["resourceVersion"] == api.resource_version
        api.add("pods", new_pod("after-resync", "cpu-node-a"))
        assert wait_until(lambda: any(c[2]["metadata"]["name"] == "after-resync"
                                      for c in r.sink.of("upsert_pod")))


def test_a_dropped_connection_triggers_a_resync(api: KubeAPIStub) -> None:
    with Running(api) as r:
        node = by_name(NODES, "cpu-node-a")
        node["spec"]["unschedulable"] = True
        api.update("nodes", node, notify=False)
        assert api.drop("nodes") == 1
        assert wait_until(lambda: r.watcher.relists == 1)
        assert "nodes:" in r.watcher.last_error and "ProtocolError" in r.watcher.last_error
        assert [w for w, _ in r.errors] == ["nodes"]
        cache = r.sink.cache
        assert cache.infos[cache.index["cpu-node-a"]].unschedulable  # the missed change arrived by the relist
        assert api.wait_watching("nodes")
        api.delete("nodes", "cpu-node-b")
        assert wait_until(lambda: "cpu-node-b" not in cache.index)


def test_a_watch_the_server_ends_resumes_from_the_last_resource_version(api: KubeAPIStub) -> None:
    with Running(api, watch_timeout_s=1) as r:
        api.add("pods", new_pod("before-timeout", "cpu-node-a"))
        assert wait_until(lambda: r.watcher.events == 1)
        bookmark_rv = api.bookmark("pods")
        # The server closes the stream cleanly after timeoutSeconds=1; the watcher watches again
        # from the bookmark's resourceVersion, without listing again.
        assert wait_until(lambda: len(api.calls("pods", watch=True)) >= 2, timeout=4)
        assert api.calls("pods", watch=True)[1]["resourceVersion"] == bookmark_rv
        assert wait_until(lambda: len(api.calls("nodes", watch=True)) >= 2, timeout=4)
        assert api.calls("nodes", watch=True)[1]["resourceVersion"] == api.calls("nodes", watch=True)[0][
            "resourceVersion"]
        assert r.watcher.relists == 0 and r.watcher.last_error == "" and r.errors == []
        assert len(api.calls("pods", watch=False)) == 1
        assert r.watcher.events == 1  # a BOOKMARK is not handed to the sink


def test_a_sink_error_is_survived_by_a_resync(api: KubeAPIStub) -> None:
    with Running(api, fail_on="poison") as r:
        api.add("pods", new_pod("poison", "cpu-node-a"))
        assert wait_until(lambda: r.watcher.relists == 1)
        assert "consumer rejected poison" in r.watcher.last_error
        uid = next(o for o in api.objects("pods") if o["metadata"]["name"] == "poison")["metadata"]["uid"]
        assert wait_until(lambda: uid in r.sink.cache.pods)  # delivered again by the relist
        assert r.watcher.running


def test_stop_is_prompt_and_joins_every_thread(api: KubeAPIStub) -> None:
    r = Running(api, watch_timeout_s=300)
    r.__enter__()
    t0 = time.monotonic()
    assert r.watcher.stop(5)
    assert time.monotonic() - t0 < 4.0  # not the 300 s watch timeout (nor stop's own 5 s)
    assert not r.watcher.running
    assert not [t for t in threading.enumerate() if t.name.startswith("kube-watch")]
    assert wait_until(lambda: api.open_watches("pods") == 0 and api.open_watches("nodes") == 0)
    n = len(r.sink.calls)
    api.add("pods", new_pod("after-stop", "cpu-node-a"))
    time.sleep(0.1)
    assert len(r.sink.calls) == n


def test_an_unreachable_server_backs_off_without_dying_and_stops_promptly() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    errors: list[tuple[str, Exception]] = []
    sink = RecordingCache()
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}"))
    w = KubeWatcher(sink, client, resync_backoff_s=0.05, max_backoff_s=30.0,
                    on_error=lambda where, e: errors.append((where, e)))
    w.start()
    # Retries back off exponentially (0.05, 0.1, 0.2, 0.4 s, ...) rather than spinning.
    assert wait_until(lambda: len(errors) >= 3, timeout=10)
    time.sleep(0.3)
    assert len(errors) <= 6
    assert w.running and not w.synced and w.last_error.startswith("list:")
    assert all(where == "list" for where, _ in errors)
    t0 = time.monotonic()
    assert w.stop(5)
    assert time.monotonic() - t0 < 4.0  # not the 30 s backoff (nor stop's own 5 s)
    assert sink.calls == []


def test_invalid_settings_are_rejected(api: KubeAPIStub) -> None:
    for kw in ({"resync_backoff_s": 0}, {"resync_backoff_s": 5, "max_backoff_s": 1}, {"watch_timeout_s": 0},
               {"page_size": 0}):
        with pytest.raises(ValueError):
            KubeWatcher(RecordingCache(), client_for(api), **kw)


# ---- load_kube_config ------------------------------------------------------------------------

def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "stub",
        "clusters": [{"name": "stub", "cluster": {"server": server}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "tester"}}],
        "users": [{"name": "tester", "user": {"token": "stub-token"}}],
    }))
    return path


def test_load_kube_config_from_a_file_talks_to_that_server(api: KubeAPIStub, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = write_kubeconfig(tmp_path / "config", api.url)
    client = load_kube_config(str(cfg))
    assert client.configuration.host == api.url
    names = [n.metadata.name for n in kubernetes.client.CoreV1Api(client).list_node().items]
    assert names == [n["metadata"]["name"] for n in NODES]
    # Without an argument, $KUBECONFIG is used outside a pod.
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    assert load_kube_config(None).configuration.host == api.url


def test_load_kube_config_in_a_pod_uses_the_service_account(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config import incluster_config

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    with pytest.raises(KubeConfigError, match="in-cluster config failed"):
        load_kube_config(None)  # no token mounted
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    client = load_kube_config(None)
    assert client.configuration.host == "https://10.96.0.1:443"
    assert client.configuration.api_key["BearerToken"] == "bearer sa-token"
    assert client.configuration.ssl_ca_cert == str(ca)


def test_load_kube_config_without_any_configuration_says_so(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(KubeConfigError, match=r"not running in a pod.*kubeconfig"):
        load_kube_config(None)
    with pytest.raises(KubeConfigError, match="does not exist"):
        load_kube_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(KubeConfigError, match="not usable"):
        load_kube_config(str(bad))


# ---- a burst of nodes joining ------------------------------------------------------------------


class GatedCache(RecordingCache):
    """A sink whose first node call waits until ``ready()`` (or 30 s): the events that arrive
    meanwhile queue up in the watcher, as they do while a slow rebuild runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ready: Callable[[int], bool] = lambda first: True
        self.node_calls: list[int] = []  # the number of nodes of each node call

    def _gate(self, n: int) -> None:
        if not self.node_calls:
            wait_until(lambda: self.ready(n), timeout=30.0)
        self.node_calls.append(n)

    def upsert_node(self, obj: dict) -> None:
        self._gate(1)
        super().upsert_node(obj)

    def upsert_nodes(self, objs: list[dict]) -> None:
        self._gate(len(objs))
        for o in objs:
            self._rec("upsert_node", o["metadata"]["name"], o)
        self.cache.upsert_nodes(objs)


def test_a_burst_of_nodes_joining_is_applied_in_a_few_rebuilds(api: KubeAPIStub) -> None:
    """1,000 ADDED node events that arrive while the sink is busy are applied in one more call and
    one more rebuild of the cache's tables, in order; the old watcher applied each on its own (a
    rebuild each: 1,000 rebuilds of up to 1,006 nodes, quadratic). Counted, never timed."""
    n = 1000
    sink = GatedCache()
    watcher = KubeWatcher(sink, client_for(api), resync_backoff_s=0.05, max_backoff_s=0.2)
    watcher.start()
    try:
        assert watcher.wait_synced(5) and api.wait_watching("nodes")
        rebuilds = [0]
        real = sink.cache._set_nodes

        def counted(*a: object, **kw: object) -> None:
            rebuilds[0] += 1
            real(*a, **kw)

        sink.cache._set_nodes = counted  # type: ignore[method-assign]
        # the first call waits until every other event has been read and waits in the watcher
        sink.ready = lambda first: getattr(watcher, "backlog", 0) == n - first
        for k in range(n):
            obj = by_name(NODES, "cpu-node-a")
            obj["metadata"]["name"] = f"joined-{k:04d}"
            obj["metadata"].pop("uid")
            api.add("nodes", obj)
        assert wait_until(lambda: watcher.events == n, timeout=120.0)
        assert len(sink.node_calls) <= 2 and sum(sink.node_calls) == n, sink.node_calls[:5]
        assert rebuilds[0] <= 2, rebuilds[0]
        assert [k for m, k, _ in sink.calls if m == "upsert_node"] == [f"joined-{k:04d}" for k in range(n)]
        assert all(f"joined-{k:04d}" in sink.cache.index for k in range(n))
        assert watcher.relists == 0 and watcher.last_error == ""
    finally:
        assert watcher.stop(5)
