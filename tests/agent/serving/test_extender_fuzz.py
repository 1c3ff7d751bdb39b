"""Property-based and fuzz tests of the scheduler extender over real HTTP (hypothesis).

One real :class:`~fedsched.agent.serving.extender.ExtenderServer` on loopback serves the whole module:
60 nodes (50 openb GPU nodes across the GPU models, 8 CPU-only nodes of the synthetic ``web``
profile, one cordoned and one ``fedsched.io/exclude=true`` node) with some openb pods bound,
acting on every pod (``scheduler_name=None``). The properties:

- prioritize answers every candidate exactly once, in request order, with an integer score in
  0..10, and 0 for nodes the cache does not know or where the pod does not fit, for arbitrary
  duplicate-free lists of known and unknown names and arbitrary valid pods (from random
  :class:`~fedsched.common.model.cluster.Pod` values through ``pod_to_json``, and raw Pod JSON with
  quantities such as "1.5", "250m", "2Gi", "1e3", several containers, init containers,
  overhead, GPU annotations and model constraints);
- the safety filter never admits a node whose fresh telemetry is above a threshold, for random
  utilisations, ages and thresholds; FailedNodes and NodeNames partition the request, nothing
  outside the request is named, and every refusal has a reason the telemetry supports;
- arbitrary JSON values, byte strings and wrongly typed fields for every verb, and random
  methods and paths, get 200 or a 4xx (never a 5xx), never an internal error, and the server
  keeps answering (the keep-alive connection stays in step).

The inputs that broke the server when these tests were written are pinned as regression
cases (among them a quantity that overflows milli-cores and a node without allocatable CPU).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.extender_client import Client
from bench.harness.fuzz_strategies import (
    JSON,
    METHODS,
    PATHS,
    PREFIX,
    PROFILE_PODS,
    RAW_BODIES,
    VERBS,
    verb_bodies,
)
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import (
    GPU_COUNT_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    GPU_RESOURCE,
    QOS_ANNOTATION,
    node_to_json,
    pod_to_json,
)
from fedsched.agent.cluster.telemetry import NodeUsage, TelemetrySnapshot
from fedsched.agent.serving.decider import EXCLUDE_LABEL, SafetyConfig
from fedsched.agent.serving.extender import ExtenderServer
from fedsched.common.model.cluster import QOS_CLASSES, NodeTable, Pod
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from tests.extender_support import running

FRESH_AGE_S = (0.0, 30.0)  # telemetry ages drawn as fresh (stale_after_s is 60 s)
STALE_AGE_S = (120.0, 3600.0)  # and as stale
SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Agent:
    server: ExtenderServer
    client: Client
    cache: ClusterCache
    known: list[str]  # the cluster's node names
    refused: set[str]  # cordoned or excluded: refused by the filter whatever their telemetry
    models: tuple[str, ...]  # the cluster's GPU model vocabulary


def _cluster() -> tuple[NodeTable, list[dict]]:
    """50 openb GPU nodes spread over the trace (every GPU model) and 8 CPU-only web nodes,
    plus a cordoned and an excluded node as Node objects."""
    openb = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    gpu = openb.select(np.linspace(0, len(openb) - 1, 50).astype(np.int64))
    web, _ = generate_cluster("web", seed=0)
    web = web.select(np.arange(8))
    table = NodeTable(
        names=gpu.names + web.names,
        cpu=np.concatenate([gpu.cpu, web.cpu]),
        mem=np.concatenate([gpu.mem, web.mem]),
        gpu=np.concatenate([gpu.gpu, web.gpu]),
        model=np.concatenate([gpu.model, np.full(len(web), -1)]),
        models=gpu.models,
        disk_io=np.concatenate([gpu.disk_io, web.disk_io]),
        net=np.concatenate([gpu.net, web.net]),
    )
    cordoned = node_to_json(table, 0)
    cordoned["metadata"]["name"] = "cordoned-node"
    cordoned["spec"]["unschedulable"] = True
    excluded = node_to_json(table, 1)
    excluded["metadata"]["name"] = "excluded-node"
    excluded["metadata"]["labels"][EXCLUDE_LABEL] = "true"
    return table, [cordoned, excluded]


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    table, extra = _cluster()
    cache = ClusterCache.from_table(table)
    for obj in extra:
        cache.upsert_node(obj)
    # A cluster that is not empty: openb pods bound first-fit on every third node.
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), table, allow_oversized=True)
    rng = np.random.default_rng(0)
    for k, i in enumerate(rng.choice(len(pods), 120, replace=False)):
        pod = Pod.from_table(pods, int(i))
        with cache.lock:
            fits = np.flatnonzero(cache.state.feasible(pod) & cache.schedulable)
        fits = fits[fits % 3 == 0]
        if len(fits):
            cache.bind(f"prefill-{k}", pod, cache.table.names[int(fits[0])])
    with running(cache, scheduler_name=None) as (server, client):
        yield Agent(
            server,
            client,
            cache,
            list(cache.table.names),
            {"cordoned-node", "excluded-node"},
            cache.table.models,
        )
        assert client.get("/healthz")[0] == 200


def _fallbacks(agent: Agent, reason: str) -> float:
    """fedsched_fallbacks_total{reason} over every model version."""
    return sum(
        s.value
        for fam in agent.server.decider.metrics.fallbacks.collect()
        for s in fam.samples
        if s.name == "fedsched_fallbacks_total" and s.labels.get("reason") == reason
    )


def _internal_errors(agent: Agent) -> float:
    """Requests the server failed to handle (answered neutrally and counted)."""
    return _fallbacks(agent, "internal")


# ---- strategies: valid requests -------------------------------------------------------------


@st.composite
def pod_values(draw: st.DrawFn, models: tuple[str, ...]) -> Pod:
    kind = draw(st.sampled_from(["cpu", "share", "whole"]))
    if kind == "cpu":
        num_gpu, milli = 0, 0
    elif kind == "share":
        num_gpu, milli = 1, draw(st.integers(1, 999))
    else:
        num_gpu, milli = draw(st.integers(1, 8)), 1000
    mask = draw(st.integers(0, 2 ** len(models) - 1)) if num_gpu else 0
    return Pod(
        index=-1,
        cpu=draw(st.integers(0, 128_000)),
        mem=draw(st.integers(0, 1_048_576)),
        num_gpu=num_gpu,
        gpu_milli=milli,
        spec_mask=mask,
        qos=draw(st.integers(0, len(QOS_CLASSES) - 1)),
    )


def _quantity(suffixes: list[str]) -> st.SearchStrategy:
    literal = st.sampled_from(["1.5", "250m", "2Gi", "1e3", "0", "0.25", "1k", "3", "512Mi", "1.5Gi", "2e2m"])
    built = st.builds(lambda n, s: f"{n}{s}", st.integers(0, 100_000), st.sampled_from(suffixes))
    number = st.integers(0, 10**6) | st.floats(0, 1e6, allow_nan=False)
    return literal | built | number


CPU_QTY = _quantity(["", "m", "k"])
MEM_QTY = _quantity(["", "Ki", "Mi", "Gi", "k", "M", "G"])


@st.composite
def raw_pods(draw: st.DrawFn, models: tuple[str, ...]) -> dict:
    """Valid Pod JSON written by hand (not by pod_to_json): the forms kubectl users write."""

    def container(gpus: int) -> dict:
        requests: dict = {}
        if draw(st.booleans()):
            requests["cpu"] = draw(CPU_QTY)
        if draw(st.booleans()):
            requests["memory"] = draw(MEM_QTY)
        res: dict = {}
        if gpus and draw(st.booleans()):
            res["limits"] = {GPU_RESOURCE: str(gpus)}  # the API server defaults requests from limits
        elif gpus:
            requests[GPU_RESOURCE] = str(gpus)
        if requests or draw(st.booleans()):
            res["requests"] = requests
        return {"name": draw(st.text(max_size=8)), "image": "pause", "resources": res}

    whole = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    spec: dict = {"containers": [container(g) for g in whole]}
    if draw(st.booleans()):
        spec["initContainers"] = [container(0) for _ in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        spec["overhead"] = {"cpu": draw(CPU_QTY), "memory": draw(MEM_QTY)}
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["fedsched", "default-scheduler", "other"]))
    ann: dict = {}
    share = draw(st.sampled_from(["none", "share", "whole"]))
    if share == "share":
        ann[GPU_MILLI_ANNOTATION] = str(draw(st.integers(1, 999)))
        if draw(st.booleans()):
            ann[GPU_COUNT_ANNOTATION] = "1"
    elif share == "whole":
        ann[GPU_MILLI_ANNOTATION] = "1000"
        ann[GPU_COUNT_ANNOTATION] = str(draw(st.integers(0, 8)))
    if draw(st.booleans()):
        wanted = draw(st.lists(st.sampled_from([*models, "H100", "unknown-model"]), max_size=3))
        ann[GPU_MODEL_ANNOTATION] = ",".join(wanted)
    if draw(st.booleans()):
        ann[QOS_ANNOTATION] = draw(st.sampled_from(["BE", "Burstable", "LS", "Guaranteed", "besteffort"]))
    meta = {"name": draw(st.text(max_size=10)), "namespace": "default", "annotations": ann}
    if draw(st.booleans()):
        meta["uid"] = draw(st.uuids()).hex
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def pod_objects(models: tuple[str, ...]) -> st.SearchStrategy:
    from_values = st.builds(
        lambda pod, n: pod_to_json(pod, f"pod-{n}", models, uid=f"uid-{n}"),
        pod_values(models),
        st.integers(0, 10**9),
    )
    return from_values | raw_pods(models)


def candidate_names(known: list[str]) -> st.SearchStrategy:
    unknown = st.text(max_size=12).map(lambda s: "unknown-" + s)
    return st.lists(st.sampled_from(known) | unknown, unique=True, max_size=70)


def _post(agent: Agent, verb: str, body: object) -> tuple[int, object]:
    status, data = agent.client.raw("POST", f"{PREFIX}/{verb}", json.dumps(body).encode())
    return status, json.loads(data)


# ---- properties -----------------------------------------------------------------------------


def test_prioritize_answers_every_candidate_once_in_order(agent: Agent) -> None:
    @SETTINGS
    @given(pod=pod_objects(agent.models), names=candidate_names(agent.known))
    def check(pod: dict, names: list[str]) -> None:
        status, out = _post(agent, "prioritize", {"Pod": pod, "NodeNames": names})
        assert status == 200, out
        assert isinstance(out, list)
        assert [h["Host"] for h in out] == names
        for h in out:
            assert set(h) == {"Host", "Score"}
            assert type(h["Score"]) is int and 0 <= h["Score"] <= 10, h
        cache = agent.cache
        p = cache.pod(pod)
        with cache.lock:
            fits = cache.state.feasible(p) & cache.schedulable
            for h in out:
                i = cache.index.get(h["Host"])
                if i is None or not fits[i]:
                    assert h["Score"] == 0, (h, "unknown" if i is None else "does not fit")

    errors = _internal_errors(agent)
    check()
    assert _internal_errors(agent) == errors


def test_prioritize_with_full_nodes_answers_them_in_order(agent: Agent) -> None:
    """The non-nodeCacheCapable form: Node objects of known nodes in Nodes.items."""
    index = {n: i for i, n in enumerate(agent.cache.table.names)}
    table = agent.cache.table

    @settings(SETTINGS, max_examples=60)
    @given(pod=pod_objects(agent.models), names=st.lists(st.sampled_from(agent.known), unique=True))
    def check(pod: dict, names: list[str]) -> None:
        items = [node_to_json(table, index[n]) for n in names]
        status, out = _post(agent, "prioritize", {"Pod": pod, "Nodes": {"metadata": {}, "items": items}})
        assert status == 200, out
        assert [h["Host"] for h in out] == names
        assert all(type(h["Score"]) is int and 0 <= h["Score"] <= 10 for h in out)

    check()


@dataclass(frozen=True)
class Usage:
    cpu: float
    mem: float
    age_s: float

    @property
    def fresh(self) -> bool:
        return self.age_s <= FRESH_AGE_S[1]


RATIO = st.floats(0.0, 1.5) | st.just(math.nan)
USAGE = st.builds(
    Usage,
    RATIO,
    RATIO,
    st.floats(*FRESH_AGE_S) | st.floats(*STALE_AGE_S),
)


def test_safety_filter_never_admits_a_node_above_its_threshold(agent: Agent) -> None:
    decider = agent.server.decider
    original = decider.cfg.safety
    n_known = len(agent.known)

    @SETTINGS
    @given(
        pod=pod_objects(agent.models),
        names=candidate_names(agent.known),
        usage=st.lists(USAGE, min_size=n_known, max_size=n_known),
        cpu_t=st.floats(0.05, 1.0),
        mem_t=st.floats(0.05, 1.0),
        share=st.floats(0.0, 1.0),
        up=st.booleans(),
    )
    def check(
        pod: dict, names: list[str], usage: list[Usage], cpu_t: float, mem_t: float, share: float, up: bool
    ) -> None:
        decider.cfg.safety = SafetyConfig(cpu_t, mem_t, 60.0, share)
        now = time.time()
        by_node = dict(zip(agent.known, usage, strict=True))
        nodes = {n: NodeUsage(u.cpu, u.mem, math.nan, math.nan, now - u.age_s) for n, u in by_node.items()}
        agent.cache.apply_telemetry(TelemetrySnapshot(True, now, nodes))
        if not up:  # Prometheus went down after that snapshot: nothing refused for staleness
            agent.cache.apply_telemetry(TelemetrySnapshot(False, now, nodes, "connection refused"))
        status, out = _post(agent, "filter", {"Pod": pod, "NodeNames": names})
        assert status == 200, out
        assert out["Error"] == "" and out["Nodes"] is None
        passed, failed = out["NodeNames"], out["FailedNodes"]
        unresolvable = out["FailedAndUnresolvableNodes"]
        # A partition of the request, nothing outside it, the passed ones in request order.
        assert not set(passed) & set(failed)
        assert set(passed) | set(failed) == set(names)
        assert set(unresolvable) <= set(names) and not set(unresolvable) & set(passed)
        assert passed == [n for n in names if n in set(passed)]
        for n in passed:
            u = by_node.get(n)
            assert u is not None, f"{n} is unknown but passed"
            assert n not in agent.refused, n
            if u.fresh:  # NaN (no series) compares False: not judged, as documented
                assert not u.cpu > cpu_t, (n, u, cpu_t)
                assert not u.mem > mem_t, (n, u, mem_t)
        stale_refusals = 0
        for n, reason in failed.items():
            u = by_node.get(n)
            if u is None or n in agent.refused:
                continue
            if "GPUs" in reason:  # refused by the agent's GPU accounting: the pod's GPUs do not fit
                p = agent.cache.pod(pod)
                i = agent.cache.index[n]
                free = agent.cache.state.gpu_free[i]
                fits = bool((free >= p.gpu_milli).any() if p.is_gpu_share
                            else (free >= 1000).sum() >= p.num_gpu)
                assert p.num_gpu > 0 and not (fits and agent.cache.state.model_ok(p)[i]), (n, reason)
                continue
            if u.fresh:
                assert u.cpu > cpu_t or u.mem > mem_t, (n, u, reason)
            else:  # stale telemetry is never judged against the thresholds
                assert "telemetry" in reason, (n, u, reason)
                stale_refusals += 1
        if not up:
            assert stale_refusals == 0
        assert stale_refusals <= math.floor(share * len(names) + 1e-9)

    try:
        check()
    finally:
        decider.cfg.safety = original


# ---- fuzz (strategies in bench/harness/fuzz_strategies.py, shared with the load benchmark) ----


def _no_5xx(agent: Agent, method: str, path: str, body: bytes | None) -> int:
    status, data = agent.client.raw(method, path, body)
    assert status < 500, (status, data[:500])
    assert status == 200 or 400 <= status < 500, status
    if method == "POST" and data:
        json.loads(data)  # every answer to a POST is JSON, errors included
    return status


def test_fuzzed_bodies_get_200_or_4xx_and_never_an_internal_error(agent: Agent) -> None:
    verbs = st.sampled_from(VERBS)
    bodies = verb_bodies(agent.known)

    @settings(SETTINGS, max_examples=300)
    @given(data=st.data(), verb=verbs)
    def check(data: st.DataObject, verb: str) -> None:
        body = data.draw(bodies[verb] | JSON, label="body")
        before = _internal_errors(agent)
        _no_5xx(agent, "POST", f"{PREFIX}/{verb}", json.dumps(body).encode())
        assert _internal_errors(agent) == before, f"internal error on {verb}: {body!r}"

    check()
    assert agent.client.get("/healthz")[0] == 200


def test_fuzzed_pods_of_other_profiles_never_get_an_internal_error(agent: Agent) -> None:
    """With a profile name set (the production default), pods of other profiles take the neutral
    path, which reads the pod less than the policy path does."""
    decider = agent.server.decider

    @settings(SETTINGS, max_examples=150)
    @given(verb=st.sampled_from(["filter", "prioritize"]), pod=PROFILE_PODS,
           names=st.lists(st.sampled_from(agent.known), unique=True, max_size=5))
    def check(verb: str, pod: object, names: list[str]) -> None:
        before = _internal_errors(agent)
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        status = _no_5xx(agent, "POST", f"{PREFIX}/{verb}", body)
        assert _internal_errors(agent) == before, (verb, pod)
        spec = pod.get("spec") if isinstance(pod, dict) else None
        if status == 200 and isinstance(spec, dict) and spec.get("schedulerName") != "fedsched":
            status, out = agent.client.raw("POST", f"{PREFIX}/{verb}", body)
            out = json.loads(out)
            if verb == "prioritize":  # another profile's pod: every node 0
                assert out == [{"Host": n, "Score": 0} for n in names]
            else:  # and every node passes
                assert out["NodeNames"] == names and out["FailedNodes"] == {}

    decider.cfg.scheduler_name = "fedsched"
    try:
        check()
    finally:
        decider.cfg.scheduler_name = None


def test_arbitrary_bytes_methods_and_paths_never_get_a_5xx(agent: Agent) -> None:
    @settings(SETTINGS, max_examples=250)
    @given(method=METHODS, path=PATHS, body=RAW_BODIES)
    def check(method: str, path: str, body: bytes) -> None:
        before = _internal_errors(agent)
        _no_5xx(agent, method, path, body if method not in ("GET", "HEAD") else None)
        assert _internal_errors(agent) == before, (method, path, body)

    check()
    assert agent.client.get("/healthz")[0] == 200


def _node(name: str, cpu: str = "4", gpus: str | None = None) -> dict:
    alloc = {"cpu": cpu, "memory": "1Gi", **({GPU_RESOURCE: gpus} if gpus else {})}
    return {"metadata": {"name": name}, "status": {"allocatable": alloc}}


_CPU_POD = {"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}}


@pytest.mark.parametrize(
    ("method", "verb", "body", "status"),
    [
        # Nodes the cluster model cannot hold used to fail the cache's rebuild after it had
        # changed its node list: every node learned later failed too (internal errors).
        ("POST", "filter", {"Pod": _CPU_POD, "Nodes": {"items": [_node("fuzz-9-gpus", gpus="9")]}}, 400),
        ("POST", "prioritize", {"Pod": _CPU_POD, "Nodes": {"items": [_node("fuzz-huge", cpu="1e18")]}}, 400),
        # A Node item whose metadata is not an object: an AttributeError, and the neutral answer
        # failed in turn (the connection closed without an answer).
        ("POST", "prioritize", {"Pod": _CPU_POD, "Nodes": {"items": [{"metadata": "n"}]}}, 400),
        # Victims that are not objects: an AttributeError (internal error) before.
        ("POST", "preempt", {"NodeNameToVictims": {"n": None}}, 400),
        ("POST", "preempt", {"NodeNameToVictims": {"n": {"Pods": ["not a pod"]}}}, 400),
        # A spec that is not an object, with a profile name set: an AttributeError before.
        ("POST", "filter", {"Pod": {"spec": [None]}, "NodeNames": []}, 400),
        # Other methods: 501 Not Implemented (a 5xx) from the stdlib before.
        ("PUT", "filter", {"Pod": _CPU_POD}, 405),
        ("DELETE", "bind", {}, 405),
    ],
)
def test_regressions_found_by_fuzzing(agent: Agent, method: str, verb: str, body: dict, status: int) -> None:
    decider = agent.server.decider
    before = _internal_errors(agent)
    decider.cfg.scheduler_name = "fedsched"
    try:
        got, data = agent.client.raw(method, f"{PREFIX}/{verb}", json.dumps(body).encode())
    finally:
        decider.cfg.scheduler_name = None
    assert got == status, data
    assert "Error" in json.loads(data)
    assert _internal_errors(agent) == before
    cache = agent.cache
    with cache.lock:
        assert len(cache.infos) == len(cache.table) == len(cache.index)
    # the keep-alive connection is still in step: the next request gets its own answer
    assert agent.client.get("/healthz") == (200, "ok\n")
    ok, _ = _post(agent, "filter", {"Pod": _CPU_POD, "Nodes": {"items": [_node(f"fuzz-ok-{verb}-{status}")]}})
    assert ok == 200


@pytest.mark.parametrize("cpu", ["1e306", 1e308])
def test_a_cpu_quantity_that_overflows_milli_cores_is_a_400(agent: Agent, cpu: object) -> None:
    pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": cpu}}}]}}
    before = _internal_errors(agent)
    status, _ = _post(agent, "prioritize", {"Pod": pod, "NodeNames": agent.known[:3]})
    assert _internal_errors(agent) == before
    assert status == 400


def test_a_node_without_allocatable_cpu_does_not_turn_the_policy_off(agent: Agent) -> None:
    pod = pod_to_json(Pod(-1, 1000, 1024, 0, 0, 0, 1), "zero-cpu", agent.models, uid="zero-cpu")
    names = agent.known[:20]
    try:
        zero = {"items": [_node("fuzz-zero-cpu", cpu="0")]}
        status, out = _post(agent, "filter", {"Pod": pod, "Nodes": zero})
        assert status == 200 and "fuzz-zero-cpu" in out["FailedNodes"]  # refused: it cannot run pods
        before = _fallbacks(agent, "nan")
        status, out = _post(agent, "prioritize", {"Pod": pod, "NodeNames": names})
        assert status == 200 and [h["Host"] for h in out] == names
        assert _fallbacks(agent, "nan") == before, "the policy's scores were NaN: kube-default answered"
    finally:
        agent.cache.delete_node("fuzz-zero-cpu")


def test_still_answers_correctly_after_the_fuzzing(agent: Agent) -> None:
    """Runs last: the fuzzed requests left the cache consistent and the server correct."""
    cache = agent.cache
    with cache.lock:
        assert len(cache.infos) == len(cache.table) == len(cache.index) == len(cache.schedulable)
    for name in set(cache.index) - set(agent.known):  # nodes the fuzzed Nodes lists taught it
        cache.delete_node(name)
    pod = pod_to_json(Pod(-1, 1000, 1024, 0, 0, 0, 1), "after", agent.models, uid="after-fuzz")
    status, out = _post(agent, "prioritize", {"Pod": pod, "NodeNames": agent.known})
    assert status == 200 and [h["Host"] for h in out] == agent.known
    assert max(h["Score"] for h in out) == 10  # a CPU pod fits somewhere: the policy's pick
    assert agent.client.get("/healthz")[0] == 200
