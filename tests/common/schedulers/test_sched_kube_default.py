"""kube-scheduler's default profile reduced to resources: LeastAllocated + BalancedAllocation.

Reference section 3: weight 1 each, summed. The vectors are the per-plugin upstream
vectors of least_allocated_test.go and balanced_allocation_test.go on the same cluster.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.schedulers import BalancedAllocation, KubeDefault, LeastAllocated, place
from tests.common.schedulers.sched_testkit import all_nodes, pod, state


# least_allocated_test.go and balanced_allocation_test.go, both
# "nothing scheduled, resources requested, differently sized nodes" (nodes 4000/10000, 6000/10000,
# pod 3000m / 5000): LeastAllocated [37, 50] + BalancedAllocation [87, 100] = [124, 150]
def test_upstream_sum_of_least_and_balanced():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    np.testing.assert_array_equal(KubeDefault().score(st, pod(cpu=3000, mem=5000), all_nodes(st)),
                                  [124, 150])


def test_is_the_sum_of_its_two_plugins_on_a_loaded_cluster():
    st = state(cpu=[4000, 8000, 16000], mem=[8192, 32768, 16384])
    st.allocate(0, pod(cpu=1000, mem=4096), ())
    st.allocate(2, pod(cpu=12000), ())
    p = pod(cpu=500, mem=1024)
    idx = all_nodes(st)
    np.testing.assert_array_equal(
        KubeDefault().score(st, p, idx),
        LeastAllocated().score(st, p, idx) + BalancedAllocation().score(st, p, idx))


def test_place_spreads_to_the_emptier_balanced_node():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    assert place(KubeDefault(), st, pod(cpu=3000, mem=5000), np.random.default_rng(0)).node == 1


def test_sharing_pod_gets_the_best_fitting_gpu():
    # kube-default does not score GPUs; the GPU on the node is the tightest fit (base.py).
    st = state(cpu=[8000], mem=[8192], gpu=[4])
    st.allocate(0, pod(num_gpu=1, gpu_milli=300), (1,))  # GPU1 700 free
    st.allocate(0, pod(num_gpu=1, gpu_milli=500), (3,))  # GPU3 500 free
    p = place(KubeDefault(), st, pod(num_gpu=1, gpu_milli=400), np.random.default_rng(0))
    assert (p.node, p.gpus) == (0, (3,))
