"""The cache's application codes, per-application use / request ratios and windowed peaks.

Pods come from the API-server JSON of tests/data/k8s/ (a Deployment ``web`` behind a
ReplicaSet, a StatefulSet, Jobs, a DaemonSet and a bare BestEffort pod); telemetry snapshots
are built by hand, with the per-pod use cAdvisor would report, so every ratio below is
computed by hand. tests/agent/cluster/test_telemetry.py feeds the same path from a real
Prometheus.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import threading

import numpy as np
import pytest

from fedsched.agent.cluster import cache as cache_mod
from fedsched.agent.cluster.cache import ClusterCache, pod_ref
from fedsched.agent.cluster.k8s_objects import pod_from_json
from fedsched.agent.cluster.telemetry import NodeUsage, TelemetrySnapshot
from fedsched.common.learning.features import expected_use_ratios
from fedsched.common.schedulers.load_stats import node_load
from tests.paths import TEST_DATA

K8S = TEST_DATA / "k8s"
MIB = 2**20
NAN = math.nan


@pytest.fixture
def objects() -> tuple[list[dict], list[dict]]:
    return (
        json.loads((K8S / "nodes.json").read_text())["items"],
        json.loads((K8S / "pods.json").read_text())["items"],
    )


def named(pods: list[dict], prefix: str) -> dict:
    return next(p for p in pods if p["metadata"]["name"].startswith(prefix))


def sibling(pod: dict, name: str, node: str, cpu: str | None = None, mem: str | None = None,
            namespace: str | None = None) -> dict:
    """Another replica of ``pod``'s owner (same ownerReferences and labels), with its own name."""
    p = copy.deepcopy(pod)
    p["metadata"]["name"] = name
    p["metadata"]["uid"] = f"uid-{name}"
    if namespace is not None:
        p["metadata"]["namespace"] = namespace
    p["spec"]["nodeName"] = node
    req = p["spec"]["containers"][0]["resources"].setdefault("requests", {})
    if cpu is not None:
        req["cpu"] = cpu
    if mem is not None:
        req["memory"] = mem
    return p


def snap(nodes: dict[str, NodeUsage] | None = None, pods: dict | None = None, at: float = 1000.0,
         up: bool = True) -> TelemetrySnapshot:
    return TelemetrySnapshot(up, at, nodes or {}, "" if up else "down", pods=pods or {})


def test_every_pod_gets_its_owners_code(objects):
    nodes, pods = objects
    cache = ClusterCache()
    cache.replace_all(nodes, pods)
    by_name = {b.ref[1]: b.pod.app for b in cache.pods.values()}
    assert sorted(by_name.values()) == list(range(7))  # seven bound pods, seven applications
    web = named(pods, "web-")
    # a new replica (being scheduled: no node yet) is the same application as the running one
    fresh = sibling(web, "web-7d9c5b6f8-newone", "cpu-node-a")
    del fresh["spec"]["nodeName"]
    assert cache.pod(fresh).app == by_name["web-7d9c5b6f8-m4kqt"]
    # the next rollout's pods (a new ReplicaSet of the same Deployment) too
    rollout = sibling(web, "web-5f6b8c9d4-abcde", "cpu-node-a")
    rollout["metadata"]["ownerReferences"][0]["name"] = "web-5f6b8c9d4"
    rollout["metadata"]["labels"]["pod-template-hash"] = "5f6b8c9d4"
    assert cache.pod(rollout).app == by_name["web-7d9c5b6f8-m4kqt"]
    # the same Deployment name in another namespace is another application
    other = sibling(web, "web-7d9c5b6f8-m4kqt", "cpu-node-a", namespace="staging")
    assert cache.pod(other).app not in by_name.values()
    # the requests are what pod_from_json reads; only the code is added
    assert dataclasses.replace(cache.pod(web), app=-1) == pod_from_json(web, cache.table.models)
    # codes survive a relist and a node rebuild
    before = {b.uid: b.pod.app for b in cache.pods.values()}
    cache.replace_all(nodes, pods)
    bigger = copy.deepcopy(named(nodes, "cpu-node-b"))
    bigger["status"]["allocatable"]["cpu"] = "31"
    cache.upsert_node(bigger)
    assert {b.uid: b.pod.app for b in cache.pods.values()} == before
    assert all(b.ref == (p["metadata"]["namespace"], p["metadata"]["name"])
               for p in pods for b in [cache.pods.get(p["metadata"]["uid"])] if b is not None)


def test_app_usage_is_use_over_nonzero_requests_of_the_measured_pods(objects):
    nodes, pods = objects
    web, shell = named(pods, "web-"), named(pods, "debug-shell")
    web2 = sibling(web, "web-7d9c5b6f8-two22", "cpu-node-b", cpu="1500m", mem="1536Mi")
    web3 = sibling(web, "web-7d9c5b6f8-three", "cpu-node-b")  # just started: no CPU rate yet
    web4 = sibling(web, "web-7d9c5b6f8-four4", "cpu-node-c")  # not measured at all
    cache = ClusterCache()
    cache.replace_all(nodes, [*pods, web2, web3, web4])
    tel = cache.telemetry
    assert tel.app_usage is None  # no telemetry yet: as packing mode
    code = {b.ref[1]: b.pod.app for b in cache.pods.values()}
    assert code["web-7d9c5b6f8-two22"] == code["web-7d9c5b6f8-m4kqt"] == code["web-7d9c5b6f8-four4"]
    cadvisor = {
        ("shop", "web-7d9c5b6f8-m4kqt"): (0.25, 256 * MIB),  # requests 500m / 512Mi
        ("shop", "web-7d9c5b6f8-two22"): (1.0, 768 * MIB),  # requests 1500m / 1536Mi
        ("shop", "web-7d9c5b6f8-three"): (NAN, 100 * MIB),  # left out: CPU unknown
        ("staging", "web-7d9c5b6f8-m4kqt"): (4.0, 4096 * MIB),  # another namespace's pod
        ("shop", "ghost-0"): (1.0, MIB),  # a pod the cache does not count
        ("default", "debug-shell"): (0.05, 100 * MIB),  # BestEffort: non-zero requests 100m / 200Mi
    }
    cache.apply_telemetry(snap(pods=cadvisor))
    assert tel.app_usage is not None
    # web: (250 + 1000) m / (500 + 1500) m, (256 + 768) MiB / (512 + 1536) MiB
    assert tel.app_usage(code["web-7d9c5b6f8-m4kqt"]) == pytest.approx((0.625, 0.5), rel=1e-12)
    assert tel.app_usage(code["debug-shell"]) == pytest.approx((0.5, 0.5), rel=1e-12)
    assert tel.app_usage(code["redis-0"]) is None  # running, not measured
    assert tel.app_usage(12345) is None and tel.app_usage(-1) is None
    # the features' expected use: a new web replica follows its siblings, a stranger the cluster
    fresh = sibling(web, "web-7d9c5b6f8-newone", "cpu-node-a")
    del fresh["spec"]["nodeName"]
    cpu, mem, from_app, _, _ = expected_use_ratios(cache.state, cache.pod(fresh))
    assert (cpu, mem, from_app) == (pytest.approx(0.625), pytest.approx(0.5), True)
    stranger = sibling(shell, "lonely", "cpu-node-a")
    del stranger["spec"]["nodeName"]
    assert expected_use_ratios(cache.state, cache.pod(stranger))[2] is False
    # the table is swapped whole: a reader holding the old one sees it unchanged
    old = cache.app_table
    frozen = dict(old)
    cache.apply_telemetry(snap(pods={("shop", "web-7d9c5b6f8-m4kqt"): (0.5, 512 * MIB)}, at=1010.0))
    assert old == frozen and cache.app_table is not old
    assert tel.app_usage(code["web-7d9c5b6f8-m4kqt"]) == pytest.approx((1.0, 1.0))
    assert tel.app_usage(code["debug-shell"]) is None
    # Prometheus down: the last table stays; no cAdvisor: no application is observed
    cache.apply_telemetry(snap(up=False, at=0.0))
    assert tel.app_usage(code["web-7d9c5b6f8-m4kqt"]) == pytest.approx((1.0, 1.0))
    cache.apply_telemetry(snap(pods={}, at=1020.0))
    assert tel.app_usage(code["web-7d9c5b6f8-m4kqt"]) is None
    # a deleted pod no longer counts
    cache.apply_telemetry(snap(pods=cadvisor, at=1030.0))
    cache.delete_pod("uid-web-7d9c5b6f8-two22")
    cache.apply_telemetry(snap(pods=cadvisor, at=1040.0))
    assert tel.app_usage(code["web-7d9c5b6f8-m4kqt"]) == pytest.approx((0.5, 0.5))
    # a node rebuild keeps the lookup (and the table) until the next refresh
    bigger = copy.deepcopy(named(nodes, "cpu-node-b"))
    bigger["status"]["allocatable"]["cpu"] = "31"
    cache.upsert_node(bigger)
    assert cache.telemetry is not tel and cache.telemetry.app_usage(code["web-7d9c5b6f8-m4kqt"]) == (0.5, 0.5)


def test_a_pod_bound_by_uid_is_matched_once_named(objects):
    nodes, pods = objects
    web = named(pods, "web-")
    cache = ClusterCache()
    cache.replace_all(nodes, [])
    cache.bind(web["metadata"]["uid"], pod_from_json(web, cache.table.models), "cpu-node-a")
    assert cache.pods[web["metadata"]["uid"]].ref is None
    cache.apply_telemetry(snap(pods={("shop", "web-7d9c5b6f8-m4kqt"): (0.25, 256 * MIB)}))
    assert cache.app_table == {}  # bound by uid alone: not matched
    cache.upsert_pod(web)  # the watch's event: named, with its application
    b = cache.pods[web["metadata"]["uid"]]
    assert b.ref == ("shop", "web-7d9c5b6f8-m4kqt") and b.pod.app >= 0
    assert cache.state.cpu_req[cache.index["cpu-node-a"]] == 500  # counted once
    cache.apply_telemetry(snap(pods={("shop", "web-7d9c5b6f8-m4kqt"): (0.25, 256 * MIB)}, at=1001.0))
    assert cache.telemetry.app_usage(b.pod.app) == pytest.approx((0.5, 0.5))
    # the bind verb with the pod as the cache reads it and its ref: matched at once
    web2 = sibling(web, "web-7d9c5b6f8-two22", "cpu-node-b")
    del web2["spec"]["nodeName"]
    b2 = cache.bind("uid-web-7d9c5b6f8-two22", cache.pod(web2), "cpu-node-b", ref=pod_ref(web2))
    assert b2.ref == ("shop", "web-7d9c5b6f8-two22") and b2.pod.app == b.pod.app
    cache.apply_telemetry(snap(pods={("shop", "web-7d9c5b6f8-m4kqt"): (0.25, 256 * MIB),
                                     ("shop", "web-7d9c5b6f8-two22"): (0.75, 768 * MIB)}, at=1002.0))
    assert cache.telemetry.app_usage(b.pod.app) == pytest.approx((1.0, 1.0))
    assert pod_ref({"metadata": {"uid": "x"}}) is None and pod_ref({"metadata": {"name": "n"}}) == ("", "n")


def test_codes_of_owners_without_pods_are_forgotten_past_the_limit(objects, monkeypatch):
    nodes, pods = objects
    monkeypatch.setattr(cache_mod, "APP_CODES_KEPT", 10)
    cache = ClusterCache()
    cache.replace_all(nodes, pods)
    shell = named(pods, "debug-shell")
    bound = {b.uid: b.pod.app for b in cache.pods.values()}
    for i in range(20):  # pods scored and never bound (each its own application)
        cache.pod(sibling(shell, f"one-off-{i}", "cpu-node-a"))
    assert len(cache.apps) == 27
    cache.apply_telemetry(snap())
    assert len(cache.apps) == 7  # the bound pods' owners only
    assert {b.uid: b.pod.app for b in cache.pods.values()} == bound
    assert cache.pod(shell).app == bound[shell["metadata"]["uid"]]
    assert cache.pod(sibling(shell, "one-off-0", "cpu-node-a")).app == 27  # a new code, not a reused one


def test_concurrent_reads_of_app_usage_during_refreshes(objects):
    nodes, pods = objects
    web = named(pods, "web-")
    cache = ClusterCache()
    cache.replace_all(nodes, pods)
    app = cache.pods[web["metadata"]["uid"]].pod.app
    cache.apply_telemetry(snap(pods={("shop", web["metadata"]["name"]): (0.25, 256 * MIB)}))
    stop = threading.Event()
    seen: set = set()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                seen.add(cache.telemetry.app_usage(app))
        except BaseException as e:  # pragma: no cover - the failure being tested for
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for k in range(300):
        use = (0.25, 256 * MIB) if k % 2 else (0.5, 512 * MIB)
        cache.apply_telemetry(snap(pods={("shop", web["metadata"]["name"]): use}, at=1001.0 + k))
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert seen <= {(0.5, 0.5), (1.0, 1.0)} and seen


def test_windowed_peaks_reach_the_telemetry_and_node_load(objects):
    nodes, _ = objects
    cache = ClusterCache()
    cache.replace_all(nodes, [])
    a, b, c = (cache.index[n] for n in ("cpu-node-a", "cpu-node-b", "gpu-t4-0"))
    tel = cache.telemetry
    assert np.isnan(tel.cpu_peak).all() and np.isnan(tel.mem_peak).all()
    usage = {
        "cpu-node-a": NodeUsage(0.5, 0.25, NAN, NAN, 999.0, cpu_mean=0.4, cpu_std=0.05, mem_mean=0.3,
                                mem_std=0.01, cpu_peak=0.7, mem_peak=0.45),
        "cpu-node-b": NodeUsage(0.2, 0.1, NAN, NAN, 999.0),  # no statistics at all
        "gpu-t4-0": NodeUsage(0.6, 0.5, NAN, NAN, 999.0, cpu_mean=0.5, mem_mean=0.5, cpu_peak=0.3,
                              mem_peak=NAN),  # a peak below the mean, no memory peak
    }
    cache.apply_telemetry(snap(usage))
    assert (tel.cpu_peak[a], tel.mem_peak[a]) == (0.7, 0.45)
    assert np.isnan(tel.cpu_peak[b]) and np.isnan(tel.mem_peak[b]) and tel.cpu_peak[c] == 0.3
    load = node_load(cache.state, np.array([a, b, c]), with_peaks=True)
    assert load.cpu_peak.tolist() == pytest.approx([0.7, 0.2, 0.5])  # b: its use; c: never below the mean
    assert load.mem_peak.tolist() == pytest.approx([0.45, 0.1, 0.5])
    # a node rebuild puts them back to unknown until the next refresh
    bigger = copy.deepcopy(named(nodes, "cpu-node-b"))
    bigger["status"]["allocatable"]["cpu"] = "31"
    cache.upsert_node(bigger)
    assert np.isnan(cache.telemetry.cpu_peak).all()
    cache.apply_telemetry(snap(usage, at=1001.0))
    assert cache.telemetry.cpu_peak[cache.index["cpu-node-a"]] == 0.7
