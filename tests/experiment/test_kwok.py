"""kwok v0.8.0 (built from its Go module by ``scripts/build_k8s.sh``) against a real
kube-apiserver v1.37.2, as the kwok fleet runs it (:mod:`fedsched.experiment.kwok`): 120 nodes
of the openb GPU inventory made Ready and kept so, pods bound to them Running and then
Succeeded when the duration in their annotation has passed, deleted pods removed, and the use
in their annotations served on kwok's kubelet paths, scraped by a real Prometheus with the
fleet's recording rules into the series the agent's telemetry reads.

One module-scoped control plane; under CI a missing binary or Prometheus fails, never skips.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fedsched.agent.cluster.telemetry import PrometheusTelemetry
from fedsched.common.model.traces import builtin_trace, load_nodes, slice_cluster
from fedsched.experiment import kwok
from fedsched.experiment.control_plane import ControlPlane, control_plane
from fedsched.experiment.processes import wait_for
from fedsched.experiment.prometheus import PROMETHEUS, running_prometheus
from tests.k8s_support import kwok_binary

N_NODES = 120
NAMESPACE = "kwok-test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, kwok.Kwok, list[str]]]:
    kwok_binary()
    nodes = slice_cluster(load_nodes(builtin_trace("openb_node_list_gpu_node.csv")), N_NODES, 1)
    with control_plane(tmp_path_factory.mktemp("kwok")) as cp, kwok.start_kwok(cp) as kw:
        kwok.register_nodes(cp.api, nodes)
        cp.api.ensure_namespace(NAMESPACE)
        yield cp, kw, list(nodes.names)


def _pod(name: str, node: str, duration: str, cpu: str, mem: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {kwok.DURATION_ANNOTATION: duration,
                                                       kwok.USAGE_CPU_ANNOTATION: cpu,
                                                       kwok.USAGE_MEM_ANNOTATION: mem}},
            "spec": {"nodeName": node, "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]}}


def _phases(cp: ControlPlane) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"].get("phase", "") for p in cp.api.pods(NAMESPACE)}


def test_nodes_ready_and_untainted(cluster) -> None:
    cp, _, names = cluster
    nodes = cp.api.items("/api/v1/nodes", labelSelector=kwok.NODE_SELECTOR)
    assert len(nodes) == N_NODES >= 100
    for n in nodes:
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]), n
        assert not n["spec"].get("taints"), n["spec"]
    # kwok renews each node's Lease (a heartbeat a node lifecycle controller would read)
    leases = cp.api.items("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    assert {le["metadata"]["name"] for le in leases} >= set(names)


def test_pods_run_complete_and_are_deleted(cluster) -> None:
    cp, _, names = cluster
    for i in range(6):
        cp.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods",
                      _pod(f"life-{i}", names[i], "4s" if i % 2 == 0 else "600s", "500m", "1Gi"))
    wait_for(lambda: set(_phases(cp).values()) == {"Running"}, 60, 0.5, "every pod Running")
    running = cp.api.pods(NAMESPACE)[0]
    assert running["status"]["podIP"] and running["status"]["containerStatuses"][0]["state"]["running"]
    wait_for(lambda: sorted(_phases(cp).values()).count("Succeeded") == 3, 60, 0.5, "the 4 s pods Succeeded")
    phases = _phases(cp)
    assert {phases[f"life-{i}"] for i in (0, 2, 4)} == {"Succeeded"}
    assert {phases[f"life-{i}"] for i in (1, 3, 5)} == {"Running"}
    # a deletion with a grace period (no kubelet to confirm it): kwok removes the pod
    cp.api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/life-1", grace_seconds=30)
    wait_for(lambda: "life-1" not in _phases(cp), 30, 0.5, "the deleted pod gone")
    cp.api.delete_pods(NAMESPACE)


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)")
def test_usage_reaches_prometheus_and_telemetry(cluster, tmp_path) -> None:
    cp, kw, names = cluster
    node = names[10]
    cp.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", _pod("busy", node, "600s", "3000m", "8Gi"))
    wait_for(lambda: _phases(cp).get("busy") == "Running", 60, 0.5, "the busy pod Running")
    targets = kwok.write_targets(tmp_path / "targets.json", kw, names)
    with running_prometheus(tmp_path / "prom", kwok.scrape_configs(targets), kwok.recording_rules("20s"),
                            interval="2s") as prom:
        wait_for(lambda: len(prom.query(f'up{{job="{kwok.KUBELET_JOB}"}} == 1')) == N_NODES, 90, 1.0,
                 f"{N_NODES} kubelet targets up")
        # the agent's queries, with the per-pod CPU rate over 20 s (its 5-minute default
        # underestimates a new pod for five minutes: the test would have to wait that long)
        telemetry = PrometheusTelemetry(prom.url, timeout_s=10, pod_rate_window="20s")
        last: list = []

        def seen() -> bool:
            snap = telemetry.refresh()
            last[:] = [snap.up, snap.error, snap.nodes.get(node), snap.pods, snap.pods_error]
            use = snap.nodes.get(node)
            pod = snap.pods.get((NAMESPACE, "busy"))
            return bool(snap.up and use and use.cpu_ratio > 0 and pod and pod[0] > 0.8 * 3.0)

        try:
            wait_for(seen, 90, 2.0, "the busy pod's use in the agent's telemetry")
        except TimeoutError as e:
            series = prom.query("container_memory_working_set_bytes")
            raise AssertionError(f"{e}: {last}\n{series}\n{kw.metrics(node, 'metrics/cadvisor')[-1500:]}"
                                 f"\n{kw.log_tail()}") from None
        snap = telemetry.refresh()
        cores = float(cp.api.get(f"/api/v1/nodes/{node}")["status"]["capacity"]["cpu"])
        assert len(snap.nodes) == N_NODES
        use = snap.nodes[node]
        assert use.cpu_ratio == pytest.approx(3.0 / cores, rel=0.25)
        assert use.mem_ratio > 0
        pod_cpu, pod_mem = snap.pods[(NAMESPACE, "busy")]
        assert pod_cpu == pytest.approx(3.0, rel=0.25)
        assert pod_mem == 8 * 2**30
        idle = snap.nodes[names[50]]
        assert idle.cpu_ratio == 0 and idle.mem_ratio == 0
        assert time.time() - use.timestamp < 30
    cp.api.delete_pods(NAMESPACE)
