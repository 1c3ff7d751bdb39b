"""kube-scheduler v1.37.2's default profile reduced to resources: LeastAllocated + BalancedAllocation.

``fedsched.common.schedulers.kube_default`` (its docstring names the upstream files). Each case
below is hand-computed from the v1.37.2 formulas; the per-plugin vectors that also appear in
upstream's ``least_allocated_test.go`` / ``balanced_allocation_test.go`` (v1.37.2) say so.

    fit      = (s_cpu + s_mem) // 2,  s_r = (cap - nonzero_req - pod_nonzero) * 100 // cap
    balance  = int((1 - |f_cpu - f_mem| / 2) * 100),  f_r = min(req / cap, 1)  (actual requests)
    balanced = 50 + (50 + balance(with pod) - balance(without pod)) // 2  (0: best-effort pod)
    score    = fit + balanced

Memory is MiB here and bytes upstream; the formulas only use ratios.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsched.common.schedulers import BalancedAllocation, KubeDefault, LeastAllocated, place
from fedsched.common.schedulers.kube_default import (
    balanced_allocation_v137,
    balanced_resource_score,
    fit_least_allocated,
)
from tests.common.schedulers.sched_testkit import all_nodes, pod, set_node_info, state


def _state(cpu, mem, requested=(), allocated=()):
    """Nodes ``cpu`` / ``mem``; ``requested``: (node, (cpu, mem)) NodeInfo totals set directly
    (Requested = NonZeroRequested, as upstream's pods with explicit requests);
    ``allocated``: (node, pod) bound the simulator's way (non-zero defaults for missing ones)."""
    st = state(cpu=cpu, mem=mem)
    for j, req in requested:
        set_node_info(st, j, req)
    for j, p in allocated:
        st.allocate(j, p, ())
    return st


# (id, state, pod, fit, balanced) -- KubeDefault = fit + balanced.
CASES = [
    # upstream "nothing scheduled, resources requested, differently sized nodes" (both files):
    # fit  node1 cpu (4000-3000)*100//4000 = 25, mem 50 -> 37; node2 50, 50 -> 50
    # bal  node1 with (.75, .5) std .125 -> 87, without 100 -> 50 + (50+87-100)//2 = 68
    #      node2 with (.5, .5) -> 100, without 100 -> 75
    pytest.param(lambda: _state([4000, 6000], [10000, 10000]), pod(cpu=3000, mem=5000),
                 [37, 50], [68, 75], id="nothing scheduled, differently sized nodes"),
    # upstream "resources requested, pods scheduled with resources" (both files):
    # fit  node1 cpu (10000-6000)*100//10000 = 40, mem (20000-5000)*100//20000 = 75 -> 57
    #      node2 cpu 40, mem (20000-10000)*100//20000 = 50 -> 45
    # bal  node1 with (.6, .25) std .175 -> 82, without (.3, 0) std .15 -> 85: 50 + 47//2 = 73
    #      node2 with (.6, .5) -> 95, without (.3, .25) std .025 -> 97: 50 + 48//2 = 74
    pytest.param(lambda: _state([10000, 10000], [20000, 20000], [(0, (3000, 0)), (1, (3000, 5000))]),
                 pod(cpu=3000, mem=5000), [57, 45], [73, 74], id="pods scheduled with resources"),
    # upstream "... differently sized nodes": node2 mem 50000
    # fit  node2 cpu 40, mem (50000-10000)*100//50000 = 80 -> 60
    # bal  node2 with (.6, .2) std .2 -> 80, without (.3, .1) std .1 -> 90: 50 + 40//2 = 70
    pytest.param(lambda: _state([10000, 10000], [20000, 50000], [(0, (3000, 0)), (1, (3000, 5000))]),
                 pod(cpu=3000, mem=5000), [57, 60], [73, 70], id="pods scheduled, differently sized"),
    # upstream balanced "nodes to reach min/max score" (pod: memory only, cpu missing):
    # bal  node1 with (1, 1) -> 100, without (1, 0) -> 50: 50 + 100//2 = 100
    #      node2 with (0, 1) -> 50, without (0, 0) -> 100: 50 + 0//2 = 50
    # fit  (pod cpu non-zero 100m) node1 cpu 3100 > 3000 -> 0, mem 0 -> 0
    #      node2 cpu (3000-100)*100//3000 = 96, mem 0 -> 48
    pytest.param(lambda: _state([3000, 3000], [5000, 5000], [(0, (3000, 0))]), pod(mem=5000),
                 [0, 48], [100, 50], id="balanced min and max"),
    # upstream balanced "requested resources at node capacity" (pod cpu only, memory missing):
    # bal  node1 with (1, 0) -> 50, without (.5, 0) -> 75: 50 + 25//2 = 62
    #      node2 with (1, .5) -> 75, without (.5, .5) -> 100: 50 + 25//2 = 62
    # fit  (pod memory non-zero 200) node1 cpu 0, mem (10000-200)*100//10000 = 98 -> 49
    #      node2 cpu 0, mem (10000-5200)*100//10000 = 48 -> 24
    pytest.param(lambda: _state([6000, 6000], [10000, 10000], [(0, (3000, 0)), (1, (3000, 5000))]),
                 pod(cpu=3000), [49, 24], [62, 62], id="at node capacity"),
    # The fraction is clamped at 1 before the deviation; the pod over capacity scores fit 0.
    # bal  with (min(7500/6000, 1) = 1, .5001) std .24995 -> int(75.005) = 75,
    #      without (.5, .5) -> 100: 50 + 25//2 = 62
    # fit  cpu 7500 > 6000 -> 0, mem (10000-5001)*100//10000 = 49 -> 24
    pytest.param(lambda: _state([6000], [10000], [(0, (3000, 5000))]), pod(cpu=4500, mem=1),
                 [24], [62], id="fraction clamped at one"),
    # Best-effort pod: BalancedAllocation skips itself in PreScore (0 everywhere); fit uses the
    # non-zero defaults for the pod and for node1's pod (bound the simulator's way).
    # fit  node1 cpu (4000-1100)*100//4000 = 72, mem (10000-2200)*100//10000 = 78 -> 75
    #      node2 cpu (4000-100)*100//4000 = 97, mem (10000-200)*100//10000 = 98 -> 97
    pytest.param(lambda: _state([4000, 4000], [10000, 10000], allocated=[(0, pod(cpu=1000, mem=2000))]),
                 pod(), [75, 97], [0, 0], id="best-effort pod"),
    # Allocatable 0 leaves the resource out: node1 has no memory (fit = the cpu score alone, one
    # fraction -> std 0), node2 has nothing (fit 0: no resource left; balance 100 -> 100).
    # fit  node1 (4000-1000)*100//4000 = 75; node2 0.  bal 50 + (50+100-100)//2 = 75 on both.
    pytest.param(lambda: _state([4000, 0], [0, 0]), pod(cpu=1000, mem=100), [75, 0], [75, 75],
                 id="zero allocatable"),
    # The 1.37 formula against the classic one: node1 is unbalanced (cpu 60%, memory ~0%), node2
    # balanced (30% / 30%); the pod asks memory only. Classic balance(with pod): node1 (.6, .2)
    # -> 80, node2 (.3, .5) -> 90, so classic prefers node2 (see the test below); 1.37 scores the
    # change: node1 without (.6, 0) -> 70, 50 + (50+80-70)//2 = 80; node2 without (.3, .3) -> 100,
    # 50 + (50+90-100)//2 = 70.
    # fit  node1 cpu (10000-6100)*100//10000 = 39, mem (10000-200-2000)*100//10000 = 78 -> 58
    #      node2 cpu (10000-3100)*100//10000 = 69, mem (10000-5000)*100//10000 = 50 -> 59
    pytest.param(lambda: _state([10000, 10000], [10000, 10000],
                                allocated=[(0, pod(cpu=6000)), (1, pod(cpu=3000, mem=3000))]),
                 pod(mem=2000), [58, 59], [80, 70], id="change in balance"),
]


@pytest.mark.parametrize(("make", "p", "fit", "balanced"), CASES)
def test_hand_computed(make, p, fit, balanced):
    st = make()
    idx = all_nodes(st)
    np.testing.assert_array_equal(fit_least_allocated(st, p, idx), fit)
    np.testing.assert_array_equal(balanced_allocation_v137(st, p, idx), balanced)
    np.testing.assert_array_equal(KubeDefault().score(st, p, idx), np.add(fit, balanced))


def test_the_137_formula_and_the_classic_one_pick_different_nodes():
    """The "change in balance" case: 1.37 totals [138, 129] pick node1, the classic form of
    1.23-1.35 (LeastAllocated + the ``balanced-allocation`` baseline) totals
    [58 + 80, 59 + 90] = [138, 149] and picks node2."""
    st = _state([10000, 10000], [10000, 10000],
                allocated=[(0, pod(cpu=6000)), (1, pod(cpu=3000, mem=3000))])
    p, idx = pod(mem=2000), all_nodes(st)
    np.testing.assert_array_equal(KubeDefault().score(st, p, idx), [138, 129])
    classic = LeastAllocated().score(st, p, idx) + BalancedAllocation().score(st, p, idx)
    np.testing.assert_array_equal(classic, [138, 149])
    assert place(KubeDefault(), st, p, np.random.default_rng(0)).node == 0


def test_fit_part_is_least_allocated_with_the_default_weights():
    st = _state([4000, 8000, 16000], [8192, 32768, 16384],
                allocated=[(0, pod(cpu=1000, mem=4096)), (2, pod(cpu=12000))])
    p, idx = pod(cpu=500, mem=1024), np.array([2, 0, 1])
    np.testing.assert_array_equal(fit_least_allocated(st, p, idx), LeastAllocated().score(st, p, idx))


def _go_balanced_resource_score(requested: list[int], allocatable: list[int]) -> int:
    """balancedResourceScore of balanced_allocation.go v1.37.2, line by line."""
    fractions = []
    for req, alloc in zip(requested, allocatable, strict=True):
        if alloc == 0:
            continue
        fractions.append(min(float(req) / float(alloc), 1.0))
    std = 0.0
    if len(fractions) == 2:
        std = math.fabs((fractions[0] - fractions[1]) / 2)
    return int((1 - std) * float(100))


def test_vectorised_balance_matches_the_go_function_on_random_nodes():
    rng = np.random.default_rng(0)
    cap_cpu = rng.integers(0, 64000, 500)
    cap_mem = rng.integers(0, 262144, 500)
    cap_cpu[:10] = 0
    cap_mem[5:15] = 0
    req_cpu = rng.integers(0, 70000, 500)
    req_mem = rng.integers(0, 300000, 500)
    got = balanced_resource_score(req_cpu, req_mem, cap_cpu, cap_mem)
    want = [_go_balanced_resource_score([int(a), int(b)], [int(c), int(d)])
            for a, b, c, d in zip(req_cpu, req_mem, cap_cpu, cap_mem, strict=True)]
    np.testing.assert_array_equal(got, want)


def test_scores_cover_50_to_200_and_keep_the_candidate_order():
    rng = np.random.default_rng(1)
    st = state(cpu=rng.integers(2000, 64000, 40).tolist(), mem=rng.integers(2048, 262144, 40).tolist())
    for j in range(40):
        c, m = int(st.nodes.cpu[j]), int(st.nodes.mem[j])
        st.allocate(j, pod(cpu=int(rng.integers(0, c)), mem=int(rng.integers(0, m))), ())
    p = pod(cpu=700, mem=900)
    idx = rng.permutation(40)
    s = KubeDefault().score(st, p, idx)
    assert s.dtype == np.float64 and (s >= 50).all() and (s <= 200).all()
    np.testing.assert_array_equal(s[np.argsort(idx)], KubeDefault().score(st, p, all_nodes(st)))


def test_place_spreads_to_the_emptier_balanced_node():
    st = state(cpu=[4000, 6000], mem=[10000, 10000])
    assert place(KubeDefault(), st, pod(cpu=3000, mem=5000), np.random.default_rng(0)).node == 1


def test_sharing_pod_gets_the_best_fitting_gpu():
    # kube-default does not score GPUs; the GPU on the node is the tightest fit (base.py).
    st = state(cpu=[8000], mem=[8192], gpu=[4])
    st.allocate(0, pod(num_gpu=1, gpu_milli=300), (1,))  # GPU1 700 free
    st.allocate(0, pod(num_gpu=1, gpu_milli=500), (3,))  # GPU3 500 free
    p = place(KubeDefault(), st, pod(num_gpu=1, gpu_milli=400), np.random.default_rng(0))
    assert (p.node, p.gpus) == (0, (3,))


# ---- the cached and scalar forms (issue 22: a faster engine, the same scores) -------------------


def _random_state(rng: np.random.Generator, n: int):
    cpu = rng.choice([0, 1000, 4000, 32000, 96000], n).tolist()
    mem = rng.choice([0, 1024, 8192, 262144], n).tolist()
    st = state(cpu=cpu, mem=mem)
    for j in range(n):
        req = (int(rng.integers(0, 2 * cpu[j] + 2)), int(rng.integers(0, 2 * mem[j] + 2)))
        set_node_info(st, j, req, (req[0] + int(rng.integers(0, 300)), req[1] + int(rng.integers(0, 300))))
    return st


def test_scalar_score_is_the_vector_score_bit_for_bit() -> None:
    """kube_default_score_one (the cache's few-node path) against kube_default_scores: equal
    floats over random totals, zero capacities, over-commitment and best-effort pods."""
    from fedsched.common.schedulers.kube_default import kube_default_score_one, kube_default_scores

    rng = np.random.default_rng(0)
    for _ in range(30):
        st = _random_state(rng, 40)
        for p in (pod(cpu=int(rng.integers(0, 5000)), mem=int(rng.integers(0, 9000))), pod(), pod(cpu=7),
                  pod(mem=300)):
            vec = kube_default_scores(st, p, all_nodes(st)).astype(np.float64)
            one = [kube_default_score_one(int(st.nodes.cpu[j]), int(st.nodes.mem[j]), int(st.cpu_req[j]),
                                          int(st.mem_req[j]), int(st.cpu_req_nz[j]), int(st.mem_req_nz[j]), p)
                   for j in range(len(st.nodes))]
            assert vec.tobytes() == np.array(one, dtype=np.float64).tobytes()


def test_cached_scores_follow_every_change() -> None:
    """KubeDefault keeps scores per (state, pod shape) and re-scores the nodes whose version
    moved: after binds and releases of few or many nodes its answer is a fresh computation's."""
    from fedsched.common.schedulers.kube_default import SCALAR_MAX, kube_default_scores

    rng = np.random.default_rng(1)
    st = state(cpu=[4000 + 1000 * (j % 5) for j in range(50)], mem=[8192 + 512 * (j % 7) for j in range(50)])
    sched = KubeDefault()
    shapes = [pod(cpu=500, mem=1024), pod(cpu=1500, mem=256), pod(), pod(cpu=100)]
    bound: list[tuple[int, object]] = []
    for step in range(200):
        p = shapes[step % len(shapes)]
        nodes = np.flatnonzero(st.feasible(p))
        assert np.array_equal(nodes, np.flatnonzero(st._fits(p, None) & st.alive))
        got = sched.score(st, p, nodes)
        assert got.tobytes() == kube_default_scores(st, p, nodes).astype(np.float64).tobytes()
        k = 1 if step % 10 else SCALAR_MAX + 5  # sometimes more nodes change than the scalar path takes
        for _ in range(k):
            if bound and rng.random() < 0.4:
                j, q = bound.pop(int(rng.integers(len(bound))))
                st.release(j, q, ())
            else:
                q = shapes[int(rng.integers(len(shapes)))]
                ok = np.flatnonzero(st.feasible(q))
                if len(ok):
                    j = int(rng.choice(ok))
                    st.allocate(j, q, ())
                    bound.append((j, q))
        st.alive[int(rng.integers(50))] = bool(rng.random() < 0.9)


def test_a_pickled_or_copied_kube_default_starts_with_an_empty_cache() -> None:
    """State serials are per process: the score cache never travels with the scheduler."""
    import copy
    import pickle

    st = state(cpu=[4000, 8000], mem=[8192, 8192])
    sched = KubeDefault()
    sched.score(st, pod(cpu=100, mem=100), all_nodes(st))
    assert sched._cache
    for other in (pickle.loads(pickle.dumps(sched)), copy.deepcopy(sched), copy.copy(sched)):
        assert other._cache == {} and sched._cache


def test_a_deep_copied_or_unpickled_state_gets_its_own_serial_and_fresh_scores() -> None:
    """The score cache keys on the state's serial: a deep copy (or a state from another process)
    that then diverges from the original must never be answered from the original's entries."""
    import copy
    import pickle

    from fedsched.common.model.cluster import Pod
    from fedsched.common.schedulers.kube_default import KubeDefault, kube_default_scores
    from tests.common.schedulers.sched_testkit import pod, state

    st = state(cpu=[8000, 8000, 16000], mem=[16384, 32768, 16384], gpu=[0, 0, 0])
    sched = KubeDefault()
    p: Pod = pod(cpu=1000, mem=2048)
    every = np.arange(3)
    sched.score(st, p, every)  # cache the original's scores
    for other in (copy.deepcopy(st), pickle.loads(pickle.dumps(st))):
        assert other.serial != st.serial and other._fit_cache == {}
        st.allocate(0, pod(cpu=4000, mem=1024), ())  # the two states diverge at equal versions
        other.allocate(0, pod(cpu=500, mem=8192), ())
        for s_ in (st, other):
            fresh = kube_default_scores(s_, p, every).astype(np.float64)
            assert np.array_equal(sched.score(s_, p, every), fresh)
            assert np.array_equal(s_.feasible(p), s_.alive & s_._fits(p, every))
