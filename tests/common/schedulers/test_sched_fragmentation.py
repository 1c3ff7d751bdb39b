"""The FGD fragmentation model against the FGD simulator's own test vectors.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/utils/frag_test.go
(TestNodeGpuShareFragAmountScore, TestNodeGpuShareFragAmountWithNonGpu,
TestGetGpuFragMilliByNodeResAndPodRes) and pkg/utils/frag.go (NodeGpuShareFragAmount,
GetNodePodFrag, FragAmountSumExceptQ3).

Upstream's test lists of typical pods carry raw percentages that do not sum to exactly 1.
Upstream computes F = sum_m p_m F_n(m); fedsched uses the identity
F = idle - sum_{m fits} p_m * (free share on GPUs >= q_m), which assumes sum p_m = 1, so
upstream F = fedsched F - (1 - sum p_m) * idle. The tests apply that correction.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.model.fragmentation import FragmentationModel, TypicalPods
from tests.common.schedulers.sched_testkit import pod_table

GPU_TYPES = ("1080", "2080", "T4", "P100", "V100M16")

# frag_test.go TestingGenerateGetTypicalPods: (MilliCpu, MilliGpu, GpuNumber, GpuType, percent)
TYPICAL_PODS = [
    (6000, 465, 1, "", 9.33), (8000, 440, 1, "2080", 9.15), (8000, 475, 1, "T4", 8.76),
    (8000, 440, 1, "P100", 8.72), (2000, 465, 1, "", 8.68), (12000, 900, 1, "", 8.65),
    (4000, 900, 1, "", 8.43), (16000, 678, 1, "T4", 8.36), (8000, 500, 1, "", 8.29),
    (6000, 511, 1, "", 8.11), (14000, 1000, 2, "2080", 0.54), (4000, 1000, 1, "2080", 0.43),
    (32000, 1000, 2, "T4", 0.43), (16000, 1000, 1, "V100M16", 0.40), (64000, 1000, 2, "", 0.40),
    (10000, 1000, 2, "", 0.40), (11400, 1000, 1, "T4", 0.36), (16000, 1000, 1, "T4", 0.36),
    (4000, 1000, 2, "", 0.36), (14000, 1000, 2, "V100M16", 0.36), (8000, 1000, 4, "", 0.36),
    (16000, 1000, 2, "", 0.32), (2000, 1000, 1, "T4", 0.32), (6000, 1000, 1, "", 0.32),
    (4000, 1000, 1, "", 0.32), (5000, 1000, 1, "", 0.32), (32000, 1000, 4, "V100M16", 0.32),
    (32000, 1000, 2, "", 0.32), (24000, 1000, 8, "2080", 0.32), (40000, 1000, 4, "", 0.29),
    (32000, 1000, 8, "", 0.29), (32000, 1000, 1, "T4", 0.29), (16000, 1000, 1, "", 0.25),
    (7000, 1000, 1, "V100M16", 0.25), (24000, 1000, 1, "T4", 0.25),
]

# frag_test.go TestingGenerateGetTypicalPodsWithNonGpu (all GpuType "")
TYPICAL_PODS_WITH_NON_GPU = [
    (15700, 1000, 1, "", 28.69), (11900, 1000, 1, "", 18.93), (11400, 1000, 1, "", 12.27),
    (1000, 0, 0, "", 7.36), (18710, 1000, 1, "", 4.85), (8200, 1000, 1, "", 3.79),
    (16400, 1000, 1, "", 3.31), (9810, 1000, 1, "", 1.97), (15200, 1000, 1, "", 1.87),
    (11200, 1000, 1, "", 1.81), (14200, 1000, 1, "", 1.76), (12000, 0, 0, "", 1.65),
    (14900, 1000, 1, "", 1.39), (60200, 1000, 4, "", 1.23), (64200, 1000, 8, "", 1.07),
    (32200, 1000, 4, "", 1.01), (17400, 1000, 2, "", 0.91), (30200, 1000, 2, "", 0.69),
    (16000, 1000, 1, "", 0.64), (15000, 1000, 1, "", 0.59), (64000, 1000, 8, "", 0.53),
    (15000, 0, 0, "", 0.53), (11910, 1000, 1, "", 0.53), (120200, 1000, 8, "", 0.48),
    (11300, 1000, 1, "", 0.37), (30000, 1000, 2, "", 0.32), (9800, 1000, 1, "", 0.32),
    (8000, 1000, 1, "", 0.32), (2000, 1000, 1, "", 0.27), (2000, 80, 1, "", 0.27),
    (1000, 1000, 1, "", 0.27),
]


def spec(gpu_type: str) -> int:
    return 0 if gpu_type == "" else 1 << GPU_TYPES.index(gpu_type)


def typical(rows) -> TypicalPods:
    a = np.array([(c, g, n, spec(t)) for c, g, n, t, _ in rows], dtype=np.int64)
    return TypicalPods(cpu=a[:, 0], gpu_milli=a[:, 1], num_gpu=a[:, 2], spec_mask=a[:, 3],
                       freq=np.array([p / 100 for *_, p in rows]))


def upstream_frag(rows, cpu_left: int, free, node_type: str) -> float:
    """F as upstream computes it (raw percentages), via fedsched's model plus the correction."""
    typ = typical(rows)
    free = np.asarray(free, dtype=np.int64)
    left = np.zeros((1, 8), dtype=np.int64)
    left[0, :len(free)] = free
    fm = FragmentationModel(typ, len(GPU_TYPES))
    ours = fm.node_frag(np.array([cpu_left]), left, np.array([GPU_TYPES.index(node_type)]))[0]
    return float(ours - (1.0 - typ.freq.sum()) * free.sum())


@pytest.mark.parametrize(("name", "rows", "cpu_left", "free", "node_type", "expected"), [
    # TestNodeGpuShareFragAmountScore
    ("4x1080_used", TYPICAL_PODS, 1000, [200, 1000, 1000, 500], "1080", 2566.62),
    ("4x1080_full", TYPICAL_PODS, 1000, [1000] * 4, "1080", 3802.40),
    ("8x1080_full", TYPICAL_PODS, 1000, [1000] * 8, "1080", 7604.80),
    ("4x1080_used_lack_CPU", TYPICAL_PODS[:1], 1000, [200, 1000, 1000, 500], "1080", 251.91),
    # TestNodeGpuShareFragAmountWithNonGpu (FragAmountSumExceptQ3)
    ("8xP100_empty", TYPICAL_PODS_WITH_NON_GPU, 64000, [1000] * 8, "P100", 887.20),
    ("8xP100_halved", TYPICAL_PODS_WITH_NON_GPU, 32000, [1000] * 4 + [0] * 4, "P100", 554.4),
    ("8xP100_nocpu", TYPICAL_PODS_WITH_NON_GPU, 0, [1000] * 4 + [0] * 4, "P100", 4000),
])
def test_upstream_node_frag_amount(name, rows, cpu_left, free, node_type, expected):
    assert upstream_frag(rows, cpu_left, free, node_type) == pytest.approx(expected, abs=0.01)


# frag_test.go TestGetGpuFragMilliByNodeResAndPodRes: the fragment of a fitting class is the
# free share on GPUs smaller than its per-GPU request. One class (p = 1, cpu 100, node cpu 1000).
@pytest.mark.parametrize(("free", "milli", "num", "expected"), [
    ([200, 1000, 1000, 500], 1000, 2, 700),  # "4x1080_used", pod 2 x 1000m
    ([1000] * 4, 1000, 2, 0),  # "4x1080_full"
    ([1000] * 8, 1000, 2, 0),  # "8x1080_full"
    ([200, 1000, 1000, 500], 200, 2, 0),  # "4x1080_used", pod 2 x 200m
])
def test_upstream_gpu_frag_milli_of_a_fitting_class(free, milli, num, expected):
    assert upstream_frag([(100, milli, num, "1080", 100.0)], 1000, free, "1080") == expected


# Hand-computed with the raw percentages of "4x1080_used_lack_CPU": the only class needs
# 6000m CPU but the node has 1000m (Q4 lack CPU) -> all idle GPU is fragment:
# 0.0933 * (200 + 1000 + 1000 + 500) = 251.91
def test_lack_of_cpu_makes_all_idle_gpu_a_fragment():
    assert upstream_frag(TYPICAL_PODS[:1], 1000, [200, 1000, 1000, 500], "1080") == pytest.approx(251.91)
    # with enough CPU (Q3), the 465m class only loses the 200m GPU: 0.0933 * 200 = 18.66
    assert upstream_frag(TYPICAL_PODS[:1], 6000, [200, 1000, 1000, 500], "1080") == pytest.approx(18.66)


def upstream_transliteration(rows, cpu_left, free, node_type) -> float:
    """frag.go NodeGpuShareFragAmount(...).FragAmountSumExceptQ3(), category by category."""
    idle = sum(free)
    total = 0.0
    for cpu, milli, num, gpu_type, pct in rows:
        p = pct / 100
        if milli == 0:  # XLSatisfied / XRLackCPU: all idle GPU
            total += p * idle
            continue
        if gpu_type and gpu_type != node_type:  # NoAccess
            total += p * idle
            continue
        fits_gpu = sum(1 for f in free if f >= milli) >= num  # CanNodeHostPodOnGpuMemory
        if fits_gpu and cpu_left >= cpu:  # Q3Satisfied: only GPUs below the request
            total += p * sum(f for f in free if f < milli)
        else:  # Q1 / Q2 / Q4
            total += p * idle
    return total


@settings(max_examples=60, deadline=None)
@given(
    cpu_left=st.integers(0, 70000),
    node_type=st.sampled_from(GPU_TYPES),
    free=st.lists(st.sampled_from([0, 80, 200, 465, 500, 535, 900, 1000]), min_size=1, max_size=8),
    which=st.sampled_from(["gpu", "nongpu"]),
)
def test_model_matches_upstream_transliteration(cpu_left, node_type, free, which):
    rows = TYPICAL_PODS if which == "gpu" else TYPICAL_PODS_WITH_NON_GPU
    assert upstream_frag(rows, cpu_left, free, node_type) == pytest.approx(
        upstream_transliteration(rows, cpu_left, free, node_type), abs=1e-6)


def test_typical_pods_order_count_then_larger_request_first():
    # Upstream SortTargetPodInDecreasingCount: reverse of (count, cpu, milli, num, type) ascending.
    pods = pod_table([(1000, 0, 1, 500)] * 2 + [(2000, 0, 1, 500)] * 2 + [(2000, 0, 1, 300)] * 2
                     + [(4000, 0, 0, 0)] * 3)
    typ = TypicalPods.from_pods(pods, threshold=1.0)
    assert list(zip(typ.cpu.tolist(), typ.gpu_milli.tolist(), strict=True)) == [
        (4000, 0), (2000, 500), (2000, 300), (1000, 500)]
    np.testing.assert_allclose(typ.freq, [3 / 9, 2 / 9, 2 / 9, 2 / 9])


def test_typical_pods_stop_at_the_class_reaching_95_percent_and_renormalise():
    # 20 pods: 10 A, 9 B, 1 C. 95% of 20 = 19: A (10 < 19) then B (19, reached) -> C left out
    # (upstream GetTypicalPods with podIncreaseStep 1, the FGD artefact's setting).
    pods = pod_table([(1000, 0, 1, 500)] * 10 + [(2000, 0, 1, 1000)] * 9 + [(8000, 0, 0, 0)])
    typ = TypicalPods.from_pods(pods)
    assert len(typ) == 2
    np.testing.assert_allclose(typ.freq, [10 / 19, 9 / 19])


def test_typical_pods_use_non_zero_cpu():
    typ = TypicalPods.from_pods(pod_table([(0, 0, 1, 500)]))
    assert typ.cpu.tolist() == [100]
