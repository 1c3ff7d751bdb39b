"""The cluster cache's node tables under many nodes at once (issue 26, item 5's follow-ups).

- A burst of node upserts (5,000 joining) handed over together is one rebuild of the tables, not
  one per node; changes of flags only are made in place.
- Nodes learned from requests (``add_nodes``) are bounded by ``max_learned_nodes``: the least
  recently named are evicted, the watch's nodes never are, and a learned node the watch reports
  becomes the watch's.

Rebuilds are counted by wrapping ``_set_nodes`` (every rebuild goes through it), never timed.
"""

from __future__ import annotations

import copy
import json

import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import node_from_json
from tests.paths import TEST_DATA

K8S = TEST_DATA / "k8s"
NODES = json.loads((K8S / "nodes.json").read_text())["items"]
PODS = json.loads((K8S / "pods.json").read_text())["items"]


def node(name: str, template: str = "cpu-node-a", **spec: object) -> dict:
    obj = copy.deepcopy(next(n for n in NODES if n["metadata"]["name"] == template))
    obj["metadata"]["name"] = name
    obj["metadata"].pop("uid", None)
    obj["spec"].update(spec)
    return obj


def count_rebuilds(cache: ClusterCache) -> list[int]:
    """A one-item list counting the cache's rebuilds of its tables from now on."""
    n = [0]
    real = cache._set_nodes

    def counted(*a: object, **kw: object) -> None:
        n[0] += 1
        real(*a, **kw)

    cache._set_nodes = counted  # type: ignore[method-assign]
    return n


def test_a_burst_of_5000_new_nodes_is_one_rebuild():
    cache = ClusterCache()
    cache.replace_all(NODES, PODS)
    counted = set(cache.pods)
    rebuilds = count_rebuilds(cache)
    burst = [node(f"joined-{k}") for k in range(5000)]
    cache.upsert_nodes(burst)
    assert rebuilds[0] == 1  # one upsert_node each: 5,000 rebuilds of up to 5,006 nodes
    assert len(cache.index) == len(cache.table) == len(NODES) + 5000
    assert all(f"joined-{k}" in cache.index for k in range(5000))
    assert set(cache.pods) == counted  # the bound pods are still counted


def test_a_batch_applies_in_order_and_flag_changes_are_made_in_place():
    cache = ClusterCache()
    cache.replace_all(NODES, PODS)
    rebuilds = count_rebuilds(cache)
    cordon = node("cpu-node-a", unschedulable=True)
    cache.upsert_nodes([node("cpu-node-a"), cordon])  # unchanged, then cordoned: flags only
    assert rebuilds[0] == 0 and not cache.schedulable[cache.index["cpu-node-a"]]
    # A node added then cordoned in the same batch: one rebuild, the last version wins.
    cache.upsert_nodes([node("late"), node("late", unschedulable=True), node("later")])
    assert rebuilds[0] == 1
    assert not cache.schedulable[cache.index["late"]] and cache.schedulable[cache.index["later"]]
    assert list(cache.index)[-2:] == ["late", "later"]
    cache.upsert_nodes([{"metadata": {}}, node("third")])  # one unreadable: counted, left out
    assert cache.rejected_objects == 1 and "third" in cache.index and rebuilds[0] == 2


def test_learned_nodes_beyond_the_limit_evict_the_least_recently_named():
    cache = ClusterCache(max_learned_nodes=100)
    cache.replace_all(NODES, PODS)
    watched = set(cache.index)
    rebuilds = count_rebuilds(cache)
    evicted_total = 0
    for r in range(10):  # 50 new names a request, and "kept" named every time
        names = ["kept"] + [f"made-up-{r}-{k}" for k in range(50)]
        evicted, refused = cache.add_nodes([node_from_json(node(n)) for n in names], seen=names)
        evicted_total += evicted
        assert refused == 0
        assert len(cache.learned) <= 100 and len(cache.index) <= len(watched) + 100
        assert watched <= set(cache.index) and "kept" in cache.index
    assert rebuilds[0] == 10  # one a request
    assert evicted_total == 501 - 100  # 501 names learned, 100 kept
    # "kept", named in every request, and the 99 names most recently learned
    assert set(cache.learned) == {"kept", *(f"made-up-9-{k}" for k in range(50)),
                                  *(f"made-up-8-{k}" for k in range(1, 50))}
    # One request naming more new nodes than the limit learns the first 100 only.
    names = [f"flood-{k}" for k in range(150)]
    evicted, refused = cache.add_nodes([node_from_json(node(n)) for n in names], seen=names)
    assert (evicted, refused) == (100, 50)
    assert set(cache.learned) == set(names[:100]) and watched <= set(cache.index)


def test_the_watch_s_nodes_are_authoritative_over_learned_ones():
    cache = ClusterCache(max_learned_nodes=2)
    cache.replace_all(NODES, PODS)
    cache.add_nodes([node_from_json(node("a")), node_from_json(node("b"))])
    cache.upsert_node(node("a"))  # the watch reports it: no longer a learned node
    assert list(cache.learned) == ["b"]
    cache.add_nodes([node_from_json(node("c")), node_from_json(node("d"))])
    assert "a" in cache.index and list(cache.learned) == ["c", "d"] and "b" not in cache.index
    cache.delete_node("c")
    assert list(cache.learned) == ["d"]
    cache.replace_all(NODES, PODS)  # a relist forgets every learned node
    assert not cache.learned and "d" not in cache.index


def test_pods_on_an_evicted_node_wait_for_it_and_count_again_when_it_is_learned_again():
    cache = ClusterCache(max_learned_nodes=1)
    cache.replace_all(NODES, [])
    cache.add_nodes([node_from_json(node("x"))])
    pod = copy.deepcopy(next(p for p in PODS if p["spec"].get("nodeName") == "cpu-node-a"
                             and p["status"]["phase"] == "Running"))
    pod["spec"]["nodeName"] = "x"
    cache.upsert_pod(pod)
    uid = pod["metadata"]["uid"]
    assert cache.pods[uid].node == "x"
    cache.add_nodes([node_from_json(node("y"))])  # evicts x
    assert "x" not in cache.index and uid not in cache.pods and uid in cache.detached
    cache.add_nodes([node_from_json(node("x"))])
    assert cache.pods[uid].node == "x"


@pytest.mark.parametrize("bad", [-1, 1.5, True, "5"])
def test_a_bad_limit_is_refused(bad: object):
    with pytest.raises(ValueError, match="max learned nodes must be a non-negative integer"):
        ClusterCache(max_learned_nodes=bad)  # type: ignore[arg-type]
