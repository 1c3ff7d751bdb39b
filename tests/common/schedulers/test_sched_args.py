"""Every baseline's typed ``Args``: upstream defaults, validation, and make_scheduler(args=...).

Upstream defaults: kubernetes pkg/scheduler/apis/config/v1/defaults.go (NodeResourcesFit
scoring-strategy resources cpu 1 / memory 1, weights validated in (0, 100]),
kubernetes-sigs/scheduler-plugins apis/config/v1/defaults.go (TargetLoadPacking: targetUtilization
40, defaultRequests cpu 1000m, defaultRequestsMultiplier "1.5"; LoadVariationRiskBalancing:
safeVarianceMargin 1, safeVarianceSensitivity 1), koordinator-sh/koordinator
pkg/scheduler/apis/config/v1/defaults.go (LoadAware: resourceWeights cpu 1 / memory 1,
usageThresholds cpu 65 / memory 95, estimatedScalingFactors cpu 85 / memory 70,
nodeMetricExpirationSeconds 180; ranges from validation/validation_pluginargs.go), and the FGD simulator's
published run config (typicalPodsConfig.podPopularityThreshold 95). The remaining baselines
take no configuration upstream (or none that fedsched implements) and have an empty Args.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from fedsched.common.schedulers import (
    BASELINES,
    FGD,
    BalancedAllocationArgs,
    BestFitArgs,
    DotProductArgs,
    FGDArgs,
    GpuClusteringArgs,
    GpuPackingArgs,
    KoordinatorLoadAwareArgs,
    KubeDefaultArgs,
    LeastAllocated,
    LeastAllocatedArgs,
    LoadVariationRiskBalancingArgs,
    MostAllocatedArgs,
    RandomScoreArgs,
    SchedulerArgs,
    SchedulerContext,
    TargetLoadPacking,
    TargetLoadPackingArgs,
    make_scheduler,
    place,
)
from fedsched.common.schedulers.kube_default import balanced_allocation_v137
from fedsched.common.schedulers.target_load_packing import target_load_packing_score
from tests.common.schedulers.sched_testkit import (
    all_nodes,
    pod,
    pod_table,
    set_gpu_free,
    set_node_info,
    share,
    state,
)

# FGD needs training pods: 3 x (1000m, 500m share) + 1 x (1000m, 1 whole GPU), as in test_sched_fgd.py
TRAIN = pod_table([(1000, 0, 1, 500)] * 3 + [(1000, 0, 1, 1000)])


def ctx(seed: int = 0) -> SchedulerContext:
    return SchedulerContext(train_pods=TRAIN, rng=np.random.default_rng(seed))


# ---- the Args of every baseline and their upstream defaults --------------------------------

UPSTREAM_DEFAULTS = {
    "kube-default": (KubeDefaultArgs, {}),
    "least-allocated": (LeastAllocatedArgs, {"cpu_weight": 1, "memory_weight": 1}),
    "most-allocated": (MostAllocatedArgs, {"cpu_weight": 1, "memory_weight": 1}),
    "balanced-allocation": (BalancedAllocationArgs, {}),
    "best-fit": (BestFitArgs, {}),
    "dot-product": (DotProductArgs, {}),
    "gpu-packing": (GpuPackingArgs, {}),
    "gpu-clustering": (GpuClusteringArgs, {}),
    "fgd": (FGDArgs, {"pod_popularity_threshold": 95}),
    "target-load-packing": (TargetLoadPackingArgs, {
        "target_utilization": 40, "default_requests_milli_cores": 1000,
        "default_requests_multiplier": 1.5}),
    "load-variation-risk-balancing": (LoadVariationRiskBalancingArgs, {
        "safe_variance_margin": 1.0, "safe_variance_sensitivity": 1.0}),
    "koordinator-load-aware": (KoordinatorLoadAwareArgs, {
        "cpu_weight": 1, "memory_weight": 1, "dominant_resource_weight": 0,
        "cpu_usage_threshold": 65, "memory_usage_threshold": 95,
        "cpu_estimated_scaling_factor": 85, "memory_estimated_scaling_factor": 70,
        "node_metric_expiration_seconds": 180}),
    "random": (RandomScoreArgs, {}),
}


def test_every_baseline_is_in_the_defaults_table():
    assert set(UPSTREAM_DEFAULTS) == set(BASELINES)


@pytest.mark.parametrize("name", sorted(UPSTREAM_DEFAULTS))
def test_args_type_is_exposed_on_the_class_with_the_upstream_defaults(name):
    args_type, defaults = UPSTREAM_DEFAULTS[name]
    cls = BASELINES[name]
    assert cls.Args is args_type
    assert issubclass(args_type, SchedulerArgs) and args_type is not SchedulerArgs
    assert dataclasses.is_dataclass(args_type) and args_type.__dataclass_params__.frozen
    assert {f.name: f.default for f in dataclasses.fields(args_type)} == defaults
    assert dataclasses.asdict(args_type()) == defaults
    assert make_scheduler(name, ctx()).args == args_type()


def test_each_baseline_has_an_args_type_of_its_own():
    assert len({cls.Args for cls in BASELINES.values()}) == len(BASELINES)


@pytest.mark.parametrize(("args_type", "field"), [
    (TargetLoadPackingArgs, "target_utilization"), (LeastAllocatedArgs, "cpu_weight"),
    (FGDArgs, "pod_popularity_threshold")])
def test_args_are_frozen(args_type, field):
    args = args_type()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(args, field, 50)


# ---- validation ----------------------------------------------------------------------------

# The allowed range each message must name, per (Args type, field).
ALLOWED = {
    (TargetLoadPackingArgs, "target_utilization"): "integers with 0 < target_utilization < 100",
    (TargetLoadPackingArgs, "default_requests_milli_cores"):
        "integers with 0 <= default_requests_milli_cores",
    (TargetLoadPackingArgs, "default_requests_multiplier"):
        "finite numbers with 0 < default_requests_multiplier",
    (LeastAllocatedArgs, "cpu_weight"): "integers with 1 <= cpu_weight <= 100",
    (LeastAllocatedArgs, "memory_weight"): "integers with 1 <= memory_weight <= 100",
    (MostAllocatedArgs, "cpu_weight"): "integers with 1 <= cpu_weight <= 100",
    (MostAllocatedArgs, "memory_weight"): "integers with 1 <= memory_weight <= 100",
    (FGDArgs, "pod_popularity_threshold"): "integers with 0 < pod_popularity_threshold <= 100",
    (LoadVariationRiskBalancingArgs, "safe_variance_margin"): "finite numbers with 0 <= safe_variance_margin",
    (LoadVariationRiskBalancingArgs, "safe_variance_sensitivity"):
        "finite numbers with 0 <= safe_variance_sensitivity",
    (KoordinatorLoadAwareArgs, "cpu_weight"): "integers with 0 <= cpu_weight <= 100",
    (KoordinatorLoadAwareArgs, "memory_weight"): "integers with 0 <= memory_weight <= 100",
    (KoordinatorLoadAwareArgs, "dominant_resource_weight"):
        "integers with 0 <= dominant_resource_weight <= 100",
    (KoordinatorLoadAwareArgs, "cpu_usage_threshold"): "integers with 0 <= cpu_usage_threshold <= 100",
    (KoordinatorLoadAwareArgs, "memory_usage_threshold"): "integers with 0 <= memory_usage_threshold <= 100",
    (KoordinatorLoadAwareArgs, "cpu_estimated_scaling_factor"):
        "integers with 1 <= cpu_estimated_scaling_factor <= 100",
    (KoordinatorLoadAwareArgs, "memory_estimated_scaling_factor"):
        "integers with 1 <= memory_estimated_scaling_factor <= 100",
    (KoordinatorLoadAwareArgs, "node_metric_expiration_seconds"):
        "integers with 1 <= node_metric_expiration_seconds",
}

BAD = [
    (TargetLoadPackingArgs, "target_utilization", 0),
    (TargetLoadPackingArgs, "target_utilization", 100),
    (TargetLoadPackingArgs, "target_utilization", -1),
    (TargetLoadPackingArgs, "target_utilization", 101),
    (TargetLoadPackingArgs, "target_utilization", 40.5),
    (TargetLoadPackingArgs, "target_utilization", True),
    (TargetLoadPackingArgs, "target_utilization", "50"),
    (TargetLoadPackingArgs, "default_requests_milli_cores", -1),
    (TargetLoadPackingArgs, "default_requests_milli_cores", 1000.5),
    (TargetLoadPackingArgs, "default_requests_multiplier", 0),
    (TargetLoadPackingArgs, "default_requests_multiplier", -1.5),
    (TargetLoadPackingArgs, "default_requests_multiplier", float("nan")),
    (TargetLoadPackingArgs, "default_requests_multiplier", float("inf")),
    (TargetLoadPackingArgs, "default_requests_multiplier", "1.5"),
    (LeastAllocatedArgs, "cpu_weight", 0),
    (LeastAllocatedArgs, "cpu_weight", 101),
    (LeastAllocatedArgs, "memory_weight", -1),
    (LeastAllocatedArgs, "memory_weight", 1.0),
    (MostAllocatedArgs, "cpu_weight", 0),
    (MostAllocatedArgs, "memory_weight", 101),
    (FGDArgs, "pod_popularity_threshold", 0),
    (FGDArgs, "pod_popularity_threshold", 101),
    (FGDArgs, "pod_popularity_threshold", 0.95),
    # upstream defaulting replaces negative LoadVariationRiskBalancing args by 1; fedsched refuses them
    (LoadVariationRiskBalancingArgs, "safe_variance_margin", -5),
    (LoadVariationRiskBalancingArgs, "safe_variance_margin", float("nan")),
    (LoadVariationRiskBalancingArgs, "safe_variance_sensitivity", -1),
    (LoadVariationRiskBalancingArgs, "safe_variance_sensitivity", "2"),
    # koordinator validation: weights (0, 100] (0 here = not in resourceWeights), dominant weight
    # [0, 100], thresholds [0, 100], scaling factors (0, 100], expiration > 0
    (KoordinatorLoadAwareArgs, "cpu_weight", -1),
    (KoordinatorLoadAwareArgs, "memory_weight", 101),
    (KoordinatorLoadAwareArgs, "dominant_resource_weight", 101),
    (KoordinatorLoadAwareArgs, "dominant_resource_weight", -1),
    (KoordinatorLoadAwareArgs, "cpu_usage_threshold", 101),
    (KoordinatorLoadAwareArgs, "memory_usage_threshold", -1),
    (KoordinatorLoadAwareArgs, "cpu_usage_threshold", 65.5),
    (KoordinatorLoadAwareArgs, "cpu_estimated_scaling_factor", 0),
    (KoordinatorLoadAwareArgs, "memory_estimated_scaling_factor", 110),
    (KoordinatorLoadAwareArgs, "node_metric_expiration_seconds", 0),
    (KoordinatorLoadAwareArgs, "node_metric_expiration_seconds", -180),
]


def test_every_knob_has_its_range_in_the_table():
    assert set(ALLOWED) == {(cls.Args, f.name) for cls in BASELINES.values()
                            for f in dataclasses.fields(cls.Args)}


@pytest.mark.parametrize(("args_type", "field", "value"), BAD,
                         ids=[f"{t.__name__}.{f}={v!r}" for t, f, v in BAD])
def test_bad_values_are_refused_naming_field_value_and_range(args_type, field, value):
    with pytest.raises(ValueError) as err:
        args_type(**{field: value})
    msg = str(err.value)
    assert f"{args_type.__name__}.{field} = {value!r}" in msg
    assert f"allowed: {ALLOWED[args_type, field]}" in msg


GOOD = [
    # (Args type, field, value, stored value): the edges of every range are accepted
    (TargetLoadPackingArgs, "target_utilization", 1, 1),
    (TargetLoadPackingArgs, "target_utilization", 99, 99),
    (TargetLoadPackingArgs, "default_requests_milli_cores", 0, 0),
    (TargetLoadPackingArgs, "default_requests_multiplier", 2, 2.0),  # an int is stored as float
    (TargetLoadPackingArgs, "default_requests_multiplier", 0.5, 0.5),
    (LeastAllocatedArgs, "cpu_weight", 1, 1),
    (LeastAllocatedArgs, "memory_weight", 100, 100),
    (MostAllocatedArgs, "cpu_weight", 100, 100),
    (FGDArgs, "pod_popularity_threshold", 1, 1),
    (FGDArgs, "pod_popularity_threshold", 100, 100),
    (LoadVariationRiskBalancingArgs, "safe_variance_margin", 0, 0.0),
    (LoadVariationRiskBalancingArgs, "safe_variance_sensitivity", 0, 0.0),
    (LoadVariationRiskBalancingArgs, "safe_variance_sensitivity", 2, 2.0),
    (KoordinatorLoadAwareArgs, "cpu_weight", 0, 0),
    (KoordinatorLoadAwareArgs, "memory_weight", 100, 100),
    (KoordinatorLoadAwareArgs, "dominant_resource_weight", 100, 100),
    (KoordinatorLoadAwareArgs, "cpu_usage_threshold", 0, 0),
    (KoordinatorLoadAwareArgs, "memory_usage_threshold", 100, 100),
    (KoordinatorLoadAwareArgs, "cpu_estimated_scaling_factor", 1, 1),
    (KoordinatorLoadAwareArgs, "memory_estimated_scaling_factor", 100, 100),
    (KoordinatorLoadAwareArgs, "node_metric_expiration_seconds", 1, 1),
]


@pytest.mark.parametrize(("args_type", "field", "value", "stored"), GOOD)
def test_values_at_the_edges_are_accepted(args_type, field, value, stored):
    got = getattr(args_type(**{field: value}), field)
    assert got == stored and type(got) is type(stored)


@pytest.mark.parametrize("target", [0, 100, -1, 101])
def test_the_score_function_refuses_a_target_it_would_divide_by_zero_with(target):
    # (100 - T) * U / T and T * (100 - U) / (100 - T): T = 0 or 100 divides by zero
    with pytest.raises(ValueError, match=re.escape(f"target = {target!r} is out of range")):
        target_load_packing_score(np.array([0.0]), np.array([1000.0]), 0.0, target)


# ---- make_scheduler passes the Args on, and they change the scores ---------------------------

@pytest.mark.parametrize("name", sorted(BASELINES))
def test_make_scheduler_passes_args_through(name):
    args = BASELINES[name].Args()
    sched = make_scheduler(name, ctx(), args)
    assert sched.args is args
    assert make_scheduler(name, ctx(), args=None).args == args  # None = the defaults


def tlp_state():
    # capacity 10000m each, pod 1000m -> 1500m predicted: U = 15, 35, 75 %
    st = state(cpu=[10000, 10000, 10000])
    st.cpu_used[:] = [0.0, 2000.0, 6000.0]
    return st


# target 20: U=15 -> 80*15/20+20 = 80; U=35 -> 20*65/80 = 16.25 -> 16; U=75 -> 20*25/80 = 6.25 -> 6
# target 40: 63, 93, 17 (test_sched_target_load_packing.py)
# target 80: U=15 -> 20*15/80+80 = 83.75 -> 84; U=35 -> 88.75 -> 89; U=75 -> 98.75 -> 99
@pytest.mark.parametrize(("target", "scores", "choice"), [
    (20, [80, 16, 6], 0), (40, [63, 93, 17], 1), (80, [84, 89, 99], 2)])
def test_target_utilization_changes_target_load_packings_choice(target, scores, choice):
    sched = make_scheduler("target-load-packing", args=TargetLoadPackingArgs(target_utilization=target))
    st = tlp_state()
    np.testing.assert_array_equal(sched.score(st, pod(cpu=1000), all_nodes(st)), scores)
    assert place(sched, st, pod(cpu=1000), np.random.default_rng(0)).node == choice


# Prediction for a pod with a 1000m request: request * multiplier; without one: the default.
# U on 10000m nodes used 1000m: multiplier 3 -> (1000+3000)/10000 = 40 -> 100 (at the target);
# default requests 5000m for a pod without request -> U = 60 -> 40*40/60 = 26.67 -> 27.
@pytest.mark.parametrize(("args", "p", "score"), [
    (TargetLoadPackingArgs(), pod(cpu=1000), 78),  # U = 25 -> 60*25/40+40 = 77.5 -> 78
    (TargetLoadPackingArgs(default_requests_multiplier=3), pod(cpu=1000), 100),
    (TargetLoadPackingArgs(), pod(cpu=0), 70),  # 1000m default -> U = 20 -> 70
    (TargetLoadPackingArgs(default_requests_milli_cores=5000), pod(cpu=0), 27),
])
def test_request_prediction_args_change_the_score(args, p, score):
    st = state(cpu=[10000])
    st.cpu_used[:] = [1000.0]
    assert TargetLoadPacking(args=args).score(st, p, all_nodes(st))[0] == score


def weights_state():
    # node1 has its CPU mostly requested, node2 its memory; the pod asks 1000m / 1000 MiB.
    st = state(cpu=[10000, 10000], mem=[10000, 10000])
    set_node_info(st, 0, (8000, 0))
    set_node_info(st, 1, (0, 8000))
    return st


# LeastAllocated per resource: node1 cpu (10000-9000)*100/10000 = 10, mem 90; node2 cpu 90, mem 10.
# MostAllocated: node1 cpu 90, mem 10; node2 cpu 10, mem 90.
@pytest.mark.parametrize(("name", "weights", "scores"), [
    ("least-allocated", (1, 1), [50, 50]),
    ("least-allocated", (3, 1), [30, 70]),  # (10*3 + 90) // 4, (90*3 + 10) // 4
    ("least-allocated", (1, 3), [70, 30]),
    ("least-allocated", (100, 1), [10, 89]),  # (1000 + 90) // 101 = 10, (9000 + 10) // 101 = 89
    ("most-allocated", (1, 1), [50, 50]),
    ("most-allocated", (3, 1), [70, 30]),
    ("most-allocated", (1, 3), [30, 70]),
])
def test_resource_weights_change_the_fit_scores(name, weights, scores):
    args = BASELINES[name].Args(cpu_weight=weights[0], memory_weight=weights[1])
    st = weights_state()
    p = pod(cpu=1000, mem=1000)
    np.testing.assert_array_equal(make_scheduler(name, args=args).score(st, p, all_nodes(st)), scores)


def test_kube_default_keeps_the_default_fit_weights():
    # kube-default = LeastAllocated (weights 1, 1: [50, 50]) + 1.37's BalancedAllocation: node1
    # with (.9, .1) -> 60, without (.8, 0) -> 60: 50 + 50 // 2 = 75; node2 the same mirrored.
    st = weights_state()
    p = pod(cpu=1000, mem=1000)
    kube = make_scheduler("kube-default").score(st, p, all_nodes(st))
    least = LeastAllocated().score(st, p, all_nodes(st))
    np.testing.assert_array_equal(least, [50, 50])
    np.testing.assert_array_equal(kube, least + balanced_allocation_v137(st, p, all_nodes(st)))
    np.testing.assert_array_equal(kube, [125, 125])


# With threshold 50 the typical pods are class A alone (3 of 4 pods = 75% >= 50%): a 500m share
# leaves no GPU below 500m on either node, so no fragmentation change and both nodes score 50;
# with 95 (A .75, B .25) the scores are 46 and 53 (test_sched_fgd.py).
@pytest.mark.parametrize(("threshold", "typical", "scores"), [
    (50, [(500, 1.0)], [50, 50]), (95, [(500, 0.75), (1000, 0.25)], [46, 53])])
def test_pod_popularity_threshold_changes_fgds_typical_pods(threshold, typical, scores):
    sched = make_scheduler("fgd", ctx(), FGDArgs(pod_popularity_threshold=threshold))
    assert isinstance(sched, FGD)
    assert sorted(zip(sched.typical.gpu_milli.tolist(), sched.typical.freq.tolist(), strict=True)) == typical
    st = state(cpu=[8000, 8000], gpu=[2, 2])
    set_gpu_free(st, 1, [1000, 500])
    np.testing.assert_array_equal(sched.score(st, share(500, cpu=1000), all_nodes(st)), scores)


# ---- wrong Args types are refused ------------------------------------------------------------

WRONG = [
    ("target-load-packing", FGDArgs()),
    ("least-allocated", MostAllocatedArgs()),  # same fields, another plugin's Args
    ("most-allocated", LeastAllocatedArgs()),
    ("kube-default", LeastAllocatedArgs()),
    ("best-fit", DotProductArgs()),
    ("random", SchedulerArgs()),
    ("fgd", TargetLoadPackingArgs()),
    ("target-load-packing", {"target_utilization": 50}),  # a plain dict is not an Args
]


@pytest.mark.parametrize(("name", "args"), WRONG, ids=[f"{n}<-{type(a).__name__}" for n, a in WRONG])
def test_wrong_args_type_is_refused(name, args):
    expected = BASELINES[name].Args.__name__
    with pytest.raises(TypeError, match=rf"{re.escape(name)} takes {expected} .*got {type(args).__name__}"):
        make_scheduler(name, ctx(), args)
    with pytest.raises(TypeError, match=expected):
        BASELINES[name](ctx(), args=args)


def test_args_for_a_policy_that_is_not_a_baseline_are_refused():
    with pytest.raises(TypeError, match="only baselines take scheduler arguments; 'learned'"):
        make_scheduler("learned", ctx(), TargetLoadPackingArgs())


def test_koordinator_refuses_all_weights_zero():
    # upstream cannot express it: empty resourceWeights without a dominant weight get the defaults
    with pytest.raises(ValueError, match="cpu_weight, memory_weight and dominant_resource_weight are all 0"):
        KoordinatorLoadAwareArgs(cpu_weight=0, memory_weight=0)
    assert KoordinatorLoadAwareArgs(cpu_weight=0, memory_weight=0, dominant_resource_weight=1).cpu_weight == 0


def test_existing_call_forms_still_work():
    assert make_scheduler("target-load-packing").args == TargetLoadPackingArgs()
    assert make_scheduler("fgd", ctx()).args == FGDArgs()
    assert TargetLoadPacking().args == TargetLoadPackingArgs()
    assert TargetLoadPacking(SchedulerContext()).args == TargetLoadPackingArgs()
