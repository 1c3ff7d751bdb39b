"""Online metrics: hand-computed cases, the window, and tick-length invariance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsched.common.model.cluster import ClusterState
from fedsched.common.model.load_metrics import (
    LoadMetrics,
    LoadMetricsConfig,
    UsageWindow,
    oom_and_pending,
)
from tests.builders import make_nodes


def _state(n: int = 2, cpu: int = 4000, mem: int = 8000) -> ClusterState:
    return ClusterState(make_nodes([cpu] * n, [mem] * n, [0] * n))


def _tick(m: LoadMetrics, s: ClusterState, dt: float, use: list[float],
          demand: list[float] | None = None, pods: list[int] | None = None,
          max_pod: list[float] | None = None, frag: float | None = None) -> None:
    cap = s.nodes.cpu.astype(float)
    s.cpu_used[:] = np.minimum(np.asarray(use) * cap, cap)
    n = len(use)
    m.tick(s, dt, np.asarray(demand if demand is not None else np.asarray(use) * cap, dtype=float),
           np.asarray(pods if pods is not None else [1] * n), np.asarray(max_pod or [0.0] * n), frag)


def test_window_mean_drops_the_oldest_samples() -> None:
    w = UsageWindow(1, 300.0)
    for v in (1.0, 1.0, 1.0):
        assert w.add(100.0, np.array([v]))[0] == pytest.approx(1.0)
    assert w.add(100.0, np.array([0.0]))[0] == pytest.approx(2 / 3)  # (1 + 1 + 0) / 3


def test_a_steadily_hot_node_counts_its_time_a_cool_one_none() -> None:
    s = _state()
    m = LoadMetrics(s)
    for _ in range(60):
        _tick(m, s, 10.0, [0.90, 0.50])
    r = m.result()
    assert r["hot_cpu_node_s"] == pytest.approx(600.0)
    assert r["single_pod_hot_node_s"] == 0.0 and r["throttled_cpu_core_s"] == 0.0


def test_hot_memory_time_is_counted_per_node_and_a_dead_node_counts_none() -> None:
    s = _state(3)
    m = LoadMetrics(s)
    s.alive[2] = False
    for _ in range(60):
        s.mem_used[:] = np.array([0.90, 0.50, 0.95]) * s.nodes.mem
        _tick(m, s, 10.0, [0.50, 0.50, 0.50])
    assert m.node_hot_mem_s.tolist() == pytest.approx([600.0, 0.0, 0.0])
    assert m.result()["hot_mem_node_s"] == pytest.approx(600.0)
    assert m.node_hot_s.tolist() == [0.0, 0.0, 0.0]


def test_flicker_across_the_threshold_is_not_hot() -> None:
    # 0.70 / 0.95 alternating: crosses 85% every other tick, yet its 5-minute mean is 82.5%.
    s = _state(1)
    m = LoadMetrics(s)
    for k in range(120):
        _tick(m, s, 10.0, [0.95 if k % 2 else 0.70])
    assert m.result()["hot_cpu_node_s"] == 0.0


def test_a_node_hot_from_one_pod_alone_is_reported_apart() -> None:
    s = _state()
    m = LoadMetrics(s)
    _tick(m, s, 30.0, [0.90, 0.90], max_pod=[0.88 * 4000, 0.20 * 4000])
    r = m.result()
    assert r["single_pod_hot_node_s"] == 30.0 and r["hot_cpu_node_s"] == 30.0  # node 1 only


def test_throttling_and_contended_pod_time() -> None:
    s = _state()
    m = LoadMetrics(s)
    # node 0: demand 1.2 x 4000 m for 100 s -> 800 m x 100 s = 80 core-seconds; 3 pods on it.
    _tick(m, s, 100.0, [1.0, 0.2], demand=[4800.0, 800.0], pods=[3, 1])
    r = m.result()
    assert r["throttled_cpu_core_s"] == pytest.approx(80.0)
    assert r["contended_pod_share"] == pytest.approx(75.0)


def test_stranded_resources_depend_on_placement() -> None:
    s = _state(2)
    # node 0: CPU 75% requested, memory 25%: 50% of its memory is stranded; node 1 empty.
    s.cpu_req[0], s.mem_req[0] = 3000, 2000
    m = LoadMetrics(s)
    _tick(m, s, 10.0, [0.5, 0.0])
    r = m.result()
    assert r["stranded_mem_avg"] == pytest.approx(100.0 * 4000 / 16000)
    assert r["stranded_cpu_avg"] == 0.0
    # The same requests spread as half on each node strand nothing.
    s2 = _state(2)
    s2.cpu_req[:], s2.mem_req[:] = 1500, 1000
    m2 = LoadMetrics(s2)
    _tick(m2, s2, 10.0, [0.5, 0.5])
    assert m2.result()["stranded_mem_avg"] == pytest.approx(100.0 * 2 * (0.875 - 0.625) * 8000 / 16000)


def test_gpu_fragmentation_is_time_averaged() -> None:
    s = ClusterState(make_nodes([4000], [8000], [8]))
    s.gpu_free[0, 2:] = 0  # 6 of 8 GPUs taken: 2000 milli idle of 8000
    m = LoadMetrics(s)
    _tick(m, s, 10.0, [0.1], frag=500.0)
    _tick(m, s, 30.0, [0.1], frag=0.0)
    r = m.result()
    assert r["gpu_frag_amount_avg"] == pytest.approx((10 * 100 * 500 / 8000) / 40)
    assert r["gpu_frag_rate_avg"] == pytest.approx((10 * 100 * 500 / 2000) / 40)


def test_oom_and_pending_counts() -> None:
    r = oom_and_pending(starts=2000, oom_kills=7, pods_killed=3, latencies=np.array([1.0, 70.0, 61.0]),
                        waiting_s=np.array([59.0, 120.0]), sla_s=60.0)
    assert r == {"oom_kills_per_1k_starts": 3.5, "oom_pods_killed": 3.0, "pending_sla_misses": 3.0}


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        LoadMetricsConfig(window_s=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hot_time_barely_moves_between_5s_and_30s_ticks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, horizon = 50, 6 * 3600.0
    level = rng.uniform(0.55, 0.95, n)
    phase = rng.uniform(0, 2 * math.pi, n)
    knots = rng.normal(0, 0.04, (n, int(horizon // 60) + 2))  # minute-scale noise, piecewise linear

    def use(t: float) -> np.ndarray:
        k, frac = int(t // 60), (t % 60) / 60
        noise = knots[:, k] * (1 - frac) + knots[:, k + 1] * frac
        return np.clip(level + 0.08 * np.sin(2 * math.pi * t / 3600 + phase) + noise, 0, 1.2)

    results = []
    for dt in (5.0, 30.0):
        s = _state(n)
        m = LoadMetrics(s)
        for t in np.arange(0, horizon, dt):
            _tick(m, s, dt, list(use(float(t))))
        results.append(m.result()["hot_cpu_node_s"])
    assert results[0] > 0
    assert abs(results[1] - results[0]) / results[0] < 0.03


def test_window_std_is_the_time_weighted_spread() -> None:
    w = UsageWindow(1, 400.0)
    for v, dt in ((0.2, 100.0), (0.6, 300.0)):
        w.add(dt, np.array([v]))
    mean = (0.2 * 100 + 0.6 * 300) / 400
    assert w.mean()[0] == pytest.approx(mean)
    assert w.std()[0] == pytest.approx(math.sqrt((0.04 * 100 + 0.36 * 300) / 400 - mean**2))
