"""BestFit and DotProd (FGD paper baselines) on hand-computed cases.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/best_fit_score.go
(getBestFitScore) and dot_product_score.go (calculateDotProductScore, dimExtMethod merge,
normMethod max); MaxSpecCpu = 128000 milli, MaxSpecGpu = 8000 milli-GPU. Upstream has no
test file for either, so the vectors are computed from those formulas by hand.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.schedulers import BestFit, DotProduct, place
from tests.common.schedulers.sched_testkit import all_nodes, pod, set_gpu_free, share, state, whole


def loaded_state():
    # node1: 32000m with 8000m requested, 4 GPUs, GPU0 taken by a whole-GPU pod -> 3000 free
    # node2: 64000m idle, 8 GPUs free
    st = state(cpu=[32000, 64000], gpu=[4, 8])
    st.allocate(0, pod(cpu=8000, num_gpu=1), (0,))
    return st


# BestFit, pod 4000m + 1 whole GPU:
# node1: 0.5*(24000-4000)/128000 + 0.5*(3000-1000)/8000 = 0.078125 + 0.125 = 0.203125
#        -> (1 - 0.203125) * 100 = 79.6875 -> 79
# node2: 0.5*(64000-4000)/128000 + 0.5*(8000-1000)/8000 = 0.234375 + 0.4375 = 0.671875
#        -> 32.8125 -> 32
def test_best_fit_hand_computed():
    st = loaded_state()
    np.testing.assert_array_equal(BestFit().score(st, whole(1, cpu=4000), all_nodes(st)), [79, 32])


# BestFit, CPU-only pod without requests (non-zero 100m) on a 1100m CPU node:
# 0.5*(1100-100)/128000 + 0.5*(0-0)/8000 = 0.00390625 -> 99.609 -> 99
def test_best_fit_uses_non_zero_cpu_for_cpu_pods():
    st = state(cpu=[1100])
    np.testing.assert_array_equal(BestFit().score(st, pod(), all_nodes(st)), [99])


# BestFit, sharing pod 300m (cpu 2000) on 2 GPUs with free [700, 1000] and 16000m:
# 0.5*(16000-2000)/128000 + 0.5*(1700-300)/8000 = 0.0546875 + 0.0875 = 0.1421875 -> 85.78 -> 85
def test_best_fit_sharing_pod_counts_its_share():
    st = state(cpu=[16000], gpu=[2])
    set_gpu_free(st, 0, [700, 1000])
    np.testing.assert_array_equal(BestFit().score(st, share(300, cpu=2000), all_nodes(st)), [85])


def test_best_fit_places_on_the_smallest_leftover_and_tightest_gpu():
    st = loaded_state()
    st.allocate(1, share(400), (5,))  # node2 GPU5 has 600 free
    p = place(BestFit(), st, share(500, cpu=4000), np.random.default_rng(0))
    assert p.node == 0 and p.gpus == (1,)
    p = place(BestFit(), st, share(500, cpu=4000), np.random.default_rng(0), candidates=np.array([1]))
    assert (p.node, p.gpus) == (1, (5,))


# DotProd, pod 16000m + 1 whole GPU:
# node with 64000m / 4000 milli-GPU left:
#   dot = (64000/128000)(16000/128000) + (4000/8000)(1000/8000) = .0625 + .0625 = .125
#   -> 100 * (1 - .125/2) = 93.75 -> 93
# node with 16000m / 1000 left: dot = .125*.125 + .125*.125 = .03125 -> 98.4375 -> 98
def test_dot_product_hand_computed():
    st = state(cpu=[64000, 32000], gpu=[4, 4])
    st.allocate(1, pod(cpu=16000, num_gpu=3), (0, 1, 2))
    np.testing.assert_array_equal(DotProduct().score(st, whole(1, cpu=16000), all_nodes(st)), [93, 98])
    assert place(DotProduct(), st, whole(1, cpu=16000), np.random.default_rng(0)).node == 1


# DotProd, CPU-only pod 1000m: dot = (cpuLeft/128000)(1000/128000); gpu term 0.
# 128000m idle -> dot = 1/128 = .0078125 -> 100*(1 - .00390625) = 99.6 -> 99
# A node with less CPU than the pod gets 0 (upstream: no virtual node, MinNodeScore).
def test_dot_product_cpu_pod_and_insufficient_cpu():
    st = state(cpu=[128000, 500])
    np.testing.assert_array_equal(DotProduct().score(st, pod(cpu=1000), all_nodes(st)), [99, 0])
