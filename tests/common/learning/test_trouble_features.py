"""Feature schema 2: what predicts trouble online, with hand-computed cases, and the same
quantities in packing, replay and serving."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsched.common.learning.features import (
    CONTEXT_FEATURES,
    HOT_THRESHOLD,
    NODE_FEATURES,
    POD_FEATURES,
    FeatureBuilder,
    Telemetry,
    cluster_use_ratios,
    expected_use_ratios,
)
from fedsched.common.model.cluster import USE_MEASURED, USE_REQUESTS, ClusterState, Pod
from fedsched.common.model.load_metrics import UsageWindow
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.sim.replay import ReplayConfig, ReplaySimulator
from tests.builders import make_nodes

N = NODE_FEATURES.index
P = POD_FEATURES.index
C = CONTEXT_FEATURES.index


def _state(source: str) -> ClusterState:
    nodes = make_nodes([10_000, 20_000], [10_240, 20_480], [0, 0])
    return ClusterState(nodes, use_source=source)


def test_requests_mode_features_are_the_requested_shares():
    """Nothing measures use (packing, serving without telemetry): windowed figures are the
    requested shares and every ratio is 1."""
    s = _state(USE_REQUESTS)
    s.allocate(0, Pod(0, 4000, 2048, 0, 0, 0, 1), ())
    pod = Pod(1, 2000, 1024, 0, 0, 0, 1, app=3)
    f = FeatureBuilder(None).build(s, pod, np.array([0, 1]))
    assert f.nodes[0, N("cpu_mean_w")] == pytest.approx(0.4)
    assert f.nodes[0, N("cpu_peak_w")] == pytest.approx(0.4)
    assert f.nodes[0, N("cpu_risk")] == pytest.approx(0.4)
    assert f.nodes[0, N("cpu_headroom_after")] == pytest.approx(HOT_THRESHOLD - (0.4 + 0.2))
    assert f.nodes[1, N("cpu_headroom_after")] == pytest.approx(HOT_THRESHOLD - 0.1)
    assert f.nodes[0, N("mem_headroom_after")] == pytest.approx(1.0 - (0.2 + 0.1))
    assert f.nodes[0, N("pods_on_node")] == pytest.approx(math.log1p(1) / 5)
    assert f.nodes[1, N("pods_on_node")] == 0.0
    assert f.pod[P("exp_cpu_ratio")] == 1.0 and f.pod[P("app_observed")] == 0.0
    assert f.context[C("use_ratio_cpu")] == 1.0


def test_measured_use_windowed_statistics_and_the_pods_expected_use():
    s = _state(USE_MEASURED)
    s.allocate(0, Pod(0, 4000, 2048, 0, 0, 0, 1), ())
    s.allocate(1, Pod(1, 4000, 2048, 0, 0, 0, 1), ())
    s.cpu_used[:] = [2000.0, 1000.0]  # cluster: 3000 used of 8000 requested -> 0.375
    s.mem_used[:] = [1024.0, 1024.0]  # 2048 of 4096 -> 0.5
    z = np.zeros(2)
    s.telemetry = Telemetry(z, z, z, z, z, cpu_mean=np.array([0.3, np.nan]), cpu_std=np.array([0.1, np.nan]),
                            cpu_peak=np.array([0.6, np.nan]),
                            app_usage=lambda app: (1.5, 0.25) if app == 7 else None)
    known = Pod(2, 2000, 1024, 0, 0, 0, 1, app=7)
    stranger = Pod(3, 2000, 1024, 0, 0, 0, 1, app=8)
    assert cluster_use_ratios(s) == pytest.approx((0.375, 0.5))
    assert expected_use_ratios(s, known)[:3] == pytest.approx((1.5, 0.25, True))
    assert expected_use_ratios(s, stranger)[:3] == pytest.approx((0.375, 0.5, False))
    f = FeatureBuilder(None).build(s, known, np.array([0, 1]))
    assert f.nodes[0, N("cpu_mean_w")] == pytest.approx(0.3)
    assert f.nodes[0, N("cpu_risk")] == pytest.approx(0.4)
    assert f.nodes[0, N("cpu_peak_w")] == pytest.approx(0.6)
    # node 1: NaN windowed values fall back to the current use (1000 / 20000)
    assert f.nodes[1, N("cpu_mean_w")] == pytest.approx(0.05)
    assert f.nodes[1, N("cpu_peak_w")] == pytest.approx(0.05)
    # the known application's pod is expected to use 1.5 x 2000 = 3000 milli
    assert f.nodes[0, N("cpu_headroom_after")] == pytest.approx(HOT_THRESHOLD - (0.3 + 0.3))
    assert f.nodes[0, N("cpu_peak_headroom_after")] == pytest.approx(HOT_THRESHOLD - (0.6 + 0.3))
    assert f.pod[P("exp_cpu_ratio")] == pytest.approx(1.5) and f.pod[P("app_observed")] == 1.0
    assert f.context[C("use_ratio_mem")] == pytest.approx(0.5)


def test_usage_window_peak_is_the_largest_sample_still_in_the_window():
    w = UsageWindow(2, window_s=30.0)
    assert w.peak().tolist() == [0.0, 0.0]
    for v in ([0.2, 0.9], [0.5, 0.1], [0.4, 0.1], [0.1, 0.1]):
        w.add(10.0, np.array(v))
    assert w.peak().tolist() == [0.5, 0.1]  # the first sample left the 30 s window


def test_cluster_state_counts_pods_per_node():
    s = _state(USE_REQUESTS)
    p = Pod(0, 100, 100, 0, 0, 0, 1)
    s.allocate(1, p, ())
    s.allocate(1, p, ())
    s.release(1, p, ())
    assert s.n_pods.tolist() == [0, 1]
    assert s.copy().n_pods.tolist() == [0, 1]


def test_replay_app_usage_is_the_running_siblings_use_per_request():
    nodes, pods = generate_cluster("web", 2, n_nodes=6, n_pods=300, trace_hours=6.0)
    sim = ReplaySimulator(nodes, pods, config=ReplayConfig(target_load=0.15), seed=1)
    seen = 0
    while (d := sim.next_pod()) is not None:
        pod, state = d
        got = state.telemetry.app_usage(pod.app)
        k = sim.usage._n_active
        rows = [j for j in range(k) if pods.app[sim.usage._s_pod[j]] == pod.app]
        if rows:
            use = sum(sim.usage._sf[8, j] for j in rows)  # _CUR row: current CPU use
            req = sum(Pod.from_table(pods, int(sim.usage._s_pod[j])).cpu_nonzero for j in rows)
            assert got is not None and got[0] == pytest.approx(use / req)
            seen += 1
        else:
            assert got is None
        mask = state.feasible(pod)
        from fedsched.common.schedulers import Placement

        sim.bind(Placement(int(np.flatnonzero(mask)[0]) if mask.any() else -1))
    assert seen > 50


def test_replay_app_usage_kept_across_starts_is_the_same_bits_as_counted_again():
    """The numpy form: a pod that starts is added to the kept per-application sums instead of
    counting every running pod again: the answer is the same bits as a count from scratch, pod
    after pod. (The compiled form keeps no sums: it sums one application's pods per question;
    ``tests/common/sim/test_replay_kernels.py`` checks it against this form.)"""
    nodes, pods = generate_cluster("web", 4, n_nodes=8, n_pods=400, trace_hours=6.0)
    sim = ReplaySimulator(nodes, pods, config=ReplayConfig(target_load=0.2), seed=2)
    sim.usage._kernels = None
    from fedsched.common.schedulers import Placement

    kept = 0
    while (d := sim.next_pod()) is not None:
        pod, state = d
        was_kept = sim.usage._app_sums is not None
        got = state.telemetry.app_usage(pod.app)
        sim.usage._app_sums = None  # count again from scratch
        assert got == state.telemetry.app_usage(pod.app)
        kept += was_kept
        mask = state.feasible(pod)
        sim.bind(Placement(int(np.flatnonzero(mask)[-1]) if mask.any() else -1))
    assert kept > 20  # sums kept across a start were checked


def test_replay_computes_the_windowed_peak_only_when_something_reads_it():
    """The baselines never read the peak, so replay with them does not pay for it; the features do."""
    nodes, pods = generate_cluster("web", 3, n_nodes=6, n_pods=200, trace_hours=6.0)
    sim = ReplaySimulator(nodes, pods, config=ReplayConfig(target_load=0.15), seed=1)
    calls = []
    original = sim._stats.peak
    sim._stats.peak = lambda: calls.append(1) or original()
    from fedsched.common.schedulers import Placement, SchedulerContext, make_scheduler

    kd = make_scheduler("load-variation-risk-balancing", SchedulerContext(rng=np.random.default_rng(0)))
    while (d := sim.next_pod()) is not None:
        pod, state = d
        mask = state.feasible(pod)
        cand = np.flatnonzero(mask)
        sim.bind(Placement(int(cand[np.argmax(kd.score(state, pod, cand))]) if len(cand) else -1))
    assert calls == []
    f = FeatureBuilder(None).build(sim.state, Pod(0, 100, 100, 0, 0, 0, 1), np.arange(len(nodes)))
    assert len(calls) == 1 and np.isfinite(f.nodes[:, N("cpu_peak_w")]).all()
