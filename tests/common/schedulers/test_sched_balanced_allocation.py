"""NodeResourcesBalancedAllocation (classic two-resource form) against upstream vectors.

Upstream: kubernetes/kubernetes pkg/scheduler/framework/plugins/noderesources/
balanced_allocation_test.go, TestNodeResourcesBalancedAllocation (cpu and memory only),
scored by balancedResourceScorer: f = min(requested / allocatable, 1),
std = |f_cpu - f_mem| / 2, score = int64((1 - std) * 100).

Pod specs of the upstream test (memory in bytes there, MiB here; ratios only):
  cpuOnly      = containers {1000m, memory "0"} + {2000m, memory "0"} -> 3000m, 0
  cpuAndMemory = containers {1000m, 2000} + {2000m, 3000}             -> 3000m, 5000

Upstream BalancedAllocation is built with ``useRequested: true`` (PR kubernetes#105845,
Kubernetes 1.23, backported to 1.22): node and pod use the *actual* requests, not kube's
non-zero defaults, so a 0 memory request counts 0 whether it is explicit or missing. Since
PR kubernetes#130260 (1.33) a best-effort pod (no requests at all) skips the plugin.
fedsched's balanced_allocation() follows both.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.schedulers import BalancedAllocation, place
from tests.common.schedulers.sched_testkit import all_nodes, pod, set_node_info, state


def cpu_only():
    return pod(cpu=3000, mem=0)


def cpu_and_memory():
    return pod(cpu=3000, mem=5000)


def scores(st, p):
    return BalancedAllocation().score(st, p, all_nodes(st))


# balanced_allocation_test.go, "nothing scheduled, resources requested, differently sized nodes":
# node1 f_cpu 3000/4000 = .75, f_mem 5000/10000 = .5, std .125 -> int(87.5) = 87
# node2 f_cpu 3000/6000 = .5, f_mem .5, std 0 -> 100
def test_upstream_nothing_scheduled_resources_requested_differently_sized_nodes():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    np.testing.assert_array_equal(scores(st, cpu_and_memory()), [87, 100])


UPSTREAM_WITH_EXISTING_PODS = [
    # "resources requested, pods scheduled with resources": cpuOnly on node1, cpuAndMemory on node2
    # node1 f_cpu 6000/10000 = .6, f_mem 5000/20000 = .25, std .175 -> 82
    # node2 f_cpu .6, f_mem 10000/20000 = .5, std .05 -> 95
    pytest.param(
        [10000, 10000], [20000, 20000], cpu_and_memory(), [82, 95],
        id="resources requested, pods scheduled with resources"),
    # "resources requested, pods scheduled with resources, differently sized nodes"
    # node1 as above -> 82; node2 f_cpu .6, f_mem 10000/50000 = .2, std .2 -> 80
    pytest.param(
        [10000, 10000], [20000, 50000], cpu_and_memory(), [82, 80],
        id="resources requested, pods scheduled with resources, differently sized nodes"),
    # "requested resources at node capacity": the pod is cpuOnly
    # node1 f_cpu 6000/6000 = 1, f_mem 0/10000 = 0, std .5 -> 50
    # node2 f_cpu 1, f_mem 5000/10000 = .5, std .25 -> 75
    pytest.param(
        [6000, 6000], [10000, 10000], cpu_only(), [50, 75],
        id="requested resources at node capacity"),
]


@pytest.mark.parametrize(("cpu", "mem", "p", "expected"), UPSTREAM_WITH_EXISTING_PODS)
def test_upstream_with_existing_pods(cpu, mem, p, expected):
    # Existing pods bound as the simulator binds them. Upstream reads actual requests, so
    # cpuOnly's memory 0 counts 0 either way (explicit or missing): the vector applies as is.
    st = state(cpu=cpu, mem=mem)
    st.allocate(0, cpu_only(), ())
    st.allocate(1, cpu_and_memory(), ())
    np.testing.assert_array_equal(scores(st, p), expected)


# The same two vectors with the node totals set to upstream's Requested values directly
# (and a pod with non-zero requests): the formula itself matches upstream.
@pytest.mark.parametrize(("mem", "expected"), [([20000, 20000], [82, 95]), ([20000, 50000], [82, 80])])
def test_upstream_formula_with_requested_totals(mem, expected):
    st = state(cpu=[10000, 10000], mem=mem)
    set_node_info(st, 0, (3000, 0))
    set_node_info(st, 1, (3000, 5000))
    np.testing.assert_array_equal(scores(st, cpu_and_memory()), expected)


# balanced_allocation_test.go, "nothing scheduled, nothing requested, skip in PreScore":
# a best-effort pod is skipped (no BalancedAllocation score on any node). Behavioural form:
# on unequally loaded nodes the plugin must not prefer one node over another.
# fedsched: node1 f (1100/4000, 2200/10000) -> std .0275 -> 97; node2 (100/4000, 200/10000) -> 99.
def test_upstream_best_effort_pod_is_not_scored():
    st = state(cpu=[4000, 4000], mem=[10000, 10000])
    st.allocate(0, pod(cpu=1000, mem=2000), ())
    s = scores(st, pod())
    assert s[0] == s[1]


# Hand-computed: fractions are clamped at 1 before the deviation.
# node 6000m / 10000 with 3000m / 5000 requested; pod 4500m / 1 ->
# f_cpu = min(7500/6000, 1) = 1, f_mem = 5001/10000 = .5001, std .24995 -> int(75.005) = 75
def test_fraction_is_clamped_at_one():
    st = state(cpu=[6000], mem=[10000])
    set_node_info(st, 0, (3000, 5000))
    np.testing.assert_array_equal(scores(st, pod(cpu=4500, mem=1)), [75])


def test_place_prefers_the_balanced_node():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    assert place(BalancedAllocation(), st, cpu_and_memory(), np.random.default_rng(0)).node == 1
