"""Trimaran TargetLoadPacking against the upstream scheduler-plugins vectors.

Upstream: kubernetes-sigs/scheduler-plugins pkg/trimaran/targetloadpacking/
targetloadpacking_test.go, TestTargetLoadPackingScoring (node capacity 1000m, target 40%,
requests multiplier 1.5) and targetloadpacking.go (Score, PredictUtilisation).

The watcher's CPU metric is a utilisation percentage; fedsched holds the node's measured
use in milli (``ClusterState.cpu_used``), so "Value: 50" on a 1000m node is 500m.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.schedulers import TargetLoadPacking, TargetLoadPackingArgs, place
from fedsched.common.schedulers.target_load_packing import (
    go_round,
    pod_cpu_prediction,
    target_load_packing_score,
)
from tests.common.schedulers.sched_testkit import all_nodes, pod, state


def tlp_scores(cap, used, p, target=40):
    st = state(cpu=cap)
    st.cpu_used[:] = used
    sched = TargetLoadPacking(args=TargetLoadPackingArgs(target_utilization=target))
    return sched.score(st, p, all_nodes(st))


# targetloadpacking_test.go, "new node": metric 0%, the pod has no containers (prediction 0m)
# U = 0 -> round((100-40)*0/40 + 40) = 40 (DefaultTargetUtilizationPercent)
def test_upstream_new_node():
    assert target_load_packing_score(np.array([0.0]), np.array([1000.0]), 0.0)[0] == 40


# targetloadpacking_test.go, "hot node": metric 40+10 = 50%, prediction 0m
# U = 50 > 40 -> round(40 * (100-50) / (100-40)) = round(33.33) = 33
def test_upstream_hot_node():
    assert target_load_packing_score(np.array([500.0]), np.array([1000.0]), 0.0)[0] == 33


# targetloadpacking_test.go, "excess utilization returns min score": metric 30%, the pod's
# container requests and limits 1000m (prediction = limit = 1000m). U = 130 > 100 -> 0.
# fedsched pods carry requests only: 1000m * 1.5 = 1500m, U = 180 -> 0 as well.
def test_upstream_excess_utilization_returns_min_score():
    assert target_load_packing_score(np.array([300.0]), np.array([1000.0]), 1000.0)[0] == 0
    np.testing.assert_array_equal(tlp_scores([1000], [300.0], pod(cpu=1000)), [0])


# Hand-computed, through the scheduler (capacity 10000m):
#   used 2000, pod 1000m -> 1500m predicted, U = 35 -> 60*35/40 + 40 = 92.5 -> Go round 93
#   used 2500 -> U = 40 (at target, still the rising branch) -> 60*40/40 + 40 = 100
#   used 5500 -> U = 70 -> 40*30/60 = 20
#   used 8500 -> U = 100 -> 40*0/60 = 0
#   used 9000 -> U = 105 > 100 -> 0
def test_hand_computed_branches():
    used = [2000.0, 2500.0, 5500.0, 8500.0, 9000.0]
    np.testing.assert_array_equal(tlp_scores([10000] * 5, used, pod(cpu=1000)), [93, 100, 20, 0, 0])


# Hand-computed: used 4075m + prediction 1350m on 10000m -> U = 54.25,
# 40 * 45.75 / 60 = 30.5 -> Go's math.Round (half away from zero) = 31, not banker's 30.
def test_penalised_branch_rounds_half_away_from_zero():
    assert target_load_packing_score(np.array([4075.0]), np.array([10000.0]), 1350.0)[0] == 31
    np.testing.assert_array_equal(go_round(np.array([0.5, 1.5, 2.5, -0.5, 2.4])), [1, 2, 3, -1, 2])


def test_pod_prediction_is_requests_times_multiplier_else_default():
    assert pod_cpu_prediction(pod(cpu=2000)) == 3000
    assert pod_cpu_prediction(pod(cpu=0)) == 1000  # DefaultRequestsMilliCores


# targetloadpacking.go PredictUtilisation: int64(math.Round(request * multiplier)) per
# container, so a 1m request predicts 2m. Capacity 1000m, used 8m:
# upstream U = 100 * (8 + 2) / 1000 = 1.0 -> 60*1/40 + 40 = 41.5 -> 42.
# fedsched predicts 1.5m: U = 0.95 -> 41.425 -> 41.
def test_upstream_prediction_is_rounded_to_whole_milli():
    np.testing.assert_array_equal(tlp_scores([1000], [8.0], pod(cpu=1)), [42])


def test_custom_target():
    # target 60: U = 100*(1000+1500)/5000 = 50 <= 60 -> round(40*50/60 + 60) = round(93.33) = 93
    np.testing.assert_array_equal(tlp_scores([5000], [1000.0], pod(cpu=1000), target=60), [93])


def test_place_packs_towards_the_target():
    # U per node (cap 10000, pod 1500m predicted): 15 -> 62.5->63, 35 -> 93, 75 -> 16.7->17
    st = state(cpu=[10000, 10000, 10000])
    st.cpu_used[:] = [0.0, 2000.0, 6000.0]
    p = place(TargetLoadPacking(), st, pod(cpu=1000), np.random.default_rng(0))
    assert p.node == 1
