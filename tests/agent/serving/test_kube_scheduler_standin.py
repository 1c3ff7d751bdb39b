"""No train/serve skew: a trace scheduled through the real extender decides as the simulator does.

A kube-scheduler stand-in (``tests/kube_scheduler_support.py``) drives the HTTP extender the way
kube-scheduler does: its filter plugins (NodeResourcesFit and the GPU checks, on its own copy of
the cluster), then the extender's filter verb, then its score plugins (the default profile's
NodeResourcesFit LeastAllocated + BalancedAllocation, weight 1 each) plus ``extender score *
weight * 10`` with the weight of the shipped KubeSchedulerConfiguration, ``selectHost`` (the best
total, ties at random), and the bind verb. 404 nodes with ``percentageOfNodesToScore: 100``
(what the shipped configuration sets; sampling is ``test_node_sampling.py``). The same pods go
through the simulator's in-process ``place`` with the same policy and seed, on a state that holds
real use as packing mode does (``use_source="requests"``: use = requests, ClusterState's one
definition; the serving cache without telemetry holds the same). Every decision must be the same
node, and at the end the server's cluster state (real use included) must equal the simulator's.

This is the requests-only path. The comparison with the training environment itself (replay
mode, telemetry from the replay simulator) is ``test_no_train_serve_skew.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.model_store import load_model, resolve_policy_path
from fedsched.common.model.cluster import USE_REQUESTS, ClusterState, Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods, split_by_hash
from fedsched.common.schedulers import place
from tests.extender_support import metric, running
from tests.kube_scheduler_support import KubeSchedulerStandIn, extender_weight


@pytest.mark.parametrize("policy", ["learned", "learned-td3"])
def test_a_trace_through_the_extender_decides_exactly_as_the_simulator(policy):
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv")).select(np.arange(0, 1213, 3))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    _, test = split_by_hash(pods, 0.3)
    seed = 7
    in_process = load_model(resolve_policy_path(policy)).scheduler
    sim_state, sim_rng = ClusterState(nodes, use_source=USE_REQUESTS), np.random.default_rng(seed)
    stand_in_gpus = load_model(resolve_policy_path(policy)).scheduler.select_gpus
    cache = ClusterCache.from_table(nodes)
    with running(cache, policy=policy, seed=seed, scheduler_name="fedsched") as (_server, client):
        kube = KubeSchedulerStandIn(client, nodes, stand_in_gpus, extender_weight(), seed=1)
        decisions = placed = 0
        for i in range(min(len(test), 400)):
            pod = Pod.from_table(test, i)
            want = place(in_process, sim_state, pod, sim_rng)
            got = kube.schedule(pod, f"pod-{i}").node
            assert got == want.node, f"pod {i}: extender path chose {got}, simulator {want.node}"
            decisions += 1
            if want.node >= 0:
                sim_state.allocate(want.node, pod, want.gpus)
                placed += 1
        text = client.get("/metrics")[1]
    assert decisions == 400 and placed > 300
    assert metric(text, "fedsched_fallbacks_total") == 0  # every answer came from the policy
    assert metric(text, "fedsched_decisions_total", source="policy") == placed
    for a in ("cpu_req", "mem_req", "gpu_free", "gpu_tag_pods"):
        np.testing.assert_array_equal(getattr(cache.state, a), getattr(sim_state, a), err_msg=a)
        np.testing.assert_array_equal(getattr(kube.state, a), getattr(sim_state, a), err_msg=a)
    for a in ("cpu_used", "mem_used", "cpu_measured", "mem_measured"):  # real use = requests in both
        np.testing.assert_array_equal(getattr(cache.state, a), getattr(sim_state, a), err_msg=a)
    np.testing.assert_array_equal(cache.state.cpu_used, sim_state.cpu_req)


def test_a_cluster_read_from_api_objects_gives_the_simulators_features():
    """The Kubernetes path (Node JSON -> cache) feeds the policy exactly what training saw."""
    from fedsched.agent.cluster.k8s_objects import node_to_json
    from fedsched.common.learning.checkpoint import load_checkpoint, typical_from_dict
    from fedsched.common.learning.features import FeatureBuilder
    from fedsched.common.schedulers import default_policy_path

    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    from_api = ClusterCache()
    from_api.replace_all([node_to_json(nodes, i) for i in range(len(nodes))], [])
    assert from_api.table.models == nodes.models
    sim = ClusterState(nodes, use_source=USE_REQUESTS)  # packing mode's state: use = requests
    typical = typical_from_dict(load_checkpoint(default_policy_path())[1]["typical_pods"])
    fb_sim, fb_api = FeatureBuilder(typical), FeatureBuilder(typical)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(pods), 30, replace=False):
        pod = Pod.from_table(pods, int(i))
        api_pod = from_api.pod(pod_to_json(pod, f"p{i}", nodes.models))
        ids = np.flatnonzero(sim.feasible(pod))
        a, b = fb_sim.build(sim, pod, ids), fb_api.build(from_api.state, api_pod, ids)
        np.testing.assert_array_equal(a.nodes, b.nodes)
        np.testing.assert_array_equal(a.pod, b.pod)
        np.testing.assert_array_equal(a.context, b.context)
        np.testing.assert_array_equal(a.use_measured, b.use_measured)
        assert not a.use_measured.any()  # no telemetry: requests stand in, as in packing mode
        node = int(ids[0])
        gpus = fb_sim.select_gpus(sim, pod, node)
        sim.allocate(node, pod, gpus)
        from_api.bind(f"p{i}", api_pod, nodes.names[node], gpus)
