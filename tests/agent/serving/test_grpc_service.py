"""The gRPC decision service over a real server on loopback: scores, weights, status codes,
health, mutual TLS with fedsched's own CA, and deadlines with a model that does not answer in
time."""

from __future__ import annotations

import http.client
import itertools
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import node_to_json, pod_from_json, pod_to_json
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.extender import ExtenderServer
from fedsched.agent.serving.grpc_service import (
    SERVICE_NAME,
    DecisionClient,
    DecisionServer,
    pod_spec_from_pod,
    pod_spec_to_json,
    serve_grpc,
)
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.learning.nets import WEIGHT_TERMS
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace
from fedsched.common.proto import decision_pb2
from tests.extender_support import agent_pki

# (name, pod): a whole GPU, a shared GPU restricted to two models, a CPU pod, two whole GPUs.
PODS = [
    ("gpu-1", Pod(0, 4000, 8192, 1, 1000, 0, 1)),
    ("share-v100", Pod(0, 2000, 4096, 1, 500, 0b1100000, 2)),
    ("cpu", Pod(0, 8000, 16000, 0, 0, 0, 0)),
    ("gpu-2", Pod(0, 16000, 65536, 2, 1000, 0, 3)),
]


@pytest.fixture(scope="module")
def cache() -> ClusterCache:
    """The openb GPU cluster, empty; no test binds into it."""
    return ClusterCache.from_csv(builtin_trace("openb_node_list_gpu_node.csv"))


@dataclass
class Service:
    decider: Decider
    server: DecisionServer
    client: DecisionClient
    extender: ExtenderServer
    names: list[str]


@pytest.fixture(scope="module")
def svc(cache: ClusterCache) -> Iterator[Service]:
    """One decider behind both the HTTP extender and the gRPC service."""
    decider = Decider(
        cache,
        ModelStore("learned"),
        DeciderConfig(budget_ms=2000.0),  # the policy must answer here; the budget tests set their own
        weights_models=ModelStore("learned-td3"),
    )
    extender = ExtenderServer(decider, port=0)
    extender.start()
    server, port = serve_grpc(decider, port=0)
    client = DecisionClient(f"127.0.0.1:{port}")
    client.wait_ready()
    try:
        yield Service(decider, server, client, extender, list(cache.table.names))
    finally:
        client.close()
        server.stop(None)
        extender.stop()
        decider.close()


def _scores(resp: decision_pb2.ScoreNodesResponse) -> dict[str, int]:
    return {s.node: s.score for s in resp.scores}


def _check_complete(resp: decision_pb2.ScoreNodesResponse, names: list[str]) -> None:
    """Every candidate exactly once, in request order, each score in 0..100."""
    assert [s.node for s in resp.scores] == names
    assert all(0 <= s.score <= 100 for s in resp.scores)


def _extender_prioritize(ext: ExtenderServer, pod: dict, names: list[str]) -> list[dict]:
    conn = http.client.HTTPConnection("127.0.0.1", ext.port, timeout=10)
    try:
        conn.request(
            "POST",
            f"{ext.prefix}/prioritize",
            json.dumps({"Pod": pod, "NodeNames": names}),
            {"Content-Type": "application/json"},
        )
        r = conn.getresponse()
        assert r.status == 200
        return json.loads(r.read())
    finally:
        conn.close()


def _reset_tie_break(decider: Decider) -> None:
    """The same tie-break state for both transports (ties among equal nodes go to the rng)."""
    decider.rng = np.random.default_rng(decider.cfg.seed)


# ---- ScoreNodes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name,pod", PODS, ids=[n for n, _ in PODS])
def test_score_nodes_answers_every_node_once_from_spec_and_from_json(svc: Service, name: str, pod: Pod):
    models = svc.decider.cache.table.models
    names = list(np.random.default_rng(7).permutation(svc.names))  # request order is kept
    spec = pod_spec_from_pod(pod, models, name=name, uid=f"uid-{name}")
    obj = pod_to_json(pod, name, models)
    assert (
        pod_from_json(pod_spec_to_json(spec), models) == pod_from_json(obj, models) == replace(pod, index=-1)
    )

    _reset_tie_break(svc.decider)
    by_spec = svc.client.score_nodes(spec, names, timeout=10)
    _reset_tie_break(svc.decider)
    by_json = svc.client.score_nodes(obj, names, timeout=10)
    for resp in (by_spec, by_json):
        _check_complete(resp, names)
        assert resp.source == "policy" and resp.fallback_reason == ""
        assert resp.model_version == svc.decider.models.version
        assert sum(s.score == 100 for s in resp.scores) == 1
    assert _scores(by_spec) == _scores(by_json)  # the same pod either way
    if pod.spec_mask:  # nodes of other GPU models do not fit: 0
        allowed = {i for i, m in enumerate(models) if (pod.spec_mask >> i) & 1}
        table = svc.decider.cache.table
        for n, s in _scores(by_spec).items():
            if int(table.model[svc.decider.cache.index[n]]) not in allowed:
                assert s == 0


@pytest.mark.parametrize("name,pod", PODS[:3], ids=[n for n, _ in PODS[:3]])
def test_the_node_at_100_is_the_extenders_pick(svc: Service, name: str, pod: Pod):
    obj = pod_to_json(pod, name, svc.decider.cache.table.models)
    _reset_tie_break(svc.decider)
    http_scores = {h["Host"]: h["Score"] for h in _extender_prioritize(svc.extender, obj, svc.names)}
    _reset_tie_break(svc.decider)
    grpc_scores = _scores(svc.client.score_nodes(obj, svc.names, timeout=10))
    assert set(http_scores) == set(grpc_scores) == set(svc.names)
    assert [n for n, s in http_scores.items() if s == 10] == [n for n, s in grpc_scores.items() if s == 100]
    # the 0..100 scores refine the extender's 0..10: never a contradicting order
    by_grpc = sorted(svc.names, key=lambda n: grpc_scores[n])
    assert all(http_scores[a] <= http_scores[b] for a, b in itertools.pairwise(by_grpc))


def test_pods_of_other_profiles_get_a_neutral_answer(svc: Service):
    spec = pod_spec_from_pod(PODS[0][1], scheduler_name="default-scheduler")
    resp = svc.client.score_nodes(spec, svc.names[:50], timeout=10)
    _check_complete(resp, svc.names[:50])
    assert resp.source == "neutral" and all(s.score == 0 for s in resp.scores)


def test_unknown_nodes_score_zero(svc: Service):
    names = [*svc.names[:20], "no-such-node"]
    resp = svc.client.score_nodes(pod_spec_from_pod(PODS[0][1]), names, timeout=10)
    _check_complete(resp, names)
    assert _scores(resp)["no-such-node"] == 0 and resp.source == "policy"


# ---- GetSchedulingWeights -----------------------------------------------------------------------


def test_weights_of_the_td3_policy_sum_to_one(svc: Service):
    for name, pod in PODS:
        resp = svc.client.weights(pod_spec_from_pod(pod, svc.decider.cache.table.models, name), svc.names, 10)
        assert resp.fallback_reason == ""
        assert resp.model_version == svc.decider.weights_models.version
        assert set(resp.weights) == set(WEIGHT_TERMS)
        assert all(w >= 0 for w in resp.weights.values())
        assert math.isclose(sum(resp.weights.values()), 1.0, abs_tol=1e-5)


def test_weights_from_a_node_scoring_model_is_failed_precondition(cache: ClusterCache):
    decider = Decider(cache, ModelStore("learned"), DeciderConfig(budget_ms=2000.0))
    server, port = serve_grpc(decider, port=0)
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            with pytest.raises(grpc.RpcError) as err:
                client.weights(pod_spec_from_pod(PODS[0][1]), list(cache.table.names[:10]), timeout=10)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "node-scoring" in err.value.details()
        value = decider.metrics.registry.get_sample_value(
            "fedsched_requests_total", {"verb": "GetSchedulingWeights", "code": "FAILED_PRECONDITION"}
        )
        assert value == 1.0
    finally:
        server.stop(None)
        decider.close()


# ---- bad input ----------------------------------------------------------------------------------


def _bad_requests(names: list[str]) -> list[tuple[str, decision_pb2.ScoreNodesRequest, str]]:
    def json_req(raw: bytes) -> decision_pb2.ScoreNodesRequest:
        return decision_pb2.ScoreNodesRequest(pod_json=raw, node_names=names)

    bad_quantity = pod_to_json(PODS[0][1], "p")
    bad_quantity["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    bad_qos = pod_to_json(PODS[0][1], "p")
    bad_qos["metadata"]["annotations"]["fedsched.io/qos"] = "platinum"
    spec = pod_spec_from_pod(PODS[0][1])
    negative, too_much = decision_pb2.PodSpec(), decision_pb2.PodSpec()
    negative.CopyFrom(spec)
    negative.cpu_milli = -5
    too_much.CopyFrom(spec)
    too_much.gpu_milli = 1500
    return [
        ("not json", json_req(b"{not json"), "not valid JSON"),
        ("a list", json_req(b"[1, 2]"), "JSON object"),
        ("NaN", json_req(b'{"metadata": {"x": NaN}}'), "not valid JSON"),
        ("bad quantity", json_req(json.dumps(bad_quantity).encode()), "'lots' is not a Kubernetes quantity"),
        ("bad qos", json_req(json.dumps(bad_qos).encode()), "unknown QoS"),
        ("negative cpu", decision_pb2.ScoreNodesRequest(spec=negative, node_names=names), "cpu_milli"),
        ("gpu share", decision_pb2.ScoreNodesRequest(spec=too_much, node_names=names), "gpu_milli"),
        ("no pod", decision_pb2.ScoreNodesRequest(node_names=names), "no pod"),
        (
            "twice",
            decision_pb2.ScoreNodesRequest(spec=spec, node_names=[*names, names[0]]),
            "named twice",
        ),
    ]


def test_unreadable_pods_are_invalid_argument_with_a_clear_message(svc: Service):
    names = svc.names[:10]
    metric = svc.decider.metrics.registry.get_sample_value
    before = metric("fedsched_requests_total", {"verb": "ScoreNodes", "code": "INVALID_ARGUMENT"}) or 0.0
    cases = _bad_requests(names)
    for label, req, words in cases:
        with pytest.raises(grpc.RpcError) as err:
            svc.client.stub.ScoreNodes(req, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, label
        assert words in err.value.details(), (label, err.value.details())
    for label, req, words in cases[:6]:  # the weights RPC reads pods the same way
        wreq = decision_pb2.GetSchedulingWeightsRequest()
        wreq.ParseFromString(req.SerializeToString())  # same field numbers
        with pytest.raises(grpc.RpcError) as err:
            svc.client.stub.GetSchedulingWeights(wreq, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, label
        assert words in err.value.details(), (label, err.value.details())
    after = metric("fedsched_requests_total", {"verb": "ScoreNodes", "code": "INVALID_ARGUMENT"})
    assert after == before + len(cases)
    # the service still answers, and measured the good requests under the model version
    assert svc.client.score_nodes(pod_spec_from_pod(PODS[0][1]), names, timeout=10).source == "policy"
    count = metric(
        "fedsched_decision_seconds_count", {"verb": "ScoreNodes", "model_version": svc.decider.models.version}
    )
    assert count is not None and count >= 1


# ---- health -------------------------------------------------------------------------------------


def _wait_status(client: DecisionClient, want: str, service: str = "", timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = client.health(service, timeout=2)
        if status == want:
            return status
        time.sleep(0.05)
    return status


def test_health_is_serving_once_the_cache_is_synced_and_not_serving_on_stop(svc: Service):
    assert _wait_status(svc.client, "SERVING") == "SERVING"
    assert _wait_status(svc.client, "SERVING", SERVICE_NAME) == "SERVING"

    table = svc.decider.cache.table
    cache = ClusterCache()  # a Kubernetes-fed cache before its first list
    decider = Decider(cache, ModelStore("learned"), DeciderConfig())
    server, port = serve_grpc(decider, port=0, ready_poll_s=0.05)
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            assert client.health(timeout=5) == "NOT_SERVING"
            cache.replace_all([node_to_json(table, i) for i in range(5)], [])
            assert _wait_status(client, "SERVING") == "SERVING"
            assert _wait_status(client, "SERVING", SERVICE_NAME) == "SERVING"
    finally:
        server.stop(None)
        decider.close()
    req = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    assert server.health.Check(req, None).status == health_pb2.HealthCheckResponse.NOT_SERVING


# ---- mutual TLS ---------------------------------------------------------------------------------


def test_mutual_tls_with_certificates_from_our_ca(svc: Service, tmp_path):
    pki = agent_pki(tmp_path)
    srv, cli, intruder, ca = pki.server, pki.client, pki.intruder, pki.ca
    server, port = serve_grpc(svc.decider, port=0, tls=(srv.files.cert, srv.files.key, ca))
    target = f"127.0.0.1:{port}"
    names = svc.names[:30]
    pod = pod_spec_from_pod(PODS[0][1])

    def call(tls) -> decision_pb2.ScoreNodesResponse:
        with DecisionClient(target, tls=tls) as client:
            return client.score_nodes(pod, names, timeout=5)

    try:
        ok = call((ca, cli.files.cert, cli.files.key))
        _check_complete(ok, names)
        refused = {
            "no client certificate": (ca, None, None),
            "a certificate of another CA": (ca, intruder.files.cert, intruder.files.key),
            "plaintext": None,
        }
        for label, tls in refused.items():
            with pytest.raises(grpc.RpcError) as err:
                call(tls)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, label
        # a refused handshake does not hurt the server
        _check_complete(call((ca, cli.files.cert, cli.files.key)), names)
        with DecisionClient(target, tls=(ca, cli.files.cert, cli.files.key)) as client:
            assert client.health(SERVICE_NAME, timeout=5) == "SERVING"
    finally:
        server.stop(None)


# ---- deadlines ----------------------------------------------------------------------------------
#
# The policy is held (an Event the test releases at the end), not slowed by a sleep: it never
# answers in time however loaded the machine is, and the assertions are about what answers and
# within which deadline, with margins of seconds, not about the machine's speed. The service keeps
# DEADLINE_SHARE of the client's time for the answer's way back (hundreds of milliseconds here),
# which a loaded 2-core machine's thread hand-offs do not eat.

#: The client's deadline when it binds: the fallback answers about DEADLINE_SHARE of it early.
CLIENT_DEADLINE_S = 3.0


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: a held policy call returns and the worker is free again."""
    ev = threading.Event()
    try:
        yield ev
    finally:
        ev.set()


def _hold(monkeypatch, obj: object, name: str, release: threading.Event) -> threading.Event:
    """Make ``obj.name`` wait for ``release`` before it answers; the event returned is set once
    it has been called."""
    real, entered = getattr(obj, name), threading.Event()

    def held(*args, **kwargs):
        entered.set()
        release.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, held)
    return entered


@pytest.mark.parametrize(
    "budget_ms,timeout_s",
    [(200.0, 30.0), (60_000.0, CLIENT_DEADLINE_S)],
    ids=["budget-binds", "client-deadline-binds"],
)
def test_a_slow_model_gets_the_fallback_within_the_deadline(
    cache: ClusterCache, monkeypatch, release: threading.Event, budget_ms: float, timeout_s: float
):
    decider = Decider(cache, ModelStore("learned"), DeciderConfig(budget_ms=budget_ms))
    entered = _hold(monkeypatch, decider.models.current.scheduler, "score", release)
    server, port = serve_grpc(decider, port=0)
    names = list(cache.table.names)
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            client.wait_ready(timeout=30)
            t = time.perf_counter()
            # A DEADLINE_EXCEEDED here would be the failure: the answer must beat the deadline.
            resp = client.score_nodes(pod_spec_from_pod(PODS[0][1]), names, timeout=timeout_s)
            elapsed = time.perf_counter() - t
        assert entered.is_set()  # the policy was asked, and the fallback answered for it
        assert resp.source == "fallback" and resp.fallback_reason == "timeout"
        # It waited for the tighter of the two bounds, less the margin kept for the answer.
        assert elapsed >= 0.5 * min(budget_ms / 1000.0, timeout_s), elapsed
        _check_complete(resp, names)
        assert max(s.score for s in resp.scores) > 0  # kube-default scores, not a neutral answer
        value = decider.metrics.registry.get_sample_value(
            "fedsched_fallbacks_total", {"reason": "timeout", "model_version": decider.models.version}
        )
        assert value == 1.0
    finally:
        release.set()
        server.stop(None)
        decider.close()


def test_a_slow_weight_policy_gets_the_default_weights_within_the_deadline(
    cache: ClusterCache, monkeypatch, release: threading.Event
):
    decider = Decider(
        cache,
        ModelStore("learned"),
        DeciderConfig(budget_ms=60_000.0),  # the client's deadline binds
        weights_models=ModelStore("learned-td3"),
    )
    entered = _hold(monkeypatch, decider.weights_models.current.scheduler, "weights", release)
    server, port = serve_grpc(decider, port=0)
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            client.wait_ready(timeout=30)
            t = time.perf_counter()
            # A DEADLINE_EXCEEDED here would be the failure: the answer must beat the deadline.
            resp = client.weights(pod_spec_from_pod(PODS[0][1]), list(cache.table.names),
                                  timeout=CLIENT_DEADLINE_S)
            elapsed = time.perf_counter() - t
        assert entered.is_set()
        assert resp.fallback_reason == "timeout"
        assert resp.weights["free_cpu"] == resp.weights["free_mem"] == 0.5
        assert math.isclose(sum(resp.weights.values()), 1.0)
        assert elapsed >= 0.5 * CLIENT_DEADLINE_S, elapsed  # it waited for the policy first
    finally:
        release.set()
        server.stop(None)
        decider.close()

