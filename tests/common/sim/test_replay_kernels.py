"""The compiled loops of the replay engine (numba: ``sim/replay/usage_kernel.py`` for the usage
tick and the telemetry window, ``schedulers/kube_default_kernel.py`` for kube-default's pass
over the nodes, ``learning/features_kernel.py`` for a learned policy's per-candidate features)
give bit-identical runs: the same metrics, counters, per-tick series and latencies as the numpy
forms they replace, for the same seed, and the same throttled CPU per pod."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from fedsched.common.learning import features as features_module
from fedsched.common.model.cluster import ClusterState
from fedsched.common.model.load_metrics import UsageWindow
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import KubeDefault, SchedulerContext, make_scheduler, place
from fedsched.common.schedulers import kube_default as kd
from fedsched.common.sim.replay import ReplayConfig, run_replay, usage_kernel
from fedsched.common.sim.replay import simulator as sim_module
from fedsched.common.sim.replay import usage as usage_module
from fedsched.common.sim.replay.config import NodeStats
from fedsched.common.sim.replay.usage import UsageModel
from tests.common.sim.test_replay import make_nodes, make_pods

WEB = dict(trace_hours=24.0, cpu_median_milli=1000.0, cpu_max_milli=8000, diurnal_amplitude=0.3)


def _numpy_forms(monkeypatch: pytest.MonkeyPatch, shortcut: bool) -> None:
    """The numpy forms everywhere; without ``shortcut`` also no ``top_nodes`` (``rank``'s path)."""
    monkeypatch.setattr(sim_module, "KERNELS", None)
    monkeypatch.setattr(kd, "top_kernel", None)
    monkeypatch.setattr(features_module, "KERNEL", None)
    if not shortcut:
        monkeypatch.delattr(KubeDefault, "top_nodes")


def _run(nodes, pods, policy: str, seed: int, **options) -> dict[str, object]:
    sched = make_scheduler(policy, SchedulerContext(train_pods=pods, rng=np.random.default_rng(seed)))
    sim = sim_module.ReplaySimulator(nodes, pods, config=ReplayConfig(**options), seed=seed)
    while (d := sim.next_pod()) is not None:  # run_replay's loop, keeping the simulator
        sim.bind(place(sched, d[1], d[0], sim.rng))
    res = sim.finish()
    counters = {k: v for k, v in res.counters.items() if k not in ("wall_s", "events_per_s")}
    return {"metrics": res.metrics, "counters": counters, "latencies": res.latencies.tolist(),
            "pod_throttled": sim.pod_throttled_core_s(np.arange(len(pods))).tolist(),
            **{f"series_{k}": v.tolist() for k, v in res.series.items()}}


def _same(a: object, b: object) -> bool:
    """Equal bit for bit (NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


CASES = [
    # (profile, cluster overrides, policy, replay options): kube-default on a loaded web cluster,
    # node failures and the autoscaler (alive changes), GPUs (shares, whole GPUs, models), and a
    # policy reading the windowed mean and deviation.
    ("web", dict(n_nodes=6, n_pods=1500, **WEB), "kube-default", dict(target_load=0.95)),
    ("web", dict(n_nodes=6, n_pods=1500, **WEB), "kube-default",
     dict(target_load=0.9, failure_rate_per_node_hour=0.2, autoscale=True, spare_fraction=0.3)),
    ("gpu", dict(n_nodes=12, n_pods=300), "kube-default", dict(target_load=0.85, time_compression=20.0)),
    ("edge", dict(n_nodes=12, n_pods=800), "load-variation-risk-balancing", dict(target_load=0.9)),
    # the online policy: each decision reads its application's observed use (app_usage) and the
    # windowed peaks, so a bit astray in either moves its placements and the metrics
    ("web", dict(n_nodes=6, n_pods=1500, **WEB), "learned-online", dict(target_load=0.95)),
    # ... and on GPUs (fragmentation, GPU tags; features_kernel's columns)
    ("gpu", dict(n_nodes=12, n_pods=300), "learned-online", dict(target_load=0.85, time_compression=20.0)),
]


@pytest.mark.parametrize(("profile", "overrides", "policy", "options"), CASES)
def test_compiled_replay_is_bit_identical_to_the_numpy_forms(profile: str, overrides: dict, policy: str,
                                                            options: dict,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert usage_kernel.KERNELS is not None and kd.top_kernel is not None, "numba is a dependency"
    nodes, pods = generate_cluster(profile, 7, **overrides)
    compiled = _run(nodes, pods, policy, 3, **options)
    assert compiled["counters"]["decisions"] > 100
    sched = make_scheduler(policy, SchedulerContext(train_pods=pods, rng=np.random.default_rng(3)))
    res = run_replay(nodes, pods, sched, config=ReplayConfig(**options), seed=3)
    assert _same(compiled["metrics"], res.metrics)  # the stepping loop is run_replay's
    if options.get("autoscale"):  # the case is there to move nodes up and down
        assert compiled["counters"]["node_failures"] > 0 and compiled["counters"]["scale_ups"] > 0
    with monkeypatch.context() as m:
        _numpy_forms(m, shortcut=True)
        assert _same(compiled, _run(nodes, pods, policy, 3, **options))
    if policy == "kube-default":
        with monkeypatch.context() as m:
            _numpy_forms(m, shortcut=False)
            assert _same(compiled, _run(nodes, pods, policy, 3, **options))


def test_usage_tick_squeezes_best_effort_pods_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Best-effort pods on nodes whose demand exceeds capacity (their share of the idle CPU), OOM
    kills and the trend: the compiled tick and the numpy tick, tick after tick, bit for bit."""
    n_nodes, n_pods = 3, 36
    nodes = make_nodes([4000] * n_nodes, [5000] * n_nodes)
    qos = [0 if i % 2 else 1 for i in range(n_pods)]  # half best effort
    pods = make_pods([900] * n_pods, [300] * n_pods, qos, [0.0] * n_pods, [1e9] * n_pods)
    cfg = ReplayConfig(usage_cpu_median=(1.2, 1.0, 1.0, 1.0), usage_mem_median=(2.0, 2.0, 2.0, 2.0))
    g = [np.random.default_rng(s) for s in (1, 2)]
    st = ClusterState(nodes)
    model = UsageModel(cfg, nodes, pods, st, NodeStats.zeros(n_nodes), g[0], g[1],
                       kernels=usage_kernel.KERNELS)
    assert model._kernels is not None
    for p in range(n_pods):
        model.start(p, p % n_nodes, 5.0 * p)
    twin = copy.deepcopy(model)
    twin._kernels = None
    squeezed = killed = 0
    for tick in range(1, 200):
        now = 200.0 + 10.0 * tick
        outs = []
        for m in (model, twin):
            kills: list[int] = []

            def kill(p: int, _delay: float, m: UsageModel = m, kills: list[int] = kills) -> None:
                m.stop(p, p % n_nodes)
                kills.append(p)

            outs.append((m.step(now, kill), kills))
        assert outs[0] == outs[1]
        killed += len(outs[0][1])
        for name in ("_sf", "cpu_demand", "_prev_cpu", "_prev_mem", "throttled_core_s"):
            assert np.array_equal(getattr(model, name), getattr(twin, name)), (tick, name)
        for name in ("cpu_used", "mem_used"):
            assert np.array_equal(getattr(model.state, name), getattr(twin.state, name)), (tick, name)
        for name in ("cpu_trend", "mem_trend", "overloaded", "overload_count", "oom_count"):
            ours, theirs = getattr(model.node_stats, name), getattr(twin.node_stats, name)
            assert np.array_equal(ours, theirs), (tick, name)
        assert [np.array_equal(a, b) for a, b in zip(model.running_per_node(), twin.running_per_node(),
                                                     strict=True)] == [True, True]
        squeezed += int(np.isclose(model.cpu_demand, model.cap_cpu).sum())
        for p in outs[0][1]:  # restart the killed pods: the nodes stay full
            model.start(p, p % n_nodes, now)
            twin.start(p, p % n_nodes, now)
    assert squeezed > 0 and killed > 0  # both paths were exercised
    assert (model.throttled_core_s > 0).sum() > 3  # and pods were throttled


def test_compiled_window_is_usage_window() -> None:
    rng = np.random.default_rng(4)
    ref, fast = UsageWindow((2, 17), 95.0), usage_kernel.CompiledUsageWindow((2, 17), 95.0)
    assert np.array_equal(fast.std(), np.zeros((2, 17))) and np.array_equal(fast.peak(), ref.peak())
    for _ in range(300):
        dt = float(rng.choice([10.0, 10.0, 7.5, 30.0]))
        v = rng.random((2, 17)) * rng.choice([0.1, 1.0, 3.0])
        assert np.array_equal(fast.add(dt, v), ref.add(dt, v))
        assert np.array_equal(fast.std(), ref.std())
        assert np.array_equal(fast.peak(), ref.peak())
    # NaN anywhere in the window gives NaN as np.max does; it leaves with its sample
    for i in range(60):
        v = rng.random((2, 17))
        if i % 9 == 0:
            v[i % 2, i % 17] = np.nan
        fast.add(10.0, v)
        ref.add(10.0, v)
        assert np.array_equal(fast.peak(), ref.peak(), equal_nan=True)


def test_kernel_rows_are_the_models() -> None:
    for name in ("_BASE", "_AMP", "_MAX", "_EPS", "_CUR", "_BEF"):
        assert getattr(usage_kernel, name) == getattr(usage_module, name), name


def test_an_applications_observed_use_is_the_numpy_forms_bit_for_bit() -> None:
    """``app_usage`` on the compiled loop (one application's sums in slot order) against the
    numpy form (every application's ``np.bincount``, kept until a tick or a departure), for
    every application, all along a replay: after starts, departures and ticks alike."""
    assert usage_kernel.KERNELS is not None
    nodes, pods = generate_cluster("web", 7, n_nodes=6, n_pods=1500, **WEB)
    sched = make_scheduler("kube-default", SchedulerContext(train_pods=pods, rng=np.random.default_rng(3)))
    sim = sim_module.ReplaySimulator(nodes, pods, config=ReplayConfig(target_load=0.95), seed=3)
    usage = sim.usage
    apps = sorted({int(a) for a in pods.app if a >= 0})
    assert len(apps) > 50
    compared = seen = 0
    while (d := sim.next_pod()) is not None:
        sim.bind(place(sched, d[1], d[0], sim.rng))
        if compared % 7 == 0:
            fast = [usage.app_usage(a) for a in apps]
            usage._kernels, usage._app_sums = None, None
            ref = [usage.app_usage(a) for a in apps]
            usage._kernels = usage_kernel.KERNELS
            assert fast == ref
            seen += sum(x is not None for x in fast)
        compared += 1
    assert usage.app_usage(-5) is None and seen > 1000
