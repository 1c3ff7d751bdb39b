"""The FGD fragmentation model against a direct transcription of its definition."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.model.fragmentation import FragmentationModel, TypicalPods, fragmentation_ratio
from tests.builders import make_pods


def naive_frag(typ: TypicalPods, cpu_left: int, left: np.ndarray, model: int) -> float:
    """F_n(M) = sum_m p_m F_n(m), written out case by case as the FGD paper defines it."""
    idle = float(left.sum())
    total = 0.0
    for c in range(len(typ)):
        q = typ.gpu_milli[c]
        if q == 0:  # a CPU-only task cannot use any GPU
            total += typ.freq[c] * idle
            continue
        spec = typ.spec_mask[c]
        model_ok = spec == 0 or (model >= 0 and (spec >> model) & 1)
        fits = model_ok and (left >= q).sum() >= typ.num_gpu[c] and cpu_left >= typ.cpu[c]
        total += typ.freq[c] * (float(left[left < q].sum()) if fits else idle)
    return total


def test_typical_pods_cover_95_percent_including_the_crossing_class():
    # 50 x A, 30 x B, 15 x C, 5 x D: A+B = 80% < 95%, +C = 95% reaches it -> D excluded.
    cpu = [1000] * 50 + [2000] * 30 + [3000] * 15 + [4000] * 5
    pods = make_pods(cpu, [1] * 100, [1] * 100, [500] * 100)
    typ = TypicalPods.from_pods(pods)
    assert list(typ.cpu) == [1000, 2000, 3000]
    np.testing.assert_allclose(typ.freq, [50 / 95, 30 / 95, 15 / 95])
    # One short of 95%: C crosses the threshold and is still included, D is not.
    pods2 = make_pods([*cpu[:-1], 1000], [1] * 100, [1] * 100, [500] * 100)
    assert len(TypicalPods.from_pods(pods2)) == 3


def test_zero_cpu_counts_as_100m_in_typical_pods():
    typ = TypicalPods.from_pods(make_pods([0, 0], [1, 1], [0, 0], [0, 0]))
    assert list(typ.cpu) == [100]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_vectorised_fragmentation_equals_definition(seed):
    rng = np.random.default_rng(seed)
    n = 40
    cpu = rng.choice([0, 1000, 4000, 8000], n)
    milli = np.where(cpu % 8000 == 0, rng.choice([0, 300, 500, 1000], n), rng.choice([200, 1000], n))
    num = np.where(milli == 0, 0, np.where(milli == 1000, rng.choice([1, 2, 4], n), 1))
    milli = np.where(num == 0, 0, milli)
    spec = rng.choice([0, 1, 2, 3], n)
    typ = TypicalPods.from_pods(make_pods(cpu, [1] * n, num, milli, spec_mask=spec))
    fm = FragmentationModel(typ, n_models=2)
    k = 25
    left = rng.choice([0, 100, 250, 500, 700, 1000], size=(k, 8))
    left[:, rng.integers(1, 9):] = 0
    cpu_left = rng.integers(0, 20000, k)
    model = rng.integers(-1, 2, k)
    got = fm.node_frag(cpu_left, left, model)
    want = [naive_frag(typ, int(cpu_left[i]), left[i], int(model[i])) for i in range(k)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_fragmentation_ratio_formula():
    cap = np.array([100.0, 100.0])
    # CPU 50% available, memory 25% available -> 1 - 0.25 / 0.5 = 0.5
    assert fragmentation_ratio(np.array([50.0, 50.0]), cap, np.array([25.0, 25.0]), cap) == 0.5
    assert fragmentation_ratio(np.array([10.0, 10.0]), cap, np.array([10.0, 10.0]), cap) == 0.0
    assert fragmentation_ratio(np.zeros(2), cap, np.zeros(2), cap) == 0.0


def test_cached_node_parts_match_a_fresh_computation_and_keep_no_change_exact(openb_gpu_nodes,
                                                                             openb_default_pods):
    from fedsched.common.model.cluster import ClusterState, Pod
    from fedsched.common.model.fragmentation import NodeFragCache, placement_deltas
    from fedsched.common.schedulers import KubeDefault, place

    nodes, pods = openb_gpu_nodes, openb_default_pods
    fm = FragmentationModel(TypicalPods.from_pods(pods), len(nodes.models))
    cache = NodeFragCache(fm)
    state = ClusterState(nodes)
    rng = np.random.default_rng(0)
    for i in range(1500):
        pod = Pod.from_table(pods, i)
        p = place(KubeDefault(), state, pod, rng)
        if p.node >= 0:
            state.allocate(p.node, pod, p.gpus)
        if i % 300 == 0:  # batches of different sizes: the whole cluster, then a few nodes
            for sub in (np.arange(len(nodes)), np.arange(0, len(nodes), 97)):
                idle, cnt, tot, f = cache.get(state, sub)
                fresh = fm.gpu_parts(state.gpu_free[sub])
                np.testing.assert_array_equal(idle, fresh[0])
                np.testing.assert_array_equal(cnt, fresh[1])
                np.testing.assert_array_equal(tot, fresh[2])
                np.testing.assert_allclose(f, fm.node_frag(state.cpu_free[sub], state.gpu_free[sub],
                                                           nodes.model[sub]), atol=1e-9)
    # A CPU-only pod small enough to change no class's fit changes F by exactly 0.
    tiny = Pod(index=0, cpu=1, mem=1, num_gpu=0, gpu_milli=0, spec_mask=0, qos=1)
    sub = np.flatnonzero(state.cpu_free > 40_000)[:50]
    _, _, delta, _ = placement_deltas(fm, state.cpu_free[sub], state.gpu_free[sub], nodes.model[sub],
                                      tiny.cpu_nonzero, 0, 0, parts=cache.get(state, sub))
    assert (delta == 0).all()


def test_a_node_table_without_gpus_keeps_every_nodes_fragmentation_at_zero_without_updating():
    """FragTracker skips its updates where no node has a GPU: after binds, releases and nodes
    going down its per-node values and total are what the model computes from scratch (all
    0.0), with typical pods that ask for GPUs as well as without."""
    from fedsched.common.model.cluster import ClusterState, Pod
    from fedsched.common.model.metrics import FragTracker
    from tests.builders import make_nodes

    nodes = make_nodes([4000, 8000, 16000], [8192, 16384, 32768], [0, 0, 0])
    pods = make_pods([500, 1000, 2000, 1000], [512, 1024, 2048, 1024], [0, 0, 1, 1], [0, 0, 1000, 500])
    for typical in (TypicalPods.from_pods(pods), TypicalPods.from_pods(pods.select(np.array([0, 1])))):
        state = ClusterState(nodes)
        tracker = FragTracker(state, typical)
        rng = np.random.default_rng(1)
        placed = []
        for step in range(60):
            n = int(rng.integers(3))
            if placed and rng.random() < 0.4:
                node, pod = placed.pop(int(rng.integers(len(placed))))
                state.release(node, pod, ())
            else:
                pod = Pod(-1, int(rng.choice([500, 1000])), 1024, 0, 0, 0, 1)
                state.allocate(n, pod, ())
                placed.append((n, pod))
            if step == 30:
                state.alive[1] = False
            tracker.update_nodes(np.array([n, 1]))
            tracker.update(n)
        fresh = tracker.model.node_frag(state.cpu_free, state.gpu_free, state.nodes.model) * state.alive
        assert tracker.per_node.tobytes() == fresh.tobytes() and tracker.total == float(fresh.sum()) == 0.0
