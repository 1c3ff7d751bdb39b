"""No train/serve skew: a trace scheduled through the real extender decides as the simulator does.

A kube-scheduler stand-in (``tests/kube_scheduler_support.py``) drives the HTTP extender the way
kube-scheduler v1.37.2 does: its filter plugins as the real ones (``kube_filters``: cpu, memory,
pod count and whole ``nvidia.com/gpu``; GPU shares and models are the extender's business, so
kube offers a sharing pod nodes its GPUs cannot take and the extender's filter refuses them),
then the extender's filter verb; one node left: that node, with no scoring and no prioritize
call (``skip_single_node``); else its score plugins (the default profile's NodeResourcesFit
LeastAllocated + BalancedAllocation as v1.37.2 scores them, weight 1 each) plus ``extender score
* weight * 10`` with the weight of the shipped KubeSchedulerConfiguration, ``selectHost`` (the
best total, ties at random), and the bind verb. 404 nodes with ``percentageOfNodesToScore: 100``
(what the shipped configuration sets; sampling is ``test_node_sampling.py``). The same pods go
through the simulator's in-process ``place`` with the same policy and seed, on a state that holds
real use as packing mode does (``use_source="requests"``: use = requests, ClusterState's one
definition; the serving cache without telemetry holds the same). Every decision must be the same
node, and at the end the server's cluster state (real use included) must equal the simulator's.

This is the requests-only path. The comparison with the training environment itself (replay
mode, telemetry from the replay simulator) is ``test_no_train_serve_skew.py``. The stand-in's
own behaviour (the filters, the one-node shortcut, the scores) is checked against a recording
fake extender at the end of this file.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.harness.extender_client import metric
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.model_store import load_model, resolve_policy_path
from fedsched.common.model.cluster import USE_REQUESTS, ClusterState, Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods, split_by_hash
from fedsched.common.schedulers import place
from tests.extender_support import running
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
        kube = KubeSchedulerStandIn(client, nodes, stand_in_gpus, extender_weight(), seed=1,
                                    kube_filters=True, skip_single_node=True)
        decisions = placed = prioritized = gpu_refused = 0
        for i in range(min(len(test), 400)):
            pod = Pod.from_table(test, i)
            want = place(in_process, sim_state, pod, sim_rng)
            cycle = kube.schedule(pod, f"pod-{i}")
            got = cycle.node
            assert got == want.node, f"pod {i}: extender path chose {got}, simulator {want.node}"
            decisions += 1
            prioritized += cycle.prioritized
            gpu_refused += sum("GPUs" in why for why in cycle.failed.values())
            if want.node >= 0:
                sim_state.allocate(want.node, pod, want.gpus)
                placed += 1
        text = client.get("/metrics")[1]
    assert decisions == 400 and placed > 300
    print(f"\nstand-in: {gpu_refused} GPU refusals by the extender, {prioritized}/{placed} prioritized")
    assert gpu_refused > 0  # kube's filters offered nodes only the agent knows the GPUs cannot take
    assert metric(text, "fedsched_fallbacks_total") == 0  # every answer came from the policy
    # One prioritize call per bound pod, except where one node was left (no call at all).
    assert metric(text, "fedsched_decisions_total", source="policy") == prioritized <= placed
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


# ---- the stand-in itself, against a recording fake extender ------------------------------------

class FakeExtender:
    """The extender verbs the stand-in calls: the filter keeps the nodes ``keep`` allows (every
    one by default), prioritize answers ``score`` (0) everywhere, bind accepts; every call is kept."""

    def __init__(self, names, keep=None, score=0):
        self.names, self.keep, self.score = names, keep, score
        self.calls: list[tuple[str, dict]] = []

    def post(self, verb, body):
        self.calls.append((verb, body))
        if verb == "filter":
            kept = [n for n in body["NodeNames"] if self.keep is None or self.keep(n)]
            failed = {n: "fake: refused" for n in body["NodeNames"] if n not in kept}
            return 200, {"NodeNames": kept, "FailedNodes": failed, "Error": ""}
        if verb == "prioritize":
            return 200, [{"Host": n, "Score": self.score} for n in body["NodeNames"]]
        return 200, {"Error": ""}

    def verbs(self):
        return [v for v, _ in self.calls]


def _stand_in(table, fake, **kw):
    from fedsched.common.schedulers import KubeDefault

    return KubeSchedulerStandIn(fake, table, KubeDefault().select_gpus, 1, seed=0, **kw)


def test_kube_filters_know_whole_gpus_but_not_shares_or_models():
    from fedsched.common.model.cluster import MILLI_PER_GPU
    from tests.common.schedulers.sched_testkit import nodes, pod

    # node1: 2 GPUs, both 900 milli taken by sharing pods; node2: no GPU; node3: 2 GPUs, one taken
    # by a whole-GPU pod; node4: 2 free GPUs of model 1 (V100).
    table = nodes(cpu=[8000] * 4, mem=[8192] * 4, gpu=[2, 0, 2, 2], model=[0, -1, 0, 1])
    fake = FakeExtender(table.names)
    kube = _stand_in(table, fake, kube_filters=True)
    for g in (0, 1):
        kube.state.allocate(0, pod(num_gpu=1, gpu_milli=900), (g,))
    kube.state.allocate(2, pod(num_gpu=1, gpu_milli=MILLI_PER_GPU), (0,))
    share = pod(cpu=100, num_gpu=1, gpu_milli=500, spec_mask=0b01)  # A100 only
    two = pod(cpu=100, num_gpu=2, gpu_milli=MILLI_PER_GPU)
    name = table.names.__getitem__
    # kube: cpu and memory fit everywhere; the share pod requests no nvidia.com/gpu at all.
    assert [name(j) for j in kube.sample(share)] == list(table.names)
    # 2 whole GPUs: node1's count is 0 booked (its shares are invisible), node3 has 1 of 2 booked.
    assert [name(j) for j in kube.sample(two)] == ["node1", "node4"]
    agent = _stand_in(table, fake)
    agent.state = kube.state
    assert [name(j) for j in agent.sample(share)] == ["node3"]  # the agent's accounting: the free A100
    assert [name(j) for j in agent.sample(two)] == ["node4"]


def test_kube_filters_count_pods_against_the_pods_allocatable():
    from tests.common.schedulers.sched_testkit import nodes, pod
    from tests.kube_scheduler_support import POD_CAPACITY

    table = nodes(cpu=[10 ** 6] * 2, mem=[10 ** 6] * 2)
    fake = FakeExtender(table.names, keep=lambda n: n == "node1")
    kube = _stand_in(table, fake, kube_filters=True)
    for k in range(POD_CAPACITY):
        assert kube.schedule(pod(cpu=1, mem=1), f"p{k}").node == 0
    assert kube.sample(pod(cpu=1, mem=1)).tolist() == [1]
    assert kube.state.feasible(pod(cpu=1, mem=1)).all()  # the agent's accounting has no pod limit
    kube.forget("p0")
    assert kube.sample(pod(cpu=1, mem=1)).tolist() == [0, 1]


@pytest.mark.parametrize("skip", [True, False])
def test_one_node_left_is_bound_without_scoring(skip):
    from tests.common.schedulers.sched_testkit import nodes, pod

    table = nodes(cpu=[4000, 4000, 4000], mem=[8192] * 3)
    fake = FakeExtender(table.names, keep=lambda n: n == "node2")
    kube = _stand_in(table, fake, kube_filters=True, skip_single_node=skip)
    cycle = kube.schedule(pod(cpu=1000, mem=1024), "p0")
    assert (cycle.node, cycle.passed, cycle.prioritized) == (1, ["node2"], not skip)
    assert fake.verbs() == (["filter", "bind"] if skip else ["filter", "prioritize", "bind"])
    assert set(cycle.failed) == {"node1", "node3"}


def test_scores_are_kube_137s_not_the_classic_form():
    """The case of ``test_sched_kube_default.py`` where the two forms disagree: 1.37 scores
    [138, 129] and picks node1, the classic BalancedAllocation would pick node2."""
    from tests.common.schedulers.sched_testkit import nodes, pod

    table = nodes(cpu=[10000, 10000], mem=[10000, 10000])
    fake = FakeExtender(table.names)
    kube = _stand_in(table, fake, kube_filters=True, skip_single_node=True)
    kube.state.allocate(0, pod(cpu=6000), ())
    kube.state.allocate(1, pod(cpu=3000, mem=3000), ())
    for k in range(5):  # no ties: the pick is the argmax every time, whatever the rng
        assert kube.schedule(pod(mem=2000), f"p{k}", bind=False).node == 0
    fake.score = 10  # an extender score is added as score * weight * 10, here +100 everywhere
    assert kube.schedule(pod(mem=2000), "p5", bind=False).node == 0
