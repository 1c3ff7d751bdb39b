"""Packing mode: the published protocol, invariants, determinism and fidelity."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.metrics import METRICS, binned_curve
from fedsched.common.schedulers import BASELINES, Placement, SchedulerContext, make_scheduler, place
from fedsched.common.sim.packing import PackingSimulator, packing_workload, run_packing
from tests.builders import make_nodes, make_pods
from tests.paths import REPO

PUBLISHED = REPO / "bench" / "data" / "fgd-atc23" / "analysis_allo_discrete.csv"


def test_workload_keeps_every_pod_then_samples_until_target():
    nodes = make_nodes([8000] * 2, [8192] * 2, [2, 2])  # 4000 milli-GPU
    pods = make_pods([100] * 3, [1] * 3, [1, 1, 0], [500, 1000, 0])
    order = packing_workload(pods, nodes, 1.3, np.random.default_rng(0))
    assert sorted(order[:3].tolist()) == [0, 1, 2]  # every pod of the pool, shuffled
    arrived = pods.gpu_request[order].sum()
    assert arrived <= 1.3 * 4000
    assert arrived + 500 > 1.3 * 4000 or arrived + 1000 > 1.3 * 4000  # the next draw would cross


def test_workload_removes_pods_when_the_pool_exceeds_the_target():
    nodes = make_nodes([8000], [8192], [1])
    pods = make_pods([100] * 10, [1] * 10, [1] * 10, [1000] * 10)
    order = packing_workload(pods, nodes, 2.0, np.random.default_rng(1))
    assert len(order) == 2 and len(set(order.tolist())) == 2


def test_cpu_cluster_measures_cpu():
    nodes = make_nodes([4000] * 2, [8192] * 2, [0, 0])
    pods = make_pods([1000, 500], [10, 10], [0, 0], [0, 0])
    order = packing_workload(pods, nodes, 1.0, np.random.default_rng(0))
    assert pods.cpu[order].sum() <= 8000 < pods.cpu[order].sum() + 1000


def test_binned_curve_is_the_mean_of_samples_rounding_to_the_bin():
    arrived = np.array([0.4, 0.6, 1.4, 1.6, 4.0])
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    got = binned_curve(arrived, values, np.array([0, 1, 2, 3]))
    # bin 0: {0.4}; bin 1: {0.6, 1.4}; bin 2: {1.6}; bin 3 empty -> x±1: {1.6 (2), 4.0 (4)}
    np.testing.assert_allclose(got, [1.0, 2.5, 4.0, 4.5])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), policy=st.sampled_from(sorted(BASELINES)))
def test_invariants_hold_for_every_policy(seed, policy):
    rng = np.random.default_rng(seed)
    n = 6
    nodes = make_nodes(rng.choice([4000, 16000], n), rng.choice([4096, 16384], n), rng.choice([0, 2, 4], n),
                       model=None)
    k = 30
    num = rng.choice([0, 1, 1, 2], k)
    milli = np.where(num == 0, 0, np.where(num == 1, rng.choice([250, 500, 1000], k), 1000))
    pods = make_pods(rng.choice([0, 500, 2000], k), rng.choice([0, 512, 2048], k), num, milli)
    sched = make_scheduler(policy, SchedulerContext(train_pods=pods, rng=np.random.default_rng(seed)))
    res = run_packing(nodes, pods, sched, target_load=1.2, seed=seed, typical=TypicalPods.from_pods(pods))
    assert set(res.metrics) == set(METRICS)
    # Replay the placements on a fresh state: nothing over-allocated, failures really fit nowhere.
    state = ClusterState(nodes)
    order = packing_workload(pods, nodes, 1.2, np.random.default_rng(seed))
    assert len(order) == len(res.placements)
    failed = order[res.placements < 0]
    assert res.metrics["failed_cpu_cores"] == pytest.approx(pods.cpu[failed].sum() / 1000)
    assert res.metrics["failed_gpus"] == pytest.approx((pods.num_gpu * pods.gpu_milli)[failed].sum() / 1000)
    for i, node, gpus in zip(order, res.placements, res.gpus, strict=True):
        pod = Pod.from_table(pods, int(i))
        if node < 0:
            assert not state.feasible(pod).any()
            continue
        assert state.feasible(pod)[node]
        assert len(gpus) == pod.num_gpu and len(set(gpus)) == len(gpus)
        state.allocate(int(node), pod, gpus)  # raises on over-allocation
    assert (state.cpu_req <= nodes.cpu).all() and (state.mem_req <= nodes.mem).all()
    assert (state.gpu_free >= 0).all()
    assert (np.diff(res.arrived_pct) >= 0).all()
    assert (res.alloc_pct <= res.arrived_pct + 1e-9).all()


def test_same_seed_same_run_other_seed_other_run(openb_gpu_nodes, openb_default_pods):
    pods = openb_default_pods.select(np.arange(2000))

    def run(seed):
        sched = make_scheduler("kube-default", SchedulerContext(rng=np.random.default_rng(seed)))
        return run_packing(openb_gpu_nodes, pods, sched, target_load=0.5, seed=seed)

    a, b, c = run(1), run(1), run(2)
    np.testing.assert_array_equal(a.placements, b.placements)
    assert a.metrics == b.metrics or all(
        (x != x and y != y) or x == y for x, y in zip(a.metrics.values(), b.metrics.values(), strict=True))
    assert not np.array_equal(a.placements, c.placements)


def test_place_returns_minus_one_when_nothing_fits():
    nodes = make_nodes([1000], [1024], [1])
    pod = Pod.from_table(make_pods([2000], [1], [0], [0]), 0)
    p = place(make_scheduler("best-fit"), ClusterState(nodes), pod, np.random.default_rng(0))
    assert p.node == -1


def _published_mean_130(policy: str) -> float:
    with PUBLISHED.open() as f:
        vals = [float(r["130"]) for r in csv.DictReader(f)
                if r["workload"] == "openb_pod_list_default" and r["sc_policy"] == policy]
    return float(np.mean(vals))


@pytest.mark.parametrize("ours,theirs", [("best-fit", "05-BestFit"), ("random", "01-Random"),
                                         ("fgd", "06-FGD")])
def test_openb_default_matches_published_within_one_point(openb_gpu_nodes, openb_default_pods, ours, theirs):
    """Fidelity regression: one seed of the published protocol lands near the published mean.

    The seed-to-seed spread is about 0.1-0.5 pp, so one seed within 1 pp of the 10-seed mean
    is a meaningful check; the full comparison is bench/fgd_reproduction.py.
    """
    pods = openb_default_pods
    ctx = SchedulerContext(train_pods=pods, rng=np.random.default_rng(7))
    res = run_packing(openb_gpu_nodes, pods, make_scheduler(ours, ctx), target_load=1.3, seed=42,
                      typical=TypicalPods.from_pods(pods))
    assert abs(res.metrics["gpu_alloc_at_target"] - _published_mean_130(theirs)) < 1.0


def test_the_idle_gpu_account_of_a_hand_built_end_state():
    """Where the idle GPU sits: a sliver next to an 810-milli pod, a GPU on a node left with too
    little CPU for any GPU pod of the pool, a whole idle GPU, and the failed pod's shape."""
    nodes = make_nodes([8000, 2000], [8192, 8192], [2, 1])  # 3 GPUs
    pods = make_pods([1000, 1500, 1000, 1000], [512] * 4, [1, 1, 0, 2], [810, 470, 0, 1000])
    sim = PackingSimulator(nodes, pods, target_load=1.0, seed=0).clone(future=np.array([0, 1, 3, 2]))
    for node, gpus in [(0, (0,)), (1, (0,)), (-1, ()), (0, ())]:
        sim.next_pod()
        sim.bind(Placement(node, gpus))
    got = sim.idle_gpu_account()
    pct = 100.0 / 3000
    assert got["idle"] == pytest.approx(pct * (190 + 1000 + 530))
    assert got["idle"] == pytest.approx(100.0 - sim.allocated_pct)
    assert got["whole_idle"] == pytest.approx(pct * 1000)
    assert got["shared_idle"] == pytest.approx(pct * (190 + 530))
    assert got["shared_idle_by_largest"] == pytest.approx({470: pct * 530, 810: pct * 190})
    assert list(got["shared_idle_by_largest"]) == [470, 810]  # largest part first
    # node 1 keeps 500 milli-CPU: below every GPU pod's 1,000 (the CPU-only pod's need not count)
    assert got["cpu_stranded"] == pytest.approx(pct * 530) and got["mem_stranded"] == 0.0
    assert got["failed_by_shape"] == {"2x1000": 1}


def test_the_idle_gpu_account_agrees_with_the_run_on_openb_like_pods():
    nodes = make_nodes([32000] * 6, [65536] * 6, [4, 4, 2, 2, 8, 1])
    rng = np.random.default_rng(3)
    n = 60
    sizes = rng.choice([0, 230, 470, 810, 1000], size=n)
    pods = make_pods(rng.integers(1, 12, n) * 1000, rng.integers(1, 16, n) * 1024,
                     np.where(sizes > 0, 1, 0), sizes)
    typical = TypicalPods.from_pods(pods)
    sim = PackingSimulator(nodes, pods, target_load=1.3, seed=5, typical=typical)
    sched = make_scheduler("fgd", SchedulerContext(train_pods=pods))
    while (item := sim.next_pod()) is not None:
        sim.bind(place(sched, item[1], item[0], sim.rng, node_rank=sim.node_rank))
    got = sim.idle_gpu_account(top=100)
    assert got["idle"] == pytest.approx(100.0 - sim.allocated_pct)
    assert got["whole_idle"] + got["shared_idle"] == pytest.approx(got["idle"])
    assert sum(got["shared_idle_by_largest"].values()) == pytest.approx(got["shared_idle"])
    assert 0.0 <= got["cpu_stranded"] + got["mem_stranded"] <= got["idle"] + 1e-9
    assert sum(got["failed_by_shape"].values()) == int((sim.result().placements < 0).sum())
    # run_packing (the evaluation harness's path) carries the same account, every part kept
    ran = run_packing(nodes, pods, make_scheduler("fgd", SchedulerContext(train_pods=pods)), target_load=1.3,
                      seed=5, typical=typical)
    assert ran.idle_gpu == got


def test_the_idle_gpu_account_is_empty_without_gpus():
    nodes = make_nodes([8000], [8192], [0])
    pods = make_pods([1000], [512], [0], [0])
    assert PackingSimulator(nodes, pods, target_load=1.0, seed=0).idle_gpu_account() == {}


@pytest.mark.parametrize("top", [0, -1])
def test_the_idle_gpu_account_refuses_a_top_below_one(top):
    nodes = make_nodes([8000], [8192], [1])
    pods = make_pods([1000], [512], [1], [500])
    with pytest.raises(ValueError, match="top must be at least 1"):
        PackingSimulator(nodes, pods, target_load=1.0, seed=0).idle_gpu_account(top=top)


@pytest.mark.parametrize("load", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_target_load_that_cannot_be_reached_is_refused(load) -> None:
    """A NaN target is never passed, so the workload's draw would never end; inf neither."""
    nodes = make_nodes([8000] * 2, [8192] * 2, [2, 2])
    with pytest.raises(ValueError, match="target load must be a positive finite number"):
        packing_workload(make_pods([1000], [1024], [1], [500]), nodes, load, np.random.default_rng(0))
