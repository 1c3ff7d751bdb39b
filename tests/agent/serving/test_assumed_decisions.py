"""The decider assumes what it placed (DeciderConfig.assume, cluster mode): the next decision sees
the last pod on its node before the watch delivers the binding, as in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.schedulers.base import place


@pytest.fixture(scope="module")
def cluster():
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv")).select(np.arange(40))
    return nodes, load_pods(builtin_trace("openb_pod_list_default.csv"), nodes)


@pytest.mark.parametrize("mode", ["active", "shadow"])
def test_placed_pods_count_before_their_binding_arrives(cluster, mode):
    """30 pods decided back to back with no binding event: in active mode each decision is the
    simulator's place() on a state holding every earlier placement; in shadow mode nothing is
    assumed (kube-scheduler's own scores decide there)."""
    nodes, pods = cluster
    cache = ClusterCache.from_table(nodes)
    cfg = DeciderConfig(mode=mode, gate=None, assume=True, budget_ms=5_000.0)  # no fallback on a slow box
    decider = Decider(cache, ModelStore("learned"), cfg)
    sim = ClusterState(nodes, use_source="requests")
    rng = np.random.default_rng(0)
    scheduler = ModelStore("learned").current.scheduler
    names = list(nodes.names)
    for i in range(30):
        obj = pod_to_json(Pod.from_table(pods, i), f"p-{i}", nodes.models, uid=f"u-{i}")
        cache.upsert_pod(obj)  # pending: the watch's ADDED event
        sim.telemetry = cache.telemetry  # the same pending queue (one: this pod)
        want = place(scheduler, sim, cache.pod(obj), rng)
        d = decider.prioritize(obj, names)
        if mode == "shadow":
            assert d.source == "fallback" and cache.assumed == {}
            continue
        assert d.chosen == names[want.node]
        assert f"u-{i}" in cache.assumed
        sim.allocate(want.node, cache.pod(obj), cache.pods[f"u-{i}"].gpus)
        assert np.array_equal(sim.cpu_req, cache.state.cpu_req)
    decider.close()


def test_a_new_attempt_of_an_assumed_pod_forgets_the_last_one(cluster):
    """kube-scheduler schedules a pod again only when its last attempt did not bind: the decider
    then drops the assumption, so the pod does not see itself on its last pick."""
    nodes, pods = cluster
    cache = ClusterCache.from_table(nodes)
    decider = Decider(cache, ModelStore("learned"), DeciderConfig(gate=None, assume=True, budget_ms=5_000.0))
    names = list(nodes.names)
    obj = pod_to_json(Pod.from_table(pods, 0), "p", nodes.models, uid="u")
    cache.upsert_pod(obj)
    pod = cache.pod(obj)
    decider.prioritize(obj, names)
    assert "u" in cache.assumed and cache.state.cpu_req.sum() == pod.cpu
    passed = decider.filter(obj, names).passed  # the next attempt
    assert "u" not in cache.pods and cache.telemetry.queue_len == 1 and cache.state.cpu_req.sum() == 0
    again = decider.prioritize(obj, passed)
    assert cache.pods["u"].node == again.chosen and cache.state.cpu_req.sum() == pod.cpu  # counted once
    decider.close()
