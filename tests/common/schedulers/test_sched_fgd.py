"""FGD (Fragmentation Gradient Descent) on hand-computed small cases.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/fgd_score.go
(calculateGpuShareFragExtendScore): score = int(sigmoid((F_before - F_after) / 1000) * 100);
a sharing pod is tried on every fitting GPU in index order and keeps the first GPU with
the strictly highest score; other pods use nodeRes.Sub (whole GPUs on fully free GPUs).
There is no upstream test file for FGD's score, so the vectors below are hand-computed.

Notation: free per GPU in milli, F = sum_m p_m F_n(m) (see test_sched_fragmentation.py).
sigmoid values: 100/(1+e^0.125) = 46.88, 100/(1+e^-0.125) = 53.12, 100/(1+e^0.4) = 40.13,
100/(1+e^2) = 11.92.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.schedulers import FGD, SchedulerContext, make_scheduler, place
from fedsched.common.schedulers.fgd import fgd_score
from tests.common.schedulers.sched_testkit import all_nodes, pod, pod_table, set_gpu_free, share, state, whole

# Training pods: 3 x (1000m, 500m GPU share) and 1 x (1000m, 1 whole GPU) -> typical pods
# A = (1000, 500m x 1) p = .75 and B = (1000, 1000m x 1) p = .25 (A alone covers 75% < 95%).
TRAIN = pod_table([(1000, 0, 1, 500)] * 3 + [(1000, 0, 1, 1000)])


def fgd(train=TRAIN) -> FGD:
    return FGD(SchedulerContext(train_pods=train))


def two_node_state():
    st = state(cpu=[8000, 8000], gpu=[2, 2])
    set_gpu_free(st, 1, [1000, 500])
    return st


def test_typical_pods_come_from_the_training_pods():
    f = fgd()
    assert sorted(zip(f.typical.gpu_milli.tolist(), f.typical.freq.tolist(), strict=True)) == [
        (500, 0.75), (1000, 0.25)]


def test_needs_training_pods():
    with pytest.raises(ValueError, match="training pods"):
        FGD(SchedulerContext())
    with pytest.raises(ValueError):
        make_scheduler("fgd")


def test_score_is_truncated_sigmoid_of_the_fragmentation_drop():
    np.testing.assert_array_equal(fgd_score(np.array([0.0, 125.0, -125.0, -400.0, -2000.0, 1e6])),
                                  [50, 53, 46, 40, 11, 100])


# Sharing pod 500m (cpu 1000):
# node1 free [1000, 1000]: F = 0 (A and B fit, no GPU below 500 or 1000 with free share).
#   GPU0 (GPU1 has the same free share, same score) -> [500, 1000]: A frag 0, B frag 500
#   -> F' = .25 * 500 = 125, drop -125 -> 46
# node2 free [1000, 500]: F = .25 * 500 = 125.
#   GPU0 -> [500, 500]: B cannot fit -> all idle 1000 is B's fragment, F' = 250 -> 46
#   GPU1 -> [1000, 0]: A and B fit, no fragment -> F' = 0, drop 125 -> 53
# FGD takes node2 and reserves GPU1 (default best-fit would agree here; see next test).
def test_sharing_pod_goes_where_fragmentation_drops_most():
    st = two_node_state()
    f = fgd()
    np.testing.assert_array_equal(f.score(st, share(500, cpu=1000), all_nodes(st)), [46, 53])
    p = place(f, st, share(500, cpu=1000), np.random.default_rng(0))
    assert (p.node, p.gpus) == (1, (1,))


# The GPU FGD picks is not the tightest fit. Typical pods: only (1000m, 450m x 1).
# node free [500, 900], pod 100m:
#   GPU0 -> [400, 900]: the 450m class still fits; GPU0 (400 < 450) is a fragment, F' = 400,
#          F = 0 -> drop -400 -> 40
#   GPU1 -> [500, 800]: both >= 450 -> F' = 0 -> 50
# FGD reserves GPU1; best fit (base.default_gpu_choice) would take GPU0 (500 -> 400 left).
def test_sharing_pod_gets_the_gpu_that_minimises_fragmentation():
    st = state(cpu=[8000], gpu=[2])
    set_gpu_free(st, 0, [500, 900])
    f = fgd(pod_table([(1000, 0, 1, 450)]))
    assert f.select_gpus(st, share(100, cpu=1000), 0) == (1,)  # no score() needed first
    np.testing.assert_array_equal(f.score(st, share(100, cpu=1000), all_nodes(st)), [50])
    p = place(f, st, share(100, cpu=1000), np.random.default_rng(0))
    assert (p.node, p.gpus) == (0, (1,))


# Ties between GPUs keep the lowest index (upstream: "fragScore > score", strict).
# node free [1000, 1000, 1000]; every GPU gives the same F' -> GPU0.
def test_equal_gpus_keep_the_lowest_index():
    st = state(cpu=[8000], gpu=[3])
    assert fgd().select_gpus(st, share(500, cpu=1000), 0) == (0,)


# Whole-GPU pod 1 x 1000m (cpu 1000):
# node1 [1000, 1000] -> [0, 1000]: A, B fit, no fragment: F' = 0, F = 0 -> 50
# node2 [1000, 500] -> [0, 500]: A fits (frag 0), B cannot -> .25 * 500 = 125 = F -> 50
def test_whole_gpu_pod_hand_computed_and_lowest_free_gpus():
    st = two_node_state()
    f = fgd()
    np.testing.assert_array_equal(f.score(st, whole(1, cpu=1000), all_nodes(st)), [50, 50])
    p = place(f, st, whole(1, cpu=1000), np.random.default_rng(0), node_rank=np.array([1, 0]))
    assert (p.node, p.gpus) == (1, (0,))


# CPU-only pod of 7500m on node1 [1000, 1000] with 8000m: 500m left < 1000m needed by A and B
# -> nothing fits any more, all 2000 idle is fragment: drop -2000 -> 11.
# node2 (16000m) keeps A and B fitting: drop 0 -> 50. FGD keeps CPU away from GPU-starved nodes.
def test_cpu_pod_that_starves_a_gpu_node_of_cpu_is_penalised():
    st = state(cpu=[8000, 16000], gpu=[2, 2])
    f = fgd()
    np.testing.assert_array_equal(f.score(st, pod(cpu=7500), all_nodes(st)), [11, 50])


def test_prefers_placement_that_lowers_cluster_fragmentation():
    # Place the same sharing pod by FGD and by every other choice; FGD's choice must give the
    # lowest cluster fragmentation among all (node, GPU) options.
    st = state(cpu=[8000, 8000, 8000], gpu=[2, 4, 1])
    set_gpu_free(st, 0, [1000, 500])
    set_gpu_free(st, 1, [700, 1000, 300, 1000])
    f = fgd()
    fm = f.frag_model(st)
    p_new = share(500, cpu=1000)

    def cluster_frag(s):
        return fm.node_frag(s.cpu_free, s.gpu_free, s.nodes.model).sum()

    options = {}
    for n in range(3):
        for g in np.flatnonzero(st.gpu_free[n] >= 500):
            s = st.copy()
            s.allocate(n, p_new, (int(g),))
            options[(n, int(g))] = cluster_frag(s)
    p = place(f, st, p_new, np.random.default_rng(0))
    assert options[(p.node, p.gpus[0])] == min(options.values())
