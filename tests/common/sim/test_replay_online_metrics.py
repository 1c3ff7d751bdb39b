"""Replay's online metrics on a loaded CPU cluster: they cannot be won by piling pods onto hot
nodes, they barely move with the tick length, and an unreachable load fails loudly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsched.common.model.load_metrics import LOAD_METRICS
from fedsched.common.model.metrics import METRICS
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import make_scheduler
from fedsched.common.schedulers.base import place
from fedsched.common.sim.replay import ReplayConfig, ReplaySimulator, run_replay

HEADLINE = ("hot_cpu_node_s", "throttled_cpu_core_s", "contended_pod_share", "oom_kills_per_1k_starts")


@pytest.fixture(scope="module")
def web():
    # a 20-node web cluster with 4,000 pods: 60% requested load is reachable
    return generate_cluster("web", seed=3, n_nodes=20, n_pods=4000)


# A hot usage scenario: the calibrated default (median use 0.31 of the request) leaves a
# 60%-requested web cluster at ~33% real CPU, where no node gets hot whatever the placement;
# a median of 0.5 of the request (both resources) makes the placement matter.
HOT = dict(usage_cpu_median=(0.5,) * 4, usage_mem_median=(0.5,) * 4)


def _run(web, name: str, seed: int = 1, **cfg) -> dict[str, float]:
    nodes, pods = web
    return run_replay(nodes, pods, make_scheduler(name),
                      config=ReplayConfig(target_load=0.6, **{**HOT, **cfg}), seed=seed).metrics


def test_every_result_carries_the_online_metrics_and_the_offered_load(web) -> None:
    m = _run(web, "kube-default")
    assert set(LOAD_METRICS) | {"offered_load_pct"} <= set(m) and set(m) == set(METRICS)
    assert m["offered_load_pct"] == pytest.approx(60.0, rel=1e-3)
    assert all(math.isfinite(m[k]) for k in LOAD_METRICS if not k.startswith("gpu_frag"))


def test_preferring_hot_nodes_loses_on_every_headline_metric(web) -> None:
    kube, hot = _run(web, "kube-default"), _run(web, "prefer-hot")
    for k in HEADLINE:
        assert hot[k] > kube[k] * 1.5 + 1e-9, (k, hot[k], kube[k])
    # (Under the uncalibrated usage model the legacy crossing counter called prefer-hot the
    # better scheduler, 0.42-0.50x kube-default's count; with a shared application level and
    # class-wide daily cycles it no longer does, so that comparison is not asserted.)


def test_metrics_barely_move_between_5s_and_30s_ticks(web) -> None:
    fine, coarse = _run(web, "kube-default", usage_tick_s=5.0), _run(web, "kube-default", usage_tick_s=30.0)
    for k in ("hot_cpu_node_s", "contended_pod_share", "throttled_cpu_core_s"):
        assert abs(coarse[k] - fine[k]) <= 0.05 * fine[k], (k, fine[k], coarse[k])
    assert fine["overload_events"] > 2 * coarse["overload_events"]  # what the old counter did


def test_an_unreachable_target_load_is_an_error_unless_allowed() -> None:
    nodes, pods = generate_cluster("web", seed=3)
    sched = make_scheduler("kube-default")
    with pytest.raises(ValueError, match=r"target_load 0.6 cannot be reached: .* 0\.1\d+ of capacity"):
        run_replay(nodes, pods, sched, config=ReplayConfig(target_load=0.6), seed=1)
    m = run_replay(nodes, pods, sched, config=ReplayConfig(target_load=0.6, allow_unreachable_load=True),
                   seed=1).metrics
    assert 5.0 < m["offered_load_pct"] < 30.0


def test_windowed_telemetry_follows_the_real_use(web) -> None:
    nodes, pods = web
    sim = ReplaySimulator(nodes, pods, config=ReplayConfig(target_load=0.6, stats_window_s=600.0), seed=1)
    sched = make_scheduler("kube-default")
    for _ in range(1500):
        d = sim.next_pod()
        if d is None:
            break
        pod, state = d
        sim.bind(place(sched, state, pod, sim.rng))
    tel = sim.state.telemetry
    assert tel.cpu_mean is not None and tel.cpu_std is not None and tel.metrics_age_s is not None
    util = sim.state.cpu_used / nodes.cpu
    assert np.all((tel.cpu_mean >= 0) & (tel.cpu_mean <= 1.0 + 1e-9)) and np.all(tel.cpu_std >= 0)
    assert np.corrcoef(tel.cpu_mean, util)[0, 1] > 0.5  # a 10-minute mean tracks the current use
