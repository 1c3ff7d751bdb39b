"""place(), feasibility, default GPU choice and the scheduler registry (schedulers/base.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from fedsched.common.schedulers import (
    BASELINES,
    LeastAllocated,
    Placement,
    Scheduler,
    SchedulerContext,
    default_gpu_choice,
    make_scheduler,
    place,
)
from tests.common.schedulers.sched_testkit import pod, pod_table, set_gpu_free, share, state, whole


class Const(Scheduler):
    """Scores every candidate with fixed per-node values."""

    name = "const"

    def __init__(self, values):
        super().__init__()
        self.values = np.asarray(values, dtype=float)

    def score(self, state, pod, nodes):
        return self.values[nodes]


# ---- tie-breaking ---------------------------------------------------------------------------

def test_ties_are_broken_uniformly_without_node_rank():
    st = state(cpu=[4000] * 5)
    sched = Const([7, 7, 3, 7, 7])
    rng = np.random.default_rng(1)
    counts = np.zeros(5, dtype=int)
    for _ in range(4000):
        counts[place(sched, st, pod(cpu=100), rng).node] += 1
    assert counts[2] == 0
    assert chisquare(counts[[0, 1, 3, 4]]).statistic < 16.27, counts  # 3 dof, p = 0.001


def test_ties_go_to_the_best_ranked_node_with_node_rank():
    st = state(cpu=[4000] * 5)
    rank = np.array([3, 0, 4, 2, 1])  # node2 best-ranked overall, node5 best among the tied
    sched = Const([7, 5, 3, 7, 7])
    for seed in range(10):
        assert place(sched, st, pod(cpu=100), np.random.default_rng(seed), node_rank=rank).node == 4


def test_node_rank_does_not_override_a_unique_best():
    st = state(cpu=[4000] * 3)
    assert place(Const([1, 9, 1]), st, pod(), np.random.default_rng(0),
                 node_rank=np.array([0, 2, 1])).node == 1


def test_real_scheduler_ties_are_uniform():
    # LeastAllocated on identical nodes: every node ties.
    st = state(cpu=[4000] * 3, mem=[8192] * 3)
    rng = np.random.default_rng(5)
    counts = np.bincount([place(LeastAllocated(), st, pod(cpu=500), rng).node for _ in range(3000)],
                         minlength=3)
    assert chisquare(counts).statistic < 13.82, counts  # 2 dof, p = 0.001


# ---- nothing fits, candidates, score validation ----------------------------------------------

def test_returns_node_minus_one_when_nothing_fits():
    st = state(cpu=[1000, 2000], gpu=[0, 1])
    assert place(Const([1, 1]), st, pod(cpu=3000), np.random.default_rng(0)) == Placement(-1)
    p = place(Const([1, 1]), st, whole(2), np.random.default_rng(0))
    assert p.node == -1 and p.gpus == ()


def test_candidates_restrict_the_choice():
    st = state(cpu=[4000] * 4)
    sched = Const([9, 1, 5, 7])
    assert place(sched, st, pod(), np.random.default_rng(0), candidates=np.array([1, 2])).node == 2
    # an infeasible candidate stays excluded
    st.allocate(2, pod(cpu=4000), ())
    assert place(sched, st, pod(cpu=1), np.random.default_rng(0), candidates=np.array([1, 2])).node == 1
    assert place(sched, st, pod(cpu=1), np.random.default_rng(0), candidates=np.array([2])).node == -1


def test_only_feasible_nodes_are_scored():
    seen = []

    class Spy(Scheduler):
        name = "spy"

        def score(self, state, pod, nodes):
            seen.append(nodes.copy())
            return np.zeros(len(nodes))

    st = state(cpu=[1000, 4000, 500, 4000])
    place(Spy(), st, pod(cpu=1000), np.random.default_rng(0))
    np.testing.assert_array_equal(seen[0], [0, 1, 3])


@pytest.mark.parametrize("bad", [np.zeros(1), np.array([1.0, np.nan]), np.array([np.inf, 0.0])])
def test_bad_scores_raise(bad):
    class Bad(Scheduler):
        name = "bad"

        def score(self, state, pod, nodes):
            return bad

    with pytest.raises(ValueError):
        place(Bad(), state(cpu=[4000, 4000]), pod(), np.random.default_rng(0))


# ---- feasibility ----------------------------------------------------------------------------

def test_feasibility_cpu_and_memory_boundaries():
    st = state(cpu=[2000, 2000, 2000], mem=[1024, 1024, 1024])
    st.allocate(0, pod(cpu=1000, mem=24), ())
    st.allocate(1, pod(cpu=1001), ())
    st.allocate(2, pod(mem=25), ())
    np.testing.assert_array_equal(st.feasible(pod(cpu=1000, mem=1000)), [True, False, False])


def test_feasibility_uses_actual_requests_not_non_zero_defaults():
    st = state(cpu=[1000], mem=[1024])
    st.allocate(0, pod(cpu=1000, mem=1024), ())
    assert st.feasible(pod())[0]  # a request-less pod fits a full node (kube: fit uses requests)


def test_feasibility_respects_gpu_model_masks():
    # models ("A100", "V100"); node4 has no GPUs (model -1)
    st = state(cpu=[8000] * 4, gpu=[2, 2, 2, 0], model=[0, 1, 1, -1])
    np.testing.assert_array_equal(st.feasible(whole(1, spec_mask=0b01)), [True, False, False, False])
    np.testing.assert_array_equal(st.feasible(share(500, spec_mask=0b10)), [False, True, True, False])
    np.testing.assert_array_equal(st.feasible(whole(1, spec_mask=0b11)), [True, True, True, False])
    np.testing.assert_array_equal(st.feasible(whole(1)), [True, True, True, False])
    # the mask only constrains GPU pods
    np.testing.assert_array_equal(st.feasible(pod(cpu=100, spec_mask=0b01)), [True] * 4)


def test_feasibility_counts_only_fully_free_gpus_for_whole_gpu_pods():
    st = state(cpu=[8000] * 3, gpu=[4, 4, 2])
    set_gpu_free(st, 0, [999, 1000, 1000, 1000])  # 3 fully free
    set_gpu_free(st, 1, [500, 500, 1000, 1000])  # 2 fully free, 2000 milli free in all
    np.testing.assert_array_equal(st.feasible(whole(3)), [True, False, False])
    np.testing.assert_array_equal(st.feasible(whole(2)), [True, True, True])
    np.testing.assert_array_equal(st.feasible(whole(4)), [False, False, False])


def test_feasibility_share_needs_one_gpu_with_enough_free_share():
    st = state(cpu=[8000] * 3, gpu=[2, 2, 0])
    set_gpu_free(st, 0, [400, 300])  # 700 free in total, no GPU with 500
    set_gpu_free(st, 1, [500, 0])  # exactly 500 on GPU0
    np.testing.assert_array_equal(st.feasible(share(500)), [False, True, False])
    np.testing.assert_array_equal(st.feasible(share(400)), [True, True, False])


def test_dead_nodes_are_infeasible():
    st = state(cpu=[4000, 4000])
    st.alive[0] = False
    np.testing.assert_array_equal(st.feasible(pod()), [False, True])
    assert place(Const([9, 1]), st, pod(), np.random.default_rng(0)).node == 1


# ---- default GPU choice -----------------------------------------------------------------------

def test_default_gpu_choice():
    st = state(cpu=[8000], gpu=[6])
    set_gpu_free(st, 0, [1000, 600, 1000, 450, 450, 300])
    assert default_gpu_choice(st, pod(cpu=100), 0) == ()
    assert default_gpu_choice(st, share(400), 0) == (3,)  # tightest fit, lowest index among equals
    assert default_gpu_choice(st, share(500), 0) == (1,)
    assert default_gpu_choice(st, share(700), 0) == (0,)  # only fully free GPUs fit
    assert default_gpu_choice(st, whole(2), 0) == (0, 2)


# ---- registry -------------------------------------------------------------------------------

def test_every_baseline_is_registered_under_its_name():
    ctx = SchedulerContext(train_pods=pod_table([(1000, 0, 1, 500)]))
    assert set(BASELINES) == {
        "kube-default", "least-allocated", "most-allocated", "balanced-allocation", "best-fit",
        "dot-product", "gpu-packing", "gpu-clustering", "fgd", "target-load-packing",
        "load-variation-risk-balancing", "koordinator-load-aware", "random"}
    for name, cls in BASELINES.items():
        sched = make_scheduler(name, ctx)
        assert isinstance(sched, cls) and sched.name == name
    with pytest.raises(ValueError, match="unknown policy"):
        make_scheduler("no-such-policy", ctx)
