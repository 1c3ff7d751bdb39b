"""gRPC ``FilterNodes``: the extender's safety filter over the same decider, for the Score plugin's
Filter. For the same cluster state it refuses exactly the nodes the extender's filter verb
refuses, with the same reasons, and counts them in the same counter."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from bench.harness.extender_client import Client, metric
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.extender import ExtenderServer
from fedsched.agent.serving.grpc_service import DecisionClient, pod_spec_from_pod, serve_grpc
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.proto import decision_pb2
from tests.extender_support import payload, snapshot

NODES = {  # name: (node changes, (measured cpu share, measured memory share))
    "hot": ({}, (0.95, 0.1)),
    "cordoned": ({"spec": {"unschedulable": True}}, (0.1, 0.1)),
    "excluded": ({"labels": {"fedsched.io/exclude": "true"}}, (0.1, 0.1)),
    "ok": ({}, (0.5, 0.5)),
    "memhot": ({}, (0.2, 0.97)),
    "warm": ({}, (0.89, 0.89)),  # under both limits
}
CANDIDATES = ["ghost", *NODES]  # ghost: unknown to the agent's cache


@dataclass
class Both:
    decider: Decider
    http: Client
    grpc: DecisionClient


@pytest.fixture
def both() -> Iterator[Both]:
    """One decider behind the HTTP extender and the gRPC service, over nodes with measured use."""
    items = payload("03-prioritize-request.full-nodes.json")["Nodes"]["items"]
    nodes = []
    for name, (extra, _) in NODES.items():
        n = copy.deepcopy(items[0])
        n["metadata"]["name"] = name
        n["metadata"]["labels"].update(extra.get("labels", {}))
        n["spec"].update(extra.get("spec", {}))
        nodes.append(n)
    cache = ClusterCache()
    cache.replace_all(nodes, [])
    cache.apply_telemetry(snapshot({name: use for name, (_, use) in NODES.items()}))
    decider = Decider(cache, ModelStore("learned"), DeciderConfig(budget_ms=2000.0))
    extender = ExtenderServer(decider, port=0)
    extender.start()
    server, port = serve_grpc(decider, port=0)
    client = DecisionClient(f"127.0.0.1:{port}")
    http = Client(extender)
    try:
        client.wait_ready()
        yield Both(decider, http, client)
    finally:
        client.close()
        http.close()
        server.stop(None)
        extender.stop()
        decider.close()


def _pod(scheduler: str = "fedsched", uid: str = "u-1") -> dict:
    return pod_to_json(Pod(-1, 100, 100, 0, 0, 0, 1), "p", uid=uid, scheduler_name=scheduler)


def test_filter_nodes_refuses_what_the_extender_refuses_with_its_reasons(both: Both):
    pod = _pod()
    status, ext = both.http.post("filter", {"Pod": pod, "NodeNames": CANDIDATES})
    assert status == 200
    refused = both.grpc.filter_nodes(pod, CANDIDATES, timeout=10)
    assert refused == ext["FailedNodes"]
    assert set(refused) == {"ghost", "hot", "cordoned", "excluded", "memhot"}
    assert "cpu utilisation 0.95 > 0.90" in refused["hot"]
    assert "memory utilisation 0.97 > 0.90" in refused["memhot"]
    # Sent in request order, the passed nodes left out.
    resp = both.grpc.stub.FilterNodes(
        decision_pb2.FilterNodesRequest(pod_json=json.dumps(pod).encode(), node_names=CANDIDATES), timeout=10)
    assert [r.node for r in resp.refused] == [n for n in CANDIDATES if n in refused]
    # From a PodSpec too (the plugin's other form of the pod).
    assert both.grpc.filter_nodes(pod_spec_from_pod(Pod(-1, 100, 100, 0, 0, 0, 1)), CANDIDATES,
                                  timeout=10) == refused


def test_filter_nodes_counts_its_refusals_beside_the_extenders(both: Both):
    registry = both.decider.metrics.registry

    def refused(reason: str) -> float:
        return registry.get_sample_value("fedsched_refused_nodes_total", {"reason": reason}) or 0.0

    both.grpc.filter_nodes(_pod(), CANDIDATES, timeout=10)
    both.http.post("filter", {"Pod": _pod(), "NodeNames": CANDIDATES})
    assert refused("cpu") == refused("memory") == refused("unknown") == 2
    text = both.http.get("/metrics")[1]
    assert metric(text, "fedsched_requests_total", verb="FilterNodes", code="OK") == 1


def test_pods_of_other_profiles_have_nothing_refused(both: Both):
    assert both.grpc.filter_nodes(_pod(scheduler="default-scheduler"), CANDIDATES, timeout=10) == {}


def test_filter_nodes_starts_no_early_ranking(both: Both):
    """The extender's filter ranks the passed nodes at once for the coming prioritize; the
    plugin's PreScore candidates are every Filter plugin's, so FilterNodes leaves the worker free."""
    registry = both.decider.metrics.registry
    names = ["ok", "warm"]
    both.grpc.filter_nodes(_pod(uid="u-2"), names, timeout=10)
    assert both.decider._early is None
    resp = both.grpc.score_nodes(_pod(uid="u-2"), names, timeout=10)
    assert resp.source == "policy"
    for result in ("used", "stale", "unused"):
        assert registry.get_sample_value("fedsched_early_rankings_total", {"result": result}) in (None, 0.0)


def _bad_quantity() -> dict:
    pod = _pod()
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    return pod


@pytest.mark.parametrize("names,pod,what", [
    (["ok", "hot", "ok"], _pod(), "node 'ok' is named twice"),
    (["ok"], _bad_quantity(), "'lots' is not a Kubernetes quantity"),
], ids=["twice", "bad-quantity"])
def test_bad_filter_requests_are_invalid_argument(both: Both, names: list[str], pod: dict, what: str):
    with pytest.raises(grpc.RpcError) as e:
        both.grpc.filter_nodes(pod, names, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert what in e.value.details()


def test_filter_nodes_ends_the_assumption_of_the_pods_last_attempt():
    """As the extender's filter does: a pod asked about again did not bind last time, so the node
    the agent assumed it on no longer counts it when the nodes are judged."""
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv")).select(np.arange(40))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes)
    cache = ClusterCache.from_table(nodes)
    decider = Decider(cache, ModelStore("learned"), DeciderConfig(gate=None, assume=True, budget_ms=5_000.0))
    server, port = serve_grpc(decider, port=0)
    names = list(nodes.names)
    obj = pod_to_json(Pod.from_table(pods, 0), "p", nodes.models, uid="u")
    cache.upsert_pod(obj)
    pod = cache.pod(obj)
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            client.wait_ready(timeout=30)
            assert client.score_nodes(obj, names, timeout=30).source == "policy"
            assert "u" in cache.assumed and cache.state.cpu_req.sum() == pod.cpu
            client.filter_nodes(obj, names, timeout=30)  # the next attempt
            assert "u" not in cache.assumed and cache.state.cpu_req.sum() == 0
    finally:
        server.stop(None)
        decider.close()
