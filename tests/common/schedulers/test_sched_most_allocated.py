"""NodeResourcesFit / MostAllocated against the upstream Kubernetes test vectors.

Upstream: kubernetes/kubernetes pkg/scheduler/framework/plugins/noderesources/
most_allocated_test.go, TestMostAllocatedScoringStrategy (cpu and memory, weight 1).
Memory numbers are taken as MiB (bytes upstream); scores are ratios, so the unit cancels,
except kube's non-zero defaults (100m / 200 MiB), which the "nonzero request" case below
uses with upstream's own Mi units.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.schedulers import MostAllocated, place
from fedsched.common.schedulers.most_allocated import most_allocated_scores
from tests.common.schedulers.sched_testkit import all_nodes, pod, set_node_info, state


def scores(st, p):
    return MostAllocated().score(st, p, all_nodes(st))


# most_allocated_test.go, "nothing scheduled, resources requested, differently sized nodes":
# node1 cpu 3000*100/4000 = 75, mem 5000*100/10000 = 50 -> (75+50)/2 = 62
# node2 cpu 3000*100/6000 = 50, mem 50 -> 50
def test_upstream_nothing_scheduled_resources_requested_differently_sized_nodes():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    np.testing.assert_array_equal(scores(st, pod(cpu=3000, mem=5000)), [62, 50])


# most_allocated_test.go, "resources requested, pods scheduled with resources":
# existing node1 {cpu 3000, memory "0"} (explicit 0 -> NonZeroRequested memory 0),
# node2 {cpu 3000, memory 5000}.
# node1 cpu 6000*100/10000 = 60, mem 5000*100/20000 = 25 -> 42
# node2 cpu 60, mem 10000*100/20000 = 50 -> 55
def test_upstream_resources_requested_pods_scheduled_with_resources():
    st = state(cpu=[10000, 10000], mem=[20000, 20000])
    set_node_info(st, 0, (3000, 0))
    set_node_info(st, 1, (3000, 5000))
    np.testing.assert_array_equal(scores(st, pod(cpu=3000, mem=5000)), [42, 55])


# most_allocated_test.go, "resources requested equal node capacity":
# node1 cpu 5000*100/5000 = 100, mem 9000*100/10000 = 90 -> 95
# node2 cpu 5000*100/10000 = 50, mem 9000*100/9000 = 100 -> 75
def test_upstream_resources_requested_equal_node_capacity():
    st = state(cpu=[5000, 10000], mem=[10000, 9000])
    np.testing.assert_array_equal(scores(st, pod(cpu=5000, mem=9000)), [95, 75])


# most_allocated_test.go, "no resources requested, pods scheduled, nonzero request for resource":
# nodes 250m / 1000Mi; node1 runs two pods whose container has no requests; the pod has
# one such container. Non-zero: 100m / 200Mi per container (exact in MiB).
# node1 cpu min(300, 250)*100/250 = 100, mem 600*100/1000 = 60 -> 80
# node2 cpu 100*100/250 = 40, mem 200*100/1000 = 20 -> 30
def test_upstream_no_resources_requested_pods_scheduled_nonzero_request():
    st = state(cpu=[250, 250], mem=[1000, 1000])
    st.allocate(0, pod(), ())
    st.allocate(0, pod(), ())
    np.testing.assert_array_equal(scores(st, pod()), [80, 30])


def test_per_resource_score_caps_at_capacity_and_truncates():
    cap = np.array([4000, 4000, 3, 0])
    req = np.array([1000, 5000, 2, 7])
    # 1000*100/4000 = 25; min(5000, 4000) -> 100; 2*100/3 = 66; zero capacity -> 0
    np.testing.assert_array_equal(most_allocated_scores(cap, req), [25, 100, 66, 0])


def test_place_prefers_the_most_allocated_node():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    assert place(MostAllocated(), st, pod(cpu=3000, mem=5000), np.random.default_rng(0)).node == 0
