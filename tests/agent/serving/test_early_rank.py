"""Early ranking: the decider ranks filter's passed nodes as soon as filter answers, and prioritize
takes that ranking when nothing changed. Checked against a decider that ranks only when prioritize
asks, on twin caches fed the same events: the answers (scores, pick, tie-break stream) are equal
pod by pod, whatever happens between filter and prioritize."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import node_to_json, pod_to_json
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.schedulers.base import rank

N_NODES = 80


@pytest.fixture(scope="module")
def cluster():
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    nodes = nodes.select(np.arange(N_NODES))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes)
    return nodes, pods


def twins(nodes, **cfg) -> tuple[Decider, Decider]:
    """(early-ranking decider, prioritize-time decider) on twin caches of ``nodes``; a budget no
    loaded test machine overruns unless ``cfg`` sets one (a fallback would differ by design)."""
    cfg = {"budget_ms": 5_000.0, **cfg}
    out = []
    for early in (True, False):
        cache = ClusterCache.from_table(nodes)
        out.append(Decider(cache, ModelStore("learned"), DeciderConfig(gate=None, early_rank=early, **cfg)))
    return out[0], out[1]


def early_count(d: Decider, result: str) -> float:
    v = d.metrics.registry.get_sample_value("fedsched_early_rankings_total", {"result": result})
    return v or 0.0


def decide(d: Decider, obj: dict, names: list[str], between=None):
    """filter, then (after ``between(decider)``) prioritize with the passed nodes."""
    passed = d.filter(obj, names).passed
    if between is not None:
        between(d)
    return d.prioritize(obj, passed)


def bind(d: Decider, uid: str, pod_obj: dict, node: str) -> None:
    pod = d.cache.pod(pod_obj)
    d.cache.bind(uid, pod, node, d.models.current.scheduler.select_gpus(
        d.cache.state, pod, d.cache.index[node]))


def same_answer(a, b) -> None:
    assert a.scores == b.scores and a.chosen == b.chosen and a.source == b.source == "policy"


def test_prioritize_takes_filters_ranking_and_answers_as_if_it_ranked_itself(cluster):
    """120 openb pods placed one after another: every early ranking is used, and each answer equals
    the prioritize-time decider's, ties (identical empty nodes: the tie-break stream) included."""
    nodes, pods = cluster
    early, late = twins(nodes)
    names = list(nodes.names)
    ties = 0
    for i in range(120):
        obj = pod_to_json(Pod.from_table(pods, i), f"p-{i}", nodes.models, uid=f"u-{i}")
        a, b = decide(early, obj, names), decide(late, obj, names)
        if a.chosen is None:
            continue
        same_answer(a, b)
        ties += int((a.ranking.scores == a.ranking.scores.max()).sum() > 1)
        for d in (early, late):
            bind(d, f"u-{i}", obj, a.chosen)
    assert early_count(early, "used") >= 100 and early_count(early, "stale") == 0
    assert early_count(late, "used") == 0  # switched off: never ranks early
    assert ties > 0, "no tie: the tie-break stream was not exercised"


@pytest.mark.parametrize("ranked_first", [True, False], ids=["after-the-ranking", "before-the-ranking"])
@pytest.mark.parametrize("change", ["bind", "pending pod", "cordon"])
def test_a_change_between_filter_and_prioritize_ranks_again(cluster, change, ranked_first):
    """The cache moves after filter answered. After the early ranking ran, that ranking is stale
    and prioritize ranks on the new state; before it ran, the ranking already saw the change. Either
    way the answer and the next pods' stay in step with the prioritize-time decider."""
    nodes, pods = cluster
    early, late = twins(nodes)
    names = list(nodes.names)
    other = pod_to_json(Pod.from_table(pods, 999), "other", nodes.models, uid="other")

    obj: dict = {}

    def between(d: Decider) -> None:
        if d._early is not None:  # the early ranking: let it finish first, or hold it back
            if ranked_first:
                d._early.future.result()
            else:
                d.cache.lock.acquire()
        try:
            change_cache(d)
        finally:
            if d._early is not None and not ranked_first:
                d.cache.lock.release()

    def change_cache(d: Decider) -> None:
        if change == "bind":  # another pod lands where the policy would put this one
            with d.cache.lock:
                pod = d.cache.pod(obj)
                fav = rank(d.models.current.scheduler, d.cache.state, pod, np.random.default_rng(0))
            bind(d, "other", other, names[fav.node])
        elif change == "pending pod":  # the queue feature moves
            d.cache.upsert_pod(other)
        else:  # a node is cordoned (only its flags move, not the state)
            node = node_to_json(nodes, 3)
            node.setdefault("spec", {})["unschedulable"] = True
            serial = d.cache.state.serial
            d.cache.upsert_node(node)
            assert d.cache.state.serial == serial and not d.cache.schedulable[3]

    for i in range(6):
        obj = pod_to_json(Pod.from_table(pods, i), f"p-{i}", nodes.models, uid=f"u-{i}")
        hook = between if i == 2 else None
        a, b = decide(early, obj, names, hook), decide(late, obj, names, hook)
        same_answer(a, b)
        for d in (early, late):
            bind(d, f"u-{i}", obj, a.chosen)
    assert early_count(early, "stale") == (1 if ranked_first else 0)
    assert early_count(early, "used") == (5 if ranked_first else 6)


def test_other_candidates_than_filter_passed_are_ranked_afresh(cluster):
    nodes, pods = cluster
    early, late = twins(nodes)
    names = list(nodes.names)
    obj = pod_to_json(Pod.from_table(pods, 0), "p", nodes.models, uid="u")
    early.filter(obj, names)
    late.filter(obj, names)
    a, b = early.prioritize(obj, names[:40]), late.prioritize(obj, names[:40])
    same_answer(a, b)
    assert early_count(early, "unused") == 1 and early_count(early, "used") == 0


def test_a_stuck_early_ranking_still_gets_the_fallback_within_the_budget(cluster):
    """The early ranking is stuck (60 s unless the test lets it go): the answer comes in a time the
    10 ms budget explains and the stuck model does not (5 s: a margin that holds on a loaded
    machine, where a 0.2 s model against a 0.1 s bound would not)."""
    nodes, pods = cluster
    early, _ = twins(nodes, budget_ms=10)
    sched = early.models.current.scheduler
    real = sched.score
    release, idle = threading.Event(), threading.Event()
    idle.set()

    def stuck(state, pod, candidates):
        idle.clear()
        try:
            release.wait(60.0)
            return real(state, pod, candidates)
        finally:
            idle.set()

    sched.score = stuck
    try:
        obj = pod_to_json(Pod.from_table(pods, 0), "p", nodes.models, uid="u")
        passed = early.filter(obj, list(nodes.names)).passed
        t0 = time.perf_counter()
        d = early.prioritize(obj, passed)
        assert time.perf_counter() - t0 < 5.0
        assert d.source == "fallback" and d.reason in ("timeout", "busy")
        assert max(d.scores) > 0  # kube-default scores, not a neutral answer
    finally:
        sched.score = real
        release.set()
        assert idle.wait(10)  # the stuck call has finished before the decider closes
        early.close()


def test_a_node_table_rebuilt_under_a_decision_is_looked_up_again(cluster):
    """A node leaves between prioritize's name lookup and its ranking (the cache rebuilds its tables
    and the later nodes' ids move down by one): the decider looks the names up again, so the
    answer is the prioritize-time decider's on the new table, never a ranking of ids that now name
    other nodes."""
    nodes, pods = cluster
    early, late = twins(nodes)
    names = list(nodes.names)
    obj = pod_to_json(Pod.from_table(pods, 0), "p", nodes.models, uid="u")
    late.cache.delete_node(names[0])
    late_answer = late.prioritize(obj, names)
    cache = early.cache
    real = cache.lookup_positions
    calls = []

    def lookup_then_rebuild(asked):
        out = real(asked)
        calls.append(len(asked))
        if len(calls) == 1:  # the table this lookup read is replaced right after it
            cache.delete_node(names[0])
        return out

    cache.lookup_positions = lookup_then_rebuild
    a = early.prioritize(obj, names)
    assert len(calls) == 2
    same_answer(a, late_answer)
    assert a.scores[0] == 0  # the node that left is no candidate
