"""Koordinator LoadAware against the upstream koordinator vectors.

Upstream: koordinator-sh/koordinator pkg/scheduler/plugins/loadaware/load_aware_test.go
(TestFilterExpiredNodeMetric, TestFilterUsage, TestScore: one node with allocatable 96 CPUs /
512Gi, default args unless a case sets them) and estimator/default_estimator_test.go
(TestDefaultEstimatorEstimatePod).

The NodeMetric's node usage is ``state.cpu_used`` (milli) / ``mem_used`` (MiB); its age is
``state.telemetry.metrics_age_s`` (a NodeMetric updated ``time.Now()`` = age 0, ``time.Now() -
180s`` = age 180; "node missing NodeMetrics" = ``inf``). Upstream Filter's verdict is
``KoordinatorLoadAware.refused``; its Score is ``upstream_score``; fedsched's score subtracts 101
from the refused nodes' scores.

Left out (features fedsched's pod and node model does not have, see the module docstring):
Prod/Batch/Mid priority classes and prod thresholds, percentile (p95) usage, custom thresholds in
node annotations, DaemonSet pods, pods assigned since the last report (assignedCache), a NodeMetric
with a nil updateTime, enableScheduleWhenNodeMetricsExpired. Cases whose Mid/Batch resources map
onto plain CPU/memory requests are kept, marked "adapted".
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fedsched.common.learning.features import Telemetry
from fedsched.common.schedulers import KoordinatorLoadAware, KoordinatorLoadAwareArgs, place
from fedsched.common.schedulers.koordinator_load_aware import (
    DEFAULT_MEMORY_REQUEST,
    DEFAULT_MILLI_CPU_REQUEST,
    REFUSED_OFFSET,
    estimate_pod_usage,
    least_used_score,
    load_aware_score,
)
from tests.common.schedulers.sched_testkit import all_nodes, pod, state

GI = 1024  # MiB
CPU = 1000  # milli per core
ALLOC = (96 * CPU, 512 * GI)  # the upstream tests' node


def koord_state(usage=None, age=0.0, alloc=ALLOC):
    """One node with NodeMetric ``usage`` = (cores, GiB) reported ``age`` seconds ago (inf: none)."""
    st = state(cpu=[alloc[0]], mem=[alloc[1]])
    if usage is not None:
        st.cpu_used[:] = usage[0] * CPU
        st.mem_used[:] = usage[1] * GI
    st.telemetry = dataclasses.replace(Telemetry.zeros(1), metrics_age_s=np.array([float(age)]))
    return st


def sched(**args) -> KoordinatorLoadAware:
    return KoordinatorLoadAware(args=KoordinatorLoadAwareArgs(**args))


# ---- TestFilterExpiredNodeMetric -------------------------------------------------------------
# (the empty test pod is estimated at 250m / 200 MiB; the NodeMetric has no usage)
@pytest.mark.parametrize(("name", "age", "refused"), [
    ("filter healthy nodeMetrics", 0.0, False),
    ("filter unhealthy nodeMetric with expired updateTime", 180.0, True),  # age >= 180 s
    ("(fedsched) a metric 179 s old is not expired", 179.0, False),
])
def test_upstream_filter_expired_node_metric(name, age, refused):
    st = koord_state(age=age)
    assert KoordinatorLoadAware().refused(st, pod(), all_nodes(st))[0] == refused


# ---- TestFilterUsage --------------------------------------------------------------------------
# (name, args, node usage (cores, GiB) or None for no NodeMetric, test pod, refused)
FILTER_USAGE = [
    ("filter normal usage", {}, (60, 256), pod(), False),  # cpu round(60.25/96) = 63% <= 65
    ("filter node missing NodeMetrics", {}, None, pod(), False),
    ("filter exceed cpu usage", {}, (70, 256), pod(), True),  # 73% > 65
    ("filter exceed memory usage", {}, (30, 500), pod(), True),  # 98% > 95
    # usageThresholds {memory: 0}: the map replaces the defaults, so CPU has no threshold either
    ("disable filter exceed memory usage", {"cpu_usage_threshold": 0, "memory_usage_threshold": 0},
     (30, 500), pod(), False),
    ("prod usage filter is not enabled by default",
     {"cpu_usage_threshold": 100, "memory_usage_threshold": 100}, (63, 500), pod(), False),
    # adapted: the Mid pod's mid-cpu 12k (milli) is a 12-core request: 53 + 10.2 = 63.2 -> 66% > 65
    ("filter mid cpu usage with new pod request configuration",
     {"cpu_usage_threshold": 65, "memory_usage_threshold": 100}, (53, 500), pod(cpu=12 * CPU), True),
    # adapted: mid-cpu 1k / mid-memory 200Gi: memory 300 + 140 = 440Gi of 512 -> 86% > 85
    ("filter mid memory usage with new pod request configuration",
     {"cpu_usage_threshold": 65, "memory_usage_threshold": 85}, (53, 300), pod(cpu=CPU, mem=200 * GI), True),
]


@pytest.mark.parametrize(("name", "args", "usage", "p", "refused"), FILTER_USAGE,
                         ids=[c[0] for c in FILTER_USAGE])
def test_upstream_filter_usage(name, args, usage, p, refused):
    st = koord_state(usage, age=math.inf if usage is None else 0.0)
    assert sched(**args).refused(st, p, all_nodes(st))[0] == refused


# ---- TestScore --------------------------------------------------------------------------------
# The pod requests (and limits) 16 cores / 32Gi unless said: estimated 13600m / 22.4Gi.
POD16 = pod(cpu=16 * CPU, mem=32 * GI)
# (name, args, node usage or None, age, pod, upstream score)
SCORE = [
    ("score node with expired nodeMetric", {}, (0, 0), 180.0, pod(), 0),
    # cpu (96000-13600)*100/96000 = 85, memory (512-22.4)/512 = 95 -> (85 + 95) / 2 = 90
    ("score empty node", {}, (0, 0), 0.0, POD16, 90),
    ("score node missing NodeMetrics", {}, None, math.inf, POD16, 0),
    # cpu 32 + 13.6 = 45.6 -> 52, memory 10 + 22.4 = 32.4Gi -> 93: 145 / 2 = 72
    ("score load node", {}, (32, 10), 0.0, POD16, 72),
    # adapted: batch-cpu 16000 (milli) / batch-memory 32Gi are a 16-core / 32Gi request
    ("score batch Pod", {}, (0, 0), 0.0, POD16, 90),
    # DRF weight 10: (85 + 95 + 85 * 10) / 12 = 85
    ("score with drf", {"dominant_resource_weight": 10}, (0, 0), 0.0, POD16, 85),
    # 250m / 200 MiB: cpu 99, memory 99
    ("score empty pod", {}, (0, 0), 0.0, pod(), 99),
    # adapted: upstream requests 8 / 16Gi with limits 16 / 32Gi and estimates from the limit (90);
    # fedsched pods have no limits: 6800m -> 92, 11.2Gi -> 97: 189 / 2 = 94
    ("score request less than limit (requests only)", {}, (0, 0), 0.0, pod(cpu=8 * CPU, mem=16 * GI), 94),
]


@pytest.mark.parametrize(("name", "args", "usage", "age", "p", "expected"), SCORE, ids=[c[0] for c in SCORE])
def test_upstream_score(name, args, usage, age, p, expected):
    st = koord_state(usage, age)
    assert sched(**args).upstream_score(st, p, all_nodes(st))[0] == expected


def test_expired_node_is_refused_below_every_kept_node():
    st = koord_state((0, 0), age=180.0)
    assert KoordinatorLoadAware().score(st, pod(), all_nodes(st))[0] == -REFUSED_OFFSET


# ---- TestDefaultEstimatorEstimatePod -----------------------------------------------------------
# (name, (request, limit) cpu milli, (request, limit) memory bytes, factors, want cpu, want memory)
B = 1024 ** 3  # bytes per Gi
G8 = (8 * B, 8 * B)  # 8Gi requested and limited
ESTIMATE = [
    ("estimate empty pod", (0, 0), (0, 0), (85, 70), DEFAULT_MILLI_CPU_REQUEST, DEFAULT_MEMORY_REQUEST),
    ("estimate guaranteed pod", (4000, 4000), G8, (85, 70), 3400, 6012954214),
    ("estimate burstable pod", (4000, 8000), G8, (85, 70), 6800, 6012954214),  # from the limit
    ("estimate guaranteed pod and zoomed cpu factors", (4000, 4000), G8, (110, 70), 4000, 6012954214),
    ("estimate guaranteed pod and zoomed memory factors", (4000, 4000), G8, (85, 110), 3400, 8 * B),
    ("estimate pod only has request", (4000, 0), (8 * B, 0), (80, 80), 3200, 6871947674),
]


@pytest.mark.parametrize(("name", "cpu", "mem", "factors", "want_cpu", "want_mem"), ESTIMATE,
                         ids=[c[0] for c in ESTIMATE])
def test_upstream_estimate_pod(name, cpu, mem, factors, want_cpu, want_mem):
    assert estimate_pod_usage(cpu[0], factors[0], DEFAULT_MILLI_CPU_REQUEST, limit=cpu[1]) == want_cpu
    assert estimate_pod_usage(mem[0], factors[1], DEFAULT_MEMORY_REQUEST, limit=mem[1]) == want_mem


def test_scheduler_estimates_requests_with_the_scaling_factor_args():
    # 4 cores / 8Gi request, factors 80 / 80 ("only has request"): 3200m, 6871947674 bytes
    k = sched(cpu_estimated_scaling_factor=80, memory_estimated_scaling_factor=80)
    st = koord_state((0, 0))
    cpu, mem = k.estimated_usage(st, pod(cpu=4 * CPU, mem=8 * GI), all_nodes(st))
    assert (int(cpu[0]), int(mem[0])) == (3200, 6871947674)


# ---- the scorer's integer arithmetic ------------------------------------------------------------
def test_least_used_score_is_integer_and_zero_when_over_capacity():
    used, cap = np.array([0, 1, 50, 100, 101, 5]), np.array([100, 3, 100, 100, 100, 0])
    np.testing.assert_array_equal(least_used_score(used, cap), [100, 66, 50, 0, 0, 0])


@pytest.mark.parametrize(("weights", "dominant", "expected"), [
    ((1, 1), 0, 50),  # (20 + 80) / 2
    ((3, 1), 0, 35),  # (60 + 80) / 4
    ((1, 0), 0, 20),  # memory not scored
    ((0, 0), 10, 20),  # DRF alone: the smaller score
    ((1, 1), 2, 35),  # (20 + 80 + 20 * 2) / 4
])
def test_weighted_and_dominant_scores(weights, dominant, expected):
    used = [np.array([80]), np.array([20])]
    cap = [np.array([100]), np.array([100])]
    assert load_aware_score(used, cap, list(weights), dominant)[0] == expected


# ---- the scheduler as place() sees it ------------------------------------------------------------
def three_nodes():
    # 10-core / 100Gi nodes, fresh metrics; CPU use 2, 5, 7 cores, memory 10Gi each
    st = state(cpu=[10 * CPU] * 3, mem=[100 * GI] * 3)
    st.cpu_used[:] = [2 * CPU, 5 * CPU, 7 * CPU]
    st.mem_used[:] = 10 * GI
    st.telemetry = dataclasses.replace(Telemetry.zeros(3), metrics_age_s=np.zeros(3))
    return st


def test_hot_nodes_score_below_kept_ones_and_least_used_wins():
    # pod 1 core / 1Gi -> 850m / 0.7Gi. CPU use 28.5%, 58.5%, 78.5% -> the last one is refused (> 65).
    # cpu scores 71, 41, 21; memory (100 - 10.7)/100 -> 89: (71+89)/2 = 80, (41+89)/2 = 65, (21+89)/2 = 55
    st = three_nodes()
    p = pod(cpu=CPU, mem=GI)
    np.testing.assert_array_equal(KoordinatorLoadAware().score(st, p, all_nodes(st)),
                                  [80, 65, 55 - REFUSED_OFFSET])
    assert place(KoordinatorLoadAware(), st, p, np.random.default_rng(0)).node == 0


def test_when_every_node_is_refused_the_least_used_is_still_chosen():
    st = three_nodes()
    p = pod(cpu=CPU, mem=GI)
    k = sched(cpu_usage_threshold=10)  # every node is above 10% CPU
    assert k.refused(st, p, all_nodes(st)).all()
    assert place(k, st, p, np.random.default_rng(0)).node == 0


def test_without_telemetry_metrics_are_fresh_and_usage_is_cpu_used():
    st = three_nodes()
    st.telemetry = None  # packing mode / replay: no ages
    p = pod(cpu=CPU, mem=GI)
    np.testing.assert_array_equal(KoordinatorLoadAware().score(st, p, all_nodes(st)),
                                  [80, 65, 55 - REFUSED_OFFSET])


def test_stale_node_is_refused_and_a_never_seen_node_scores_zero():
    st = three_nodes()
    st.telemetry.metrics_age_s[:] = [200.0, math.inf, 0.0]
    p = pod(cpu=CPU, mem=GI)
    # node 0: expired -> refused, score 0; node 1: no metrics -> kept, score 0; node 2: hot -> refused
    np.testing.assert_array_equal(KoordinatorLoadAware().score(st, p, all_nodes(st)),
                                  [-REFUSED_OFFSET, 0, 55 - REFUSED_OFFSET])


def test_score_is_upstream_score_with_the_refused_nodes_offset():
    """``score`` computes the metrics' age and the estimate once for Filter and Score: the same
    numbers as upstream's Score with Filter's refused nodes offset, over random use, ages (fresh,
    expired, never seen, unknown) and arguments."""
    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(1, 12))
        st = state(cpu=rng.integers(1, 64, n) * CPU, mem=rng.integers(1, 256, n) * GI)
        st.cpu_used[:] = rng.uniform(0, 1.2, n) * st.nodes.cpu
        st.mem_used[:] = rng.uniform(0, 1.2, n) * st.nodes.mem
        ages = rng.choice([0.0, 30.0, 179.0, 180.0, 500.0, math.inf, math.nan], n)
        st.telemetry = dataclasses.replace(Telemetry.zeros(n), metrics_age_s=ages)
        if rng.random() < 0.2:
            st.telemetry = None
        k = sched(cpu_usage_threshold=int(rng.integers(0, 100)),
                  memory_usage_threshold=int(rng.integers(0, 100)),
                  cpu_weight=int(rng.integers(0, 3)), memory_weight=int(rng.integers(1, 3)),
                  dominant_resource_weight=int(rng.integers(0, 2)))
        p = pod(cpu=int(rng.integers(0, 8000)), mem=int(rng.integers(0, 16 * GI)))
        nodes = all_nodes(st)
        s = k.upstream_score(st, p, nodes).astype(np.float64)
        want = np.where(k.refused(st, p, nodes), s - REFUSED_OFFSET, s)
        assert k.score(st, p, nodes).tobytes() == want.tobytes()
