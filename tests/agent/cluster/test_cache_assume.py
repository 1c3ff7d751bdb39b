"""Assumed pods: the cache counts a pod on the node the agent's answer picked until the watch shows
it bound, as kube-scheduler assumes its own decisions, and every later event reconciles it."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from fedsched.agent.cluster.cache import ASSUME_TTL_S, ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.common.model.cluster import Pod
from tests.builders import make_nodes

POD = Pod(-1, 4000, 8192, 0, 0, 0, 1)


@pytest.fixture
def cache() -> ClusterCache:
    c = ClusterCache.from_table(make_nodes([16000, 16000, 16000], [65536] * 3, [0, 0, 0]))
    c.queue_scheduler = "fedsched"
    return c


def pending(uid: str = "u1", version: str = "10") -> dict:
    obj = pod_to_json(POD, f"pod-{uid}", uid=uid)
    obj["metadata"]["resourceVersion"] = version
    return obj


def bound(obj: dict, node: str, version: str = "11") -> dict:
    out = copy.deepcopy(obj)
    out["spec"]["nodeName"] = node
    out["metadata"]["resourceVersion"] = version
    return out


def assume(cache: ClusterCache, obj: dict, node: str, now: float = 0.0) -> bool:
    return cache.assume(obj, cache.pod(obj), node, now=now)


def counted(cache: ClusterCache) -> list[int]:
    return cache.state.cpu_req.tolist()


def test_an_assumed_pod_counts_on_its_node_and_leaves_the_queue(cache):
    obj = pending()
    cache.upsert_pod(obj)
    assert cache.telemetry.queue_len == 1
    gen = cache.generation
    assert assume(cache, obj, cache.table.names[1])
    assert counted(cache) == [0, 4000, 0] and cache.telemetry.queue_len == 0
    assert cache.generation > gen and set(cache.assumed) == {"u1"}


@pytest.mark.parametrize(
    ("event", "want_cpu", "want_queue", "hooks"),
    [
        pytest.param("bound here", [0, 4000, 0], 0, 1, id="bound-where-assumed: confirmed, nothing moves"),
        pytest.param("bound elsewhere", [0, 0, 4000], 0, 1, id="bound-elsewhere: moved"),
        pytest.param("same pending", [0, 4000, 0], 0, 0, id="the-decided-version-again: ignored"),
        pytest.param("newer pending", [0, 0, 0], 1, 0, id="a-newer-pending-version: dropped, queued"),
        pytest.param("deleted", [0, 0, 0], 0, 0, id="deleted: dropped"),
    ],
)
def test_the_next_event_of_an_assumed_pod_reconciles_it(cache, event, want_cpu, want_queue, hooks):
    names = cache.table.names
    obj = pending()
    cache.upsert_pod(obj)
    assume(cache, obj, names[1])
    seen = []
    cache.on_bound.append(seen.append)
    gen = cache.generation
    if event == "bound here":
        cache.upsert_pod(bound(obj, names[1]))
    elif event == "bound elsewhere":
        cache.upsert_pod(bound(obj, names[2]))
    elif event == "same pending":
        cache.upsert_pod(copy.deepcopy(obj))
    elif event == "newer pending":
        cache.upsert_pod(pending(version="12"))
    else:
        cache.delete_pod("u1")
    assert counted(cache) == want_cpu and cache.telemetry.queue_len == want_queue
    assert len(seen) == hooks
    assert set(cache.assumed) == ({"u1"} if event == "same pending" else set())
    if event in ("bound here", "same pending"):
        assert cache.generation == gen  # what a ranking saw still holds
    if hooks:
        assert seen[0].node == names[1 if event == "bound here" else 2]


def test_an_assumption_without_its_event_expires(cache):
    obj = pending()
    cache.upsert_pod(obj)
    assume(cache, obj, cache.table.names[0], now=100.0)
    other = pending("u2")
    cache.upsert_pod(other)
    assume(cache, other, cache.table.names[2], now=100.0 + ASSUME_TTL_S - 1)
    assert counted(cache) == [4000, 0, 4000]
    # the next assume() sweeps the expired ones: u1 is pending again as far as the cache knows
    third = pending("u3")
    cache.upsert_pod(third)
    assume(cache, third, cache.table.names[1], now=100.0 + ASSUME_TTL_S + 0.5)
    assert counted(cache) == [0, 4000, 4000] and set(cache.assumed) == {"u2", "u3"}
    assert cache.telemetry.queue_len == 1


def test_no_assumption_for_a_counted_pod_one_that_does_not_fit_or_has_no_uid(cache):
    names = cache.table.names
    obj = pending()
    cache.upsert_pod(bound(obj, names[0]))
    assert not assume(cache, obj, names[1])  # already bound
    big = pod_to_json(Pod(-1, 32000, 1024, 0, 0, 0, 1), "big", uid="big")
    assert not assume(cache, big, names[1])
    nameless = pending()
    nameless["metadata"].pop("uid")
    assert not assume(cache, nameless, names[1])
    assert counted(cache) == [4000, 0, 0] and cache.assumed == {}


def test_the_local_bind_verb_binds_an_assumed_pod(cache):
    names = cache.table.names
    obj = pending()
    assume(cache, obj, names[1])
    cache.bind("u1", cache.pod(obj), names[1], ())
    assert counted(cache) == [0, 4000, 0] and cache.assumed == {} and "u1" in cache.pods
    assert np.isfinite(cache.pods["u1"].bound_at)



def test_forget_puts_an_assumed_pod_back_in_the_queue(cache):
    obj = pending()
    cache.upsert_pod(obj)
    assume(cache, obj, cache.table.names[1])
    cache.forget("u1")
    cache.forget("never-assumed")  # nothing to do
    assert counted(cache) == [0, 0, 0] and cache.telemetry.queue_len == 1 and cache.assumed == {}
