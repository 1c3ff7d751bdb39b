"""NodeResourcesFit / LeastAllocated against the upstream Kubernetes test vectors.

Upstream: kubernetes/kubernetes pkg/scheduler/framework/plugins/noderesources/
least_allocated_test.go, TestLeastAllocatedScoringStrategy (default resources: cpu and
memory, weight 1 each).

Units: upstream memory quantities are bytes ("10000" = 10000 B) and CPU is milli. Here
memory numbers are taken as MiB unchanged: every score is a ratio requested/capacity, so
a common unit factor cancels. The one place units matter is kube's non-zero default for a
container without requests (100m CPU / 200 MiB), which only the hand-computed cases use.
Upstream pods with several containers are summed (e.g. 1000m+2000m, 2000+3000 -> 3000m,
5000).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.schedulers import LeastAllocated, SchedulerContext, place
from fedsched.common.schedulers.least_allocated import least_allocated_scores
from tests.common.schedulers.sched_testkit import all_nodes, pod, set_node_info, state


def scores(st, p):
    return LeastAllocated(SchedulerContext()).score(st, p, all_nodes(st))


# least_allocated_test.go, "nothing scheduled, resources requested, differently sized nodes":
# node1 cpu (4000-3000)*100/4000 = 25, mem (10000-5000)*100/10000 = 50 -> (25+50)/2 = 37
# node2 cpu (6000-3000)*100/6000 = 50, mem 50 -> 50
def test_upstream_nothing_scheduled_resources_requested_differently_sized_nodes():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    np.testing.assert_array_equal(scores(st, pod(cpu=3000, mem=5000)), [37, 50])


# least_allocated_test.go, "resources requested, pods scheduled with resources":
# existing pods node1 {cpu 3000, memory "0"}, node2 {cpu 3000, memory 5000}; an explicit
# memory "0" stays 0 in NonZeroRequested, so the NodeInfo totals are set directly.
# node1 cpu (10000-6000)*100/10000 = 40, mem (20000-5000)*100/20000 = 75 -> 57
# node2 cpu 40, mem (20000-10000)*100/20000 = 50 -> 45
def test_upstream_resources_requested_pods_scheduled_with_resources():
    st = state(cpu=[10000, 10000], mem=[20000, 20000])
    set_node_info(st, 0, (3000, 0))
    set_node_info(st, 1, (3000, 5000))
    np.testing.assert_array_equal(scores(st, pod(cpu=3000, mem=5000)), [57, 45])


# least_allocated_test.go, "resources requested, pods scheduled with resources, differently sized nodes":
# node1 as above -> 57; node2 cpu 40, mem (50000-10000)*100/50000 = 80 -> 60
def test_upstream_resources_requested_pods_scheduled_differently_sized_nodes():
    st = state(cpu=[10000, 10000], mem=[20000, 50000])
    set_node_info(st, 0, (3000, 0))
    set_node_info(st, 1, (3000, 5000))
    np.testing.assert_array_equal(scores(st, pod(cpu=3000, mem=5000)), [57, 60])


# Same upstream case, existing pods bound through ClusterState.allocate. The node1 pod's
# memory 0 then counts as a missing request (200 MiB non-zero): mem (20000-5200)*100/20000
# = 74, (40+74)/2 = 57 -- the upstream score survives the integer truncation.
def test_upstream_resources_requested_pods_scheduled_with_allocate():
    st = state(cpu=[10000, 10000], mem=[20000, 20000])
    st.allocate(0, pod(cpu=3000, mem=0), ())
    st.allocate(1, pod(cpu=3000, mem=5000), ())
    np.testing.assert_array_equal(scores(st, pod(cpu=3000, mem=5000)), [57, 45])


# least_allocated_test.go, "requested resources exceed node capacity", ADAPTED: upstream's
# pod requests memory "0" explicitly (score [50, 25]); in fedsched a 0 is a missing request,
# so the pod counts 200 MiB. CPU: 3000+3000 > 4000 -> 0 on both nodes (the req > cap branch).
# node1 mem (10000-200)*100/10000 = 98 -> (0+98)/2 = 49
# node2 mem (10000-5200)*100/10000 = 48 -> (0+48)/2 = 24
def test_upstream_requested_resources_exceed_node_capacity_adapted():
    st = state(cpu=[4000, 4000], mem=[10000, 10000])
    set_node_info(st, 0, (3000, 0))
    set_node_info(st, 1, (3000, 5000))
    np.testing.assert_array_equal(scores(st, pod(cpu=3000, mem=0)), [49, 24])


# Hand-computed: a pod without requests counts 100m / 200 MiB (kube's GetNonzeroRequests).
# cpu (4000-100)*100/4000 = 97 (97.5 truncated), mem (10000-200)*100/10000 = 98 -> 97
def test_missing_requests_count_non_zero_defaults():
    st = state(cpu=[4000], mem=[10000])
    np.testing.assert_array_equal(scores(st, pod()), [97])


# Hand-computed: existing pods without requests also count 100m / 200 MiB each.
# node1 holds two request-less pods: cpu 4000-300 -> 92 (92.5), mem 10000-600 -> 94 -> 93
def test_existing_pods_without_requests_count_non_zero_defaults():
    st = state(cpu=[4000, 4000], mem=[10000, 10000])
    st.allocate(0, pod(), ())
    st.allocate(0, pod(), ())
    np.testing.assert_array_equal(scores(st, pod()), [93, 97])


def test_per_resource_score_truncates_and_zeroes_over_capacity():
    cap = np.array([4000, 4000, 3, 0])
    req = np.array([1000, 5000, 1, 0])
    # 3000*100/4000 = 75; over capacity -> 0; 2*100/3 = 66 (66.7 truncated); zero capacity -> 0
    np.testing.assert_array_equal(least_allocated_scores(cap, req), [75, 0, 66, 0])


def test_place_prefers_the_least_allocated_node():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    p = place(LeastAllocated(), st, pod(cpu=3000, mem=5000), np.random.default_rng(0))
    assert p.node == 1 and p.gpus == ()


@pytest.mark.parametrize("gpus", [0, 8])
def test_gpus_are_not_scored(gpus):
    # GPUs are an extended resource the default resources (cpu, memory) do not score.
    st = state(cpu=[4000, 4000], mem=[10000, 10000], gpu=[gpus, 8])
    s = scores(st, pod(cpu=1000, mem=1000, num_gpu=1))
    assert s[0] == s[1]
