"""Trimaran LoadVariationRiskBalancing against the upstream scheduler-plugins vectors.

Upstream: kubernetes-sigs/scheduler-plugins pkg/trimaran/loadvariationriskbalancing/
analysis_test.go (TestComputeScore: one resource's ResourceStats, margin and sensitivity) and
loadvariationriskbalancing_test.go (TestScore: a 1000m / 1Gi node, watcher metrics in percent,
defaults margin 1 and sensitivity 1).

fedsched reads the windowed statistics from ``state.telemetry`` as fractions of capacity
(``cpu_mean`` 0.3 = the watcher's "Average 30"). Upstream scores only the resources it has
metrics for; fedsched always has both (a missing memory metric falls back to the node's
``mem_used``, here 0), and the memory score with mean 0 is never below the CPU score of these
vectors, so min(cpu, memory) is upstream's CPU-only score.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fedsched.common.learning.features import Telemetry
from fedsched.common.schedulers import LoadVariationRiskBalancing, LoadVariationRiskBalancingArgs, place
from fedsched.common.schedulers.load_variation_risk_balancing import risk_score
from fedsched.common.schedulers.target_load_packing import go_round
from tests.common.schedulers.sched_testkit import all_nodes, pod, state

NAN = math.nan

# analysis_test.go TestComputeScore: (name, margin, sensitivity, capacity, req, usedAvg, usedStdev, expected)
COMPUTE_SCORE = [
    ("valid data", 1, 1, 100, 10, 40, 36, 57),  # mu .5, sigma .36: risk .43
    ("zero capacity", 1, 2, 0, 10, 40, 36, 0),
    ("negative usedAvg", 1, 2, 100, 10, -40, 36, 65),  # mu .1, sigma .6: risk .35
    ("large usedAvg", 1, 2, 100, 10, 200, 36, 20),  # mu 1, sigma .6: risk .8
    ("negative usedStdev", 1, 2, 100, 10, 40, 36 * -1, 75),  # mu .5, sigma 0
    ("large usedStdev", 1, 2, 100, 10, 40, 120, 25),  # mu .5, sigma 1
    ("large usedAvg (repeated upstream)", 1, 2, 100, 10, 200, 36, 20),
    ("negative margin", -1, 1, 100, 10, 40, 36, 75),  # sigma * -1 clamps to 0
    ("negative sensitivity", 1, -1, 100, 10, 40, 36, 57),  # no root taken
    ("zero sensitivity", 1, 0, 100, 10, 40, 36, 75),  # .36 ** +inf = 0
]


@pytest.mark.parametrize(("name", "margin", "sensitivity", "cap", "req", "avg", "std", "expected"),
                         COMPUTE_SCORE, ids=[c[0] for c in COMPUTE_SCORE])
def test_upstream_compute_score(name, margin, sensitivity, cap, req, avg, std, expected):
    got = risk_score(np.array([avg]), np.array([std]), req, np.array([cap]), margin, sensitivity)
    assert go_round(got)[0] == expected


def lvrb_state(cpu_mean, cpu_std=NAN, mem_mean=NAN, mem_std=NAN, age=0.0, n=1, cap_cpu=1000):
    """``n`` 1000m / 1 GiB nodes (upstream TestScore's node) with the given windowed statistics."""
    st = state(cpu=[cap_cpu] * n, mem=[1024] * n)
    full = lambda v: np.full(n, v, dtype=np.float64) if np.isscalar(v) else np.asarray(v, dtype=np.float64)  # noqa: E731
    st.telemetry = dataclasses.replace(Telemetry.zeros(n), cpu_mean=full(cpu_mean), cpu_std=full(cpu_std),
                                       mem_mean=full(mem_mean), mem_std=full(mem_std),
                                       metrics_age_s=full(age))
    return st


# loadvariationriskbalancing_test.go TestScore: (name, pod, cpu avg/std, mem avg/std (%), expected)
# "404 resp from watcher": no metrics for the node -> MinNodeScore; fedsched: metrics_age_s = inf.
SCORE = [
    ("new node", pod(), (50, NAN), (NAN, NAN), 0.0, 75),  # mu .5 -> risk .25
    ("hot node", pod(), (100, NAN), (NAN, NAN), 0.0, 50),  # mu 1 -> risk .5
    ("average and stDev metrics", pod(cpu=200, mem=256), (30, 16), (NAN, NAN), 0.0, 67),  # .33
    ("CPU and Memory metrics", pod(cpu=100, mem=512), (40, 16), (50, 10), 0.0, 45),  # mem risk .55
    ("pick worst case: CPU or Memory", pod(cpu=100, mem=512), (80, 20), (25, 15), 0.0, 45),  # cpu .55
    ("404 resp from watcher", pod(), (NAN, NAN), (NAN, NAN), math.inf, 0),
]


@pytest.mark.parametrize(("name", "p", "cpu", "mem", "age", "expected"), SCORE, ids=[c[0] for c in SCORE])
def test_upstream_score(name, p, cpu, mem, age, expected):
    st = lvrb_state(cpu[0] / 100, cpu[1] / 100, mem[0] / 100, mem[1] / 100, age)
    np.testing.assert_array_equal(LoadVariationRiskBalancing().score(st, p, all_nodes(st)), [expected])


# loadvariationriskbalancing_test.go TestNew: upstream replaces negative arguments by the defaults;
# fedsched refuses them (test_sched_args.py) and takes the upstream defaults otherwise.
def test_defaults_are_upstreams():
    assert LoadVariationRiskBalancing().args == LoadVariationRiskBalancingArgs(1.0, 1.0)


# Hand-computed, the README's recommended sensitivity 2 and margin 1 vs 2, on the "valid data" node
# (cap 100, req 10, avg 40, std 36): sqrt(.36) = .6; margin 1: risk (.5 + .6)/2 = .55 -> 45;
# margin 2: sigma min(1.2, 1) = 1 -> risk .75 -> 25.
@pytest.mark.parametrize(("margin", "expected"), [(1, 45), (2, 25)])
def test_sensitivity_and_margin_args_change_the_score(margin, expected):
    st = lvrb_state(0.4, 0.36, 0.0, 0.0, cap_cpu=100)  # the table's capacity 100 (milli here)
    args = LoadVariationRiskBalancingArgs(safe_variance_margin=margin, safe_variance_sensitivity=2)
    assert LoadVariationRiskBalancing(args=args).score(st, pod(cpu=10), all_nodes(st))[0] == expected


# Without windowed statistics (Telemetry None, as in packing mode, or Telemetry.zeros) the mean is
# cpu_used / capacity and the deviation 0. 1000m nodes used 0, 400, 900m; pod 100m, no memory:
# mu .1, .5, 1.0 -> risk .05, .25, .5 -> 95, 75, 50; memory mean 0 scores 100.
@pytest.mark.parametrize("telemetry", [None, Telemetry.zeros(3)])
def test_falls_back_to_current_use_without_statistics(telemetry):
    st = state(cpu=[1000] * 3, mem=[1024] * 3)
    st.cpu_used[:] = [0.0, 400.0, 900.0]
    st.telemetry = telemetry
    np.testing.assert_array_equal(LoadVariationRiskBalancing().score(st, pod(cpu=100), all_nodes(st)),
                                  [95, 75, 50])


def test_nan_entries_fall_back_per_node():
    # node 1: measured mean .2 / std .1 -> mu .3, sigma .1 -> risk .2 -> 80
    # node 2: no value -> cpu_used 500/1000 = .5 + pod .1, std 0 -> risk .3 -> 70
    st = lvrb_state([0.2, NAN], [0.1, NAN], [0.0, NAN], [0.0, NAN], n=2)
    st.cpu_used[:] = [0.0, 500.0]
    scores = LoadVariationRiskBalancing().score(st, pod(cpu=100), all_nodes(st))
    np.testing.assert_array_equal(scores, [80, 70])


def test_memory_risk_is_scored_from_mem_used_without_statistics():
    # memory used 900 MiB of 1024 + pod 100 MiB -> mu .9766 -> risk .488 -> 51.2 -> 51; CPU idle -> 100
    st = state(cpu=[1000], mem=[1024])
    st.mem_used[:] = [900.0]
    assert LoadVariationRiskBalancing().score(st, pod(mem=100), all_nodes(st))[0] == 51


def test_place_prefers_the_node_with_less_variation():
    # same mean .3, std .05 vs .30: risk (.35 + .05)/2 = .2 -> 80 vs (.35 + .3)/2 = .325 -> 68 (67.5)
    st = lvrb_state([0.3, 0.3], [0.30, 0.05], [0.0, 0.0], [0.0, 0.0], n=2)
    p = pod(cpu=50)
    np.testing.assert_array_equal(LoadVariationRiskBalancing().score(st, p, all_nodes(st)), [68, 80])
    assert place(LoadVariationRiskBalancing(), st, p, np.random.default_rng(0)).node == 1
