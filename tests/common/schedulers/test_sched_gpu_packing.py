"""GpuPacking against the FGD simulator's own test vectors.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/
gpu_packing_score_test.go, TestGpuPackingScorePlugin_Score, and gpu_packing_score.go
(getPackingScore). Node CPU does not enter the score.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.schedulers import GpuPacking, place
from tests.common.schedulers.sched_testkit import all_nodes, pod, set_gpu_free, share, state, whole


def score_one(free, p):
    st = state(cpu=[96000], gpu=[len(free)])
    set_gpu_free(st, 0, free)
    return GpuPacking().score(st, p, all_nodes(st))[0]


# gpu_packing_score_test.go "case-2": free [200, 1000, 1000, 500], pod 2 x 1000m, cpu 100
# used node, the two taken GPUs are fully free: max(50 - 2, 33) = 48
def test_upstream_case_2_free_gpus_on_a_used_node():
    assert score_one([200, 1000, 1000, 500], whole(2, cpu=100)) == 48


# gpu_packing_score_test.go "case-3 4-GPU": all 4 GPUs free, pod 2 x 1000m: max(33 - 4, 4) = 29
def test_upstream_case_3_four_gpu_free_node():
    assert score_one([1000] * 4, whole(2, cpu=100)) == 29


# gpu_packing_score_test.go "case-3 8-GPU": all 8 GPUs free, pod 2 x 1000m: max(33 - 8, 8) = 25
def test_upstream_case_3_eight_gpu_free_node():
    assert score_one([1000] * 8, whole(2, cpu=100)) == 25


# gpu_packing_score_test.go "case-1 only use existing GPUs" uses a pod of 2 x 200m, which is
# not a fedsched pod (sharing pods use one GPU). ADAPTED to 1 x 200m and computed with
# upstream's getPackingScore: ascending free [200, 500, 1000, 1000], GPU0 fits (200 >= 200),
# not fully free -> case-1: r = 200*100/1000 = 20 -> max(100 - 20/10, 50) = 98
def test_upstream_case_1_adapted_to_one_gpu():
    assert score_one([200, 1000, 1000, 500], share(200, cpu=100)) == 98


@pytest.mark.parametrize(("free", "p", "expected"), [
    # tightest fitting partial GPU 350: r = 35 -> 100 - 3 = 97
    ([1000, 350, 1000, 1000], share(300), 97),
    # partial GPU 600: r = 60 -> 100 - 6 = 94
    ([600, 1000], share(100), 94),
    # partial GPU 999: r = 99 -> 100 - 9 = 91 (never reaches the 50 floor with one GPU)
    ([999, 1000], share(1), 91),
    # the partial GPU (200) does not fit 300: a fully free GPU on a used node -> max(50-1, 33) = 49
    ([1000, 200, 1000, 1000], share(300), 49),
    # whole GPUs on a used node: max(50 - 4, 33) = 46
    ([0, 1000, 1000, 1000, 1000, 0, 0, 0], whole(4), 46),
    # untouched 1-GPU node: max(33 - 1, 1) = 32; untouched 2-GPU node: 31
    ([1000], share(500), 32),
    ([1000, 1000], whole(1), 31),
])
def test_hand_computed(free, p, expected):
    assert score_one(free, p) == expected


def test_cpu_pods_score_zero_everywhere():
    st = state(cpu=[8000, 8000], gpu=[0, 4])
    set_gpu_free(st, 1, [500, 1000, 1000, 1000])
    np.testing.assert_array_equal(GpuPacking().score(st, pod(cpu=1000), all_nodes(st)), [0, 0])


def test_place_prefers_partly_used_gpu_then_used_node_then_smallest_untouched_node():
    st = state(cpu=[96000] * 4, gpu=[8, 2, 4, 4])
    set_gpu_free(st, 2, [1000, 200, 1000, 1000])  # used node, partial GPU too small for 300
    set_gpu_free(st, 3, [1000, 1000, 700, 400])  # used node with two fitting partial GPUs
    rng = np.random.default_rng(0)
    # 8-GPU untouched 25, 2-GPU untouched 31, node 3: 49, node 4: tight 400 -> 96
    np.testing.assert_array_equal(GpuPacking().score(st, share(300), all_nodes(st)), [25, 31, 49, 96])
    p = place(GpuPacking(), st, share(300), rng)
    assert (p.node, p.gpus) == (3, (3,))  # the tightest fitting GPU
    st.allocate(3, share(300), (3,))
    # without node 4: node 3 (49) beats the untouched nodes; it takes a fully free GPU
    p = place(GpuPacking(), st, share(300), rng, candidates=np.array([0, 1, 2]))
    assert (p.node, p.gpus) == (2, (0,))
    # whole GPUs: used node first (max(50-2, 33) = 48), lowest-indexed free GPUs
    p = place(GpuPacking(), st, whole(2), rng, candidates=np.array([0, 1, 2]))
    assert (p.node, p.gpus) == (2, (0, 2))
