"""Replay mode: invariants, determinism and the modelled mechanisms on small clusters."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.metrics import METRICS
from fedsched.common.schedulers import Placement, make_scheduler, place
from fedsched.common.sim.replay import (
    COMPLETED,
    FAILED,
    NODE_FAILED,
    PENDING,
    RUNNING,
    ReplayConfig,
    ReplaySimulator,
    replay_workload,
    run_replay,
)

NAN = math.nan

# A deterministic usage model: real use = request x a fixed ratio per QoS class (BE, Burstable,
# LS, Guaranteed), no limit but Guaranteed's (limit == request). The ratios are pinned to the
# pre-calibration table so these mechanism tests keep their hand-computed numbers.
QOS_USAGE_RATIO = ((1.60, 1.30), (1.10, 0.95), (0.70, 0.85), (0.95, 0.97))
QUIET = dict(usage_pod_sigma=0.0, usage_cpu_sigma=0.0, usage_mem_sigma=0.0,
             usage_cpu_median=tuple(r[0] for r in QOS_USAGE_RATIO),
             usage_mem_median=tuple(r[1] for r in QOS_USAGE_RATIO),
             usage_limit_ratio=(math.inf, math.inf, math.inf, 1.0),
             usage_amp_cpu=0.0, usage_amp_mem=0.0, usage_noise_cpu=0.0,
             usage_noise_mem=0.0, arrival_jitter_s=0.0, duration_jitter=0.0, startup_mean_s=0.0,
             failure_rate_per_node_hour=0.0)


def make_nodes(cpu, mem, gpu=None, model=None) -> NodeTable:
    n = len(cpu)
    gpu = np.zeros(n, dtype=np.int64) if gpu is None else np.asarray(gpu, dtype=np.int64)
    model = np.where(gpu > 0, 0, -1) if model is None else np.asarray(model, dtype=np.int64)
    return NodeTable(names=tuple(f"n{i}" for i in range(n)), cpu=np.asarray(cpu, dtype=np.int64),
                     mem=np.asarray(mem, dtype=np.int64), gpu=gpu, model=model.astype(np.int64),
                     models=("G1",) if (gpu > 0).any() else (), disk_io=np.full(n, 1000.0),
                     net=np.full(n, 10000.0))


def make_pods(cpu, mem, qos, creation, deletion, num_gpu=None, gpu_milli=None) -> PodTable:
    n = len(cpu)
    num_gpu = np.zeros(n, dtype=np.int64) if num_gpu is None else np.asarray(num_gpu, dtype=np.int64)
    gpu_milli = (np.zeros(n, dtype=np.int64) if gpu_milli is None
                 else np.asarray(gpu_milli, dtype=np.int64))
    return PodTable(names=tuple(f"p{i}" for i in range(n)), cpu=np.asarray(cpu, dtype=np.int64),
                    mem=np.asarray(mem, dtype=np.int64), num_gpu=num_gpu, gpu_milli=gpu_milli,
                    spec_mask=np.zeros(n, dtype=np.int64), qos=np.asarray(qos, dtype=np.int64),
                    creation=np.asarray(creation, dtype=np.float64),
                    deletion=np.asarray(deletion, dtype=np.float64))


def drive(sim: ReplaySimulator, scheduler_name: str = "kube-default", check: bool = False):
    sched = make_scheduler(scheduler_name)
    while (d := sim.next_pod()) is not None:
        pod, state = d
        if check:
            sim.check_invariants()
        sim.bind(place(sched, state, pod, sim.rng))
        if check:
            sim.check_invariants()
    return sim.finish()


def synthetic(n_nodes: int = 12, n_pods: int = 150, seed: int = 0):
    rng = np.random.default_rng(seed)
    nodes = make_nodes(cpu=rng.choice([4000, 8000, 16000], n_nodes),
                       mem=rng.choice([8192, 16384, 32768], n_nodes), gpu=rng.choice([0, 2, 4], n_nodes))
    creation = np.sort(rng.uniform(0, 2000, n_pods))
    dur = rng.exponential(600, n_pods)
    deletion = np.where(rng.random(n_pods) < 0.1, NAN, creation + dur)
    ng = rng.choice([0, 0, 1, 1, 2], n_pods)
    milli = np.where(ng == 1, rng.choice([250, 500, 1000], n_pods), np.where(ng == 2, 1000, 0))
    pods = make_pods(cpu=rng.choice([500, 1000, 2000, 4000], n_pods),
                     mem=rng.choice([512, 1024, 4096], n_pods), qos=rng.integers(0, 4, n_pods),
                     creation=creation, deletion=deletion, num_gpu=ng, gpu_milli=milli)
    return nodes, pods


# ---- invariants --------------------------------------------------------------------------

trace_strategy = st.integers(1, 4).flatmap(lambda n_nodes: st.tuples(
    st.just(n_nodes),
    st.lists(st.tuples(
        st.sampled_from([0, 300, 700, 1500, 2500]),  # cpu (2500 fits no node of 2000)
        st.sampled_from([0, 256, 1024, 3000]),  # mem
        st.integers(0, 3),  # qos
        st.one_of(st.just(NAN), st.floats(0, 120)),  # creation
        st.one_of(st.just(NAN), st.floats(0, 90)),  # duration (NaN: never leaves)
        st.sampled_from([(0, 0), (1, 300), (1, 1000), (2, 1000)]),  # GPU request
    ), min_size=1, max_size=25),
    st.integers(0, 2**31 - 1),  # seed
    st.booleans(),  # autoscale
    st.sampled_from([None, math.inf, 60.0]),  # horizon
    st.sampled_from(["kube-default", "target-load-packing", "random", "most-allocated"]),
))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace_strategy)
def test_conservation_and_no_overallocation(args):
    n_nodes, rows, seed, autoscale, horizon, sched = args
    nodes = make_nodes(cpu=[2000] * n_nodes, mem=[3000] * n_nodes, gpu=[2] * n_nodes)
    cpu, mem, qos, creation, dur, gpu = zip(*rows, strict=True)
    creation = np.array(creation)
    deletion = np.where(np.isnan(creation), np.array(dur), creation + np.array(dur))
    pods = make_pods(cpu, mem, qos, creation, deletion, num_gpu=[g[0] for g in gpu],
                     gpu_milli=[g[1] for g in gpu])
    cfg = ReplayConfig(usage_tick_s=2.0, max_wait_s=40.0, failure_rate_per_node_hour=200.0,
                       repair_mean_s=20.0, autoscale=autoscale, spare_fraction=0.3 if autoscale else 0.0,
                       scale_up_after_s=4.0, node_boot_s=3.0, scale_down_idle_s=10.0, horizon_s=horizon,
                       usage_noise_mem=0.3, usage_amp_mem=0.3, usage_period_s=600.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=seed)
    res = drive(sim, sched, check=True)
    sim.check_invariants()
    c = sim.counts()
    if horizon == 60.0:
        assert c["arrived"] == int((sim.workload.arrival <= 60.0).sum())
    else:
        assert c["arrived"] == len(sim.workload.pod)
    assert c["pending"] + c["running"] + c["completed"] + c["failed"] == c["arrived"]
    assert res.metrics["failed_pods"] == c["failed"] and res.metrics["pending_pods"] == c["pending"]
    # 2500m pods fit no node: they can only end failed or pending, never bound.
    for p in np.flatnonzero(pods.cpu > 2000):
        assert sim.status[p] in (0, PENDING, FAILED)
    if horizon == math.inf:  # ran until idle: nothing left pending
        assert c["pending"] == 0
    assert set(res.metrics) == set(METRICS)


def test_every_metric_and_counters():
    nodes, pods = synthetic()
    res = run_replay(nodes, pods, make_scheduler("kube-default"), config=ReplayConfig(), seed=1)
    assert list(res.metrics) == list(METRICS)
    for k in ("gpu_alloc_at_100", "gpu_alloc_at_target", "gpu_frag_rate_at_90"):
        assert math.isnan(res.metrics[k])
    for k in ("alloc_cpu", "alloc_mem", "alloc_gpu", "util_mean", "frag_ratio"):
        assert math.isfinite(res.metrics[k]) and res.metrics[k] >= 0
    assert res.counters["arrived"] == len(pods)
    assert res.counters["events"] >= res.counters["decisions"] >= res.counters["binds"] > 0
    assert res.end_time == pytest.approx(float(res.workload.arrival[-1]))
    assert len(res.latencies) == res.counters["binds"]
    assert res.metrics["pending_mean_s"] == pytest.approx(float(res.latencies.mean()))
    assert len(res.series["t"]) == res.counters["usage_ticks"]


# ---- determinism -------------------------------------------------------------------------

def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


def test_determinism():
    nodes, pods = synthetic()
    cfg = ReplayConfig(failure_rate_per_node_hour=5.0, repair_mean_s=300.0)
    sched = make_scheduler("kube-default")
    r1 = run_replay(nodes, pods, sched, config=cfg, seed=7)
    r2 = run_replay(nodes, pods, sched, config=cfg, seed=7)
    r3 = run_replay(nodes, pods, sched, config=cfg, seed=8)
    drop = {"wall_s", "events_per_s"}
    c1 = {k: v for k, v in r1.counters.items() if k not in drop}
    c2 = {k: v for k, v in r2.counters.items() if k not in drop}
    assert _same(r1.metrics, r2.metrics) and c1 == c2
    np.testing.assert_array_equal(r1.latencies, r2.latencies)
    np.testing.assert_array_equal(r1.series["util_mean"], r2.series["util_mean"])
    assert not _same(r1.metrics, r3.metrics)
    assert r1.metrics["util_mean"] != r3.metrics["util_mean"]


def test_workload_is_scheduler_independent():
    nodes, pods = synthetic()
    a = ReplaySimulator(nodes, pods, config=ReplayConfig(), seed=3)
    b = ReplaySimulator(nodes, pods, config=ReplayConfig(), seed=3)
    ra, rb = drive(a, "kube-default"), drive(b, "most-allocated")
    np.testing.assert_array_equal(ra.workload.arrival, rb.workload.arrival)
    np.testing.assert_array_equal(ra.workload.duration, rb.workload.duration)


# ---- OOM ---------------------------------------------------------------------------------

def test_oom_kills_lowest_priority_most_recent_and_requeues():
    # One node with 1000 MiB. Real memory = request x ratio (BE 1.3, Guaranteed 0.97):
    # B (BE, 300 -> 390) at t=0, C (BE, 250 -> 325) at t=1, A (Guaranteed, 400 -> 388) at t=2:
    # 1103 MiB > 1000 at the tick at t=5, so C (lowest QoS, most recently started among the
    # BE pods) is killed; A, the newest pod, survives because it is Guaranteed.
    nodes = make_nodes(cpu=[10000], mem=[1000])
    pods = make_pods(cpu=[100, 100, 100], mem=[400, 300, 250], qos=[3, 0, 0],
                     creation=[2, 0, 1], deletion=[NAN, NAN, NAN])
    cfg = ReplayConfig(**QUIET, usage_tick_s=5.0, horizon_s=7.0, oom_restart_s=5.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    res = drive(sim)
    assert res.metrics["oom_events"] == 1
    assert sim.node_stats.oom_count.tolist() == [1]
    assert sim.status == [RUNNING, RUNNING, PENDING]
    assert res.metrics["pending_pods"] == 1
    assert sim.state.mem_req[0] == 700  # C's request released
    assert sim.state.mem_used[0] == pytest.approx(388 + 390)
    sim.check_invariants()


def test_oom_killed_pod_comes_back_after_crash_loop_delay():
    nodes = make_nodes(cpu=[10000], mem=[1000])
    # B leaves at 30 (trace 0..30), so at C's later retries the node has room again.
    pods = make_pods(cpu=[100, 100, 100], mem=[400, 300, 250], qos=[3, 0, 0],
                     creation=[2, 0, 1], deletion=[NAN, 30, NAN])
    cfg = ReplayConfig(**QUIET, usage_tick_s=5.0, horizon_s=100.0, oom_restart_s=5.0,
                       oom_restart_max_s=5.0, max_wait_s=1000.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    res = drive(sim)
    # C is killed at 5, 15 and 25: re-bound 5 s after each kill, it starts just after the
    # tick of that instant and overflows the node at the next one; once B has left (30) it fits.
    assert res.metrics["oom_events"] == 3
    assert sim.status == [RUNNING, COMPLETED, RUNNING]
    assert res.metrics["pending_pods"] == 0
    assert res.latencies.tolist() == [0.0, 0.0, 0.0, 5.0, 5.0, 5.0]


# ---- node failures -----------------------------------------------------------------------

def test_node_failure_evicts_and_requeues():
    nodes = make_nodes(cpu=[1000, 1000, 1000], mem=[4096] * 3)
    pods = make_pods(cpu=[400] * 4, mem=[100] * 4, qos=[2] * 4, creation=[0] * 4, deletion=[NAN] * 4)
    cfg = ReplayConfig(**{**QUIET, "failure_rate_per_node_hour": 360.0}, repair_mean_s=1e6,
                       horizon_s=1000.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=5)
    sched = make_scheduler("kube-default")
    on_node: dict[int, set[int]] = {}
    seen_failure = False
    while (d := sim.next_pod()) is not None:
        if sim.counters["node_failures"] == 1 and not seen_failure:
            seen_failure = True
            failed = int(np.flatnonzero(sim.node_stats.status == NODE_FAILED)[0])
            victims = on_node.get(failed, set())
            assert victims, "the first failure hit a node with pods (all nodes hold pods)"
            assert not sim.state.alive[failed]
            assert sim.state.cpu_req[failed] == 0 and sim.state.cpu_used[failed] == 0
            assert sim.counters["evictions"] == len(victims)
            assert all(sim.status[p] == PENDING for p in victims)
            assert d[0].index in victims  # requeued pods are retried at once
            pl = place(sched, d[1], d[0], sim.rng)
            assert pl.node >= 0 and pl.node != failed
            sim.bind(pl)
            sim.check_invariants()
            break
        pl = place(sched, d[1], d[0], sim.rng)
        sim.bind(pl)
        on_node = {}
        for p in range(len(pods)):
            if sim.status[p] == RUNNING:
                on_node.setdefault(sim._node[p], set()).add(p)
    assert seen_failure
    assert sim.node_stats.failure_count.sum() == 1


def test_failed_node_comes_back_after_repair():
    nodes = make_nodes(cpu=[1000, 1000], mem=[4096] * 2)
    pods = make_pods(cpu=[400] * 2, mem=[100] * 2, qos=[2] * 2, creation=[0] * 2, deletion=[NAN] * 2)
    cfg = ReplayConfig(**{**QUIET, "failure_rate_per_node_hour": 36.0}, repair_mean_s=5.0,
                       horizon_s=2000.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=1)
    res = drive(sim)
    assert res.counters["node_failures"] > 0
    # Repairs are fast relative to the failure rate: all but possibly the last came back.
    assert res.counters["node_repairs"] >= res.counters["node_failures"] - 2
    assert res.counters["evictions"] > 0 and res.counters["running"] + res.counters["pending"] == 2


# ---- overload / utilisation --------------------------------------------------------------

@pytest.mark.parametrize(("cpu", "qos", "events"), [
    (900, 3, 1),  # Guaranteed: 0.95 x 900 = 855 > 850 (85% of 1000)
    (890, 3, 0),  # 845.5 < 850
    (600, 0, 1),  # BE: 1.6 x 600 = 960
    (600, 2, 0),  # LS: 0.7 x 600 = 420
])
def test_overload_counted_above_85_percent(cpu, qos, events):
    nodes = make_nodes(cpu=[1000], mem=[4096])
    pods = make_pods(cpu=[cpu], mem=[100], qos=[qos], creation=[0], deletion=[NAN])
    cfg = ReplayConfig(**QUIET, usage_tick_s=10.0, horizon_s=35.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    res = drive(sim)
    ratio = (0.95, 1.6, 0.7)[(3, 0, 2).index(qos)]
    # Three ticks (10, 20, 30) in overload count as one transition.
    assert res.metrics["overload_events"] == events
    assert sim.node_stats.overload_count.tolist() == [events]
    assert bool(sim.node_stats.overloaded[0]) == bool(events)
    assert res.metrics["util_mean"] == pytest.approx(min(100.0, cpu * ratio / 10))
    assert res.metrics["util_variance"] == pytest.approx(0.0, abs=1e-9)


def test_overload_transitions_counted_again():
    # Two pods: the second (BE 300 -> 480) joins at t=15 and leaves at 35, so the node
    # is at 42% (LS 600 -> 420), then 90%, then 42%, then 90% again from 45 on.
    nodes = make_nodes(cpu=[1000], mem=[4096])
    pods = make_pods(cpu=[600, 300, 300], mem=[100] * 3, qos=[2, 0, 0], creation=[0, 15, 45],
                     deletion=[NAN, 35, NAN])
    cfg = ReplayConfig(**QUIET, usage_tick_s=10.0, horizon_s=75.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    res = drive(sim)
    assert res.series["util_mean"].tolist() == pytest.approx([42, 90, 90, 42, 90, 90, 90])
    assert res.metrics["overload_events"] == 2
    trend = sim.node_stats.cpu_trend[0]
    assert trend != 0  # the EMA of d(cpu_used)/dt saw the changes


# ---- time compression / workload ---------------------------------------------------------

def test_time_compression_shortens_the_simulated_span():
    nodes, pods = synthetic()
    base = dict(arrival_jitter_s=0.0, duration_jitter=0.0, horizon_s=math.inf)
    r1 = run_replay(nodes, pods, make_scheduler("kube-default"), config=ReplayConfig(**base), seed=2)
    r10 = run_replay(nodes, pods, make_scheduler("kube-default"),
                     config=ReplayConfig(**base, time_compression=10.0), seed=2)
    np.testing.assert_allclose(r10.workload.arrival * 10, r1.workload.arrival)
    fin = np.isfinite(r1.workload.duration)
    np.testing.assert_allclose(r10.workload.duration[fin] * 10, r1.workload.duration[fin])
    assert r10.end_time < r1.end_time / 5
    assert r10.counters["completed"] > 0 and r1.counters["completed"] > 0


def test_missing_times():
    nodes = make_nodes(cpu=[4000], mem=[4096])
    pods = make_pods(cpu=[100] * 3, mem=[100] * 3, qos=[2] * 3, creation=[NAN, 0, 100],
                     deletion=[30, NAN, 200])
    cfg = ReplayConfig(**QUIET, horizon_s=math.inf)
    wl = replay_workload(pods, nodes, cfg, np.random.default_rng(0))
    assert wl.pod.tolist() == [0, 1, 2]
    assert wl.arrival.tolist() == [0.0, 0.0, 100.0]  # missing creation: arrives at 0
    assert wl.duration.tolist() == [30.0, math.inf, 100.0]  # missing deletion: never leaves
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    res = drive(sim)
    assert sim.status == [COMPLETED, RUNNING, COMPLETED]
    assert res.end_time == pytest.approx(200.0)


def test_window_max_pods_and_start_quantile():
    nodes = make_nodes(cpu=[4000], mem=[4096])
    pods = make_pods(cpu=[100] * 5, mem=[100] * 5, qos=[2] * 5, creation=[0, 10, 20, 30, 40],
                     deletion=[5, 25, NAN, 35, 45])
    cfg = ReplayConfig(**QUIET, window_s=(12.0, 35.0))
    wl = replay_workload(pods, nodes, cfg, np.random.default_rng(0))
    # Pod 0 is gone by 12; pod 1 is present at the start (arrives at 0, leaves at 25-12);
    # pod 4 is created after the window.
    assert wl.pod.tolist() == [1, 2, 3]
    assert wl.arrival.tolist() == [0.0, 8.0, 18.0]
    assert wl.duration.tolist() == [13.0, math.inf, 5.0]
    wl = replay_workload(pods, nodes, ReplayConfig(**QUIET, max_pods=2), np.random.default_rng(0))
    assert wl.pod.tolist() == [0, 1] and wl.end == 10.0
    # Median creation 20: pod 1 (10..25) is still there at 20, pod 0 (0..5) is not.
    wl = replay_workload(pods, nodes, ReplayConfig(**QUIET, start_quantile=0.5), np.random.default_rng(0))
    assert wl.pod.tolist() == [1, 2, 3, 4] and wl.arrival.tolist() == [0.0, 0.0, 10.0, 20.0]
    assert wl.duration.tolist() == [5.0, math.inf, 5.0, 5.0]


def test_target_load_solves_duration_scale():
    nodes, pods = synthetic(n_pods=300)
    cfg = ReplayConfig(target_load=0.3)
    wl = replay_workload(pods, nodes, cfg, np.random.default_rng(0))
    assert wl.offered_load == pytest.approx(0.3, rel=1e-6)
    assert wl.duration_scale != 1.0
    res = run_replay(nodes, pods, make_scheduler("kube-default"), config=cfg, seed=0)
    assert res.metrics["alloc_gpu"] > 10.0


# ---- pending queue -----------------------------------------------------------------------

def test_backoff_retries_place_pod_once_capacity_frees():
    # A (800m) runs 0..20; B (500m) arrives at 1 and fits only after A leaves. Backoff
    # 1, 2, 4, 8, 10 s: attempts at 1, 2, 4, 8, 16, 26 -> bound at 26 (waited 25 s).
    nodes = make_nodes(cpu=[1000], mem=[4096])
    pods = make_pods(cpu=[800, 500], mem=[100, 100], qos=[2, 2], creation=[0, 1], deletion=[20, NAN])
    cfg = ReplayConfig(**QUIET, horizon_s=math.inf, max_wait_s=1000.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    res = drive(sim)
    assert sim.status == [COMPLETED, RUNNING]
    assert res.latencies.tolist() == [0.0, 25.0]
    assert res.metrics["pending_mean_s"] == pytest.approx(12.5)
    assert res.metrics["failed_pods"] == 0
    # The retries at 2, 4, 8 and 16 saw no released capacity and skipped the scheduler.
    assert res.counters["attempts_skipped"] == 4 and res.counters["decisions"] == 3


def test_max_wait_fails_a_pod():
    nodes = make_nodes(cpu=[1000], mem=[4096])
    pods = make_pods(cpu=[800, 500], mem=[100, 100], qos=[2, 2], creation=[0, 1], deletion=[20, NAN])
    cfg = ReplayConfig(**QUIET, horizon_s=math.inf, max_wait_s=10.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    res = drive(sim)
    # Attempts at 1, 2, 4, 8 and a last one at the deadline 11: failed.
    assert sim.status == [COMPLETED, FAILED]
    assert res.metrics["failed_pods"] == 1 and res.metrics["pending_pods"] == 0
    assert res.metrics["failed_cpu_cores"] == 0.5 and res.metrics["failed_gpus"] == 0.0  # B's request


def test_pending_at_end_counted():
    nodes = make_nodes(cpu=[1000], mem=[4096])
    pods = make_pods(cpu=[800, 500], mem=[100, 100], qos=[2, 2], creation=[0, 1], deletion=[NAN, NAN])
    res = run_replay(nodes, pods, make_scheduler("kube-default"),
                     config=ReplayConfig(**QUIET, horizon_s=50.0), seed=0)
    assert res.metrics["pending_pods"] == 1 and res.metrics["failed_pods"] == 0


# ---- autoscaler --------------------------------------------------------------------------

def test_autoscaler_scales_up_and_down():
    nodes = make_nodes(cpu=[1000, 1000], mem=[4096] * 2)
    pods = make_pods(cpu=[800, 800], mem=[100, 100], qos=[2, 2], creation=[0, 1], deletion=[100, 101])
    cfg = ReplayConfig(**QUIET, autoscale=True, spare_fraction=0.5, usage_tick_s=5.0,
                       scale_up_after_s=5.0, node_boot_s=10.0, scale_down_idle_s=30.0,
                       horizon_s=200.0, max_wait_s=1000.0)
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    assert sim.state.alive.sum() == 1
    res = drive(sim)
    assert res.counters["scale_ups"] == 1
    assert sim.status == [COMPLETED, COMPLETED]
    # The second pod keeps the queue non-empty from 1: the tick at 5 starts the timer, the
    # one at 10 brings the spare back (boot 10 s: alive at 20); the pod's backoff retries
    # at 2, 4, 8, 16 fail and the one at 26 binds it there (waited 25 s).
    assert res.latencies[1] == pytest.approx(25.0)
    assert sim.node_stats.n_pods.tolist() == [0, 0]
    # Both nodes idle from 100 / 126: one is removed, min_nodes=1 keeps the other.
    assert res.counters["scale_downs"] == 1 and sim.state.alive.sum() == 1


# ---- stepping API ------------------------------------------------------------------------

def test_stepping_api():
    nodes = make_nodes(cpu=[1000], mem=[4096])
    pods = make_pods(cpu=[800, 500, 100], mem=[100] * 3, qos=[2] * 3, creation=[0, 1, 2],
                     deletion=[NAN] * 3)
    sim = ReplaySimulator(nodes, pods, config=ReplayConfig(**QUIET, horizon_s=5.0), seed=0)
    with pytest.raises(RuntimeError):
        sim.bind(Placement(0))
    pod, state = sim.next_pod()
    assert pod.index == 0 and state is sim.state
    with pytest.raises(RuntimeError):
        sim.next_pod()
    sim.bind(Placement(0))
    # With skip_infeasible the 500m pod (fits nowhere) is not offered; the 100m one is.
    pod, _ = sim.next_pod(skip_infeasible=True)
    assert pod.index == 2 and sim.feasible_mask.tolist() == [True]
    sim.bind(Placement(0))
    assert sim.next_pod(skip_infeasible=True) is None
    assert sim.status == [RUNNING, PENDING, RUNNING]


def test_bind_rejects_dead_node_and_overallocation():
    nodes = make_nodes(cpu=[1000, 1000], mem=[4096] * 2)
    pods = make_pods(cpu=[800, 500], mem=[100] * 2, qos=[2] * 2, creation=[0, 1], deletion=[NAN] * 2)
    sim = ReplaySimulator(nodes, pods, config=ReplayConfig(**QUIET), seed=0)
    sim.next_pod()
    sim.bind(Placement(0))
    sim.next_pod()
    with pytest.raises(AssertionError):
        sim.bind(Placement(0))  # 1300m on a 1000m node
    sim2 = ReplaySimulator(nodes, pods, config=ReplayConfig(**QUIET), seed=0)
    sim2.state.alive[1] = False
    sim2.next_pod()
    with pytest.raises(ValueError):
        sim2.bind(Placement(1))


def test_config_validation():
    nodes, pods = synthetic(n_pods=5)
    for bad in (dict(time_compression=0), dict(backoff_initial_s=-1), dict(spare_fraction=1.0),
                dict(target_load=-0.1), dict(window_s=(5.0, 5.0)), dict(start_quantile=1.0)):
        with pytest.raises(ValueError):
            ReplaySimulator(nodes, pods, config=ReplayConfig(**bad), seed=0)


def test_usage_noise_is_a_stationary_ar1_around_the_qos_mean():
    # One Burstable pod alone on a node, no sinusoid, no per-pod factor: its CPU use over
    # the ticks is base * (1 + eps) with eps an AR(1) of std 0.2 and lag-1 correlation rho.
    nodes = make_nodes(cpu=[100000], mem=[1 << 20])
    pods = make_pods(cpu=[10000], mem=[1000], qos=[1], creation=[0], deletion=[NAN])
    cfg = ReplayConfig(**{**QUIET, "usage_noise_cpu": 0.2, "usage_noise_mem": 0.05},
                       usage_tick_s=10.0, usage_noise_tau_s=60.0, horizon_s=40000.0)
    res = run_replay(nodes, pods, make_scheduler("kube-default"), config=cfg, seed=3)
    base = 10000 * QOS_USAGE_RATIO[1][0]
    eps = res.series["util_mean"] * 1000 / base - 1.0  # util % of 100000m
    rho = math.exp(-10 / 60)
    assert len(eps) == 4000
    assert abs(eps.mean()) < 0.04
    assert eps.std() == pytest.approx(0.2, rel=0.1)
    assert np.corrcoef(eps[:-1], eps[1:])[0, 1] == pytest.approx(rho, abs=0.05)


def test_skipping_hopeless_retries_changes_nothing():
    """The epoch short-cut answers exactly what ``place`` would (no node gained room)."""

    class NoShortcut(ReplaySimulator):
        def _failed_attempt(self, p: int) -> None:
            super()._failed_attempt(p)
            self._fail_epoch[p] = -2  # never equal to the epoch: always ask the scheduler

    nodes, pods = synthetic(n_nodes=4, n_pods=200)
    cfg = ReplayConfig(target_load=0.6, failure_rate_per_node_hour=2.0)
    a = drive(ReplaySimulator(nodes, pods, config=cfg, seed=4))
    b = drive(NoShortcut(nodes, pods, config=cfg, seed=4))
    assert a.counters["attempts_skipped"] > 0 and b.counters["attempts_skipped"] == 0
    assert b.counters["decisions"] > a.counters["decisions"]
    assert _same(a.metrics, b.metrics)
    np.testing.assert_array_equal(a.latencies, b.latencies)
