"""The decision-time search served (``fedsched serve --search``), against the environment it is
measured in: a packing run of the openb trace (:class:`~fedsched.common.sim.packing.PackingSimulator`)
whose every pod goes through the decider's filter and prioritize (early ranking on), and whose
every decision is also taken by the search the benchmark builds (``lookahead[...]:learned`` from the
registry) on the simulator's own state, with the arrivals the agent draws from. Both pick the same
node, pod by pod, and the agent's counters say what the search did. Beside it: the arrival pool's
rules and the option's parsing."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.model_store import ModelStore
from fedsched.agent.serving.search import MIN_POOL, ServingSearch
from fedsched.cli.serve import search_args
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.schedulers import Lookahead, LookaheadArgs, SchedulerContext, make_scheduler
from fedsched.common.schedulers.base import Placement, rank
from fedsched.common.sim.packing import PackingSimulator

ARGS = LookaheadArgs(candidates=4, horizon=5)
DECISIONS = 160


def searches(d: Decider, result: str) -> float:
    return d.metrics.registry.get_sample_value("fedsched_search_decisions_total", {"result": result}) or 0.0


def test_the_served_search_picks_what_the_benchmarks_search_picks_on_the_simulators_state():
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv")).select(np.arange(0, 1213, 12))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    sim = PackingSimulator(nodes, pods, target_load=1.0, seed=0)
    cache = ClusterCache.from_table(nodes)
    d = Decider(cache, ModelStore("learned"), DeciderConfig(gate=None, budget_ms=60_000.0, search=ARGS))
    names = list(nodes.names)
    bench: Lookahead | None = None
    rankings = switched = 0
    while (item := sim.next_pod()) is not None and rankings < DECISIONS:
        pod, state = item
        obj = pod_to_json(pod, f"p-{sim.k}", nodes.models, uid=f"u-{sim.k}")
        fits = np.flatnonzero(cache.state.feasible(pod))  # kube-scheduler's own filters first
        passed = d.filter(obj, [names[i] for i in fits]).passed if len(fits) else []
        if not passed:
            sim.bind(Placement(-1))
            continue
        dec = d.prioritize(obj, passed)
        assert dec.source == "policy", dec.reason
        node = cache.index[dec.chosen]
        pool = d.search.pool()
        if pool is not None:  # the benchmark's search over the same pool, keyed as the agent keys it
            if bench is None:
                bench = make_scheduler(f"lookahead[{ARGS.spec()}]:learned", SchedulerContext(train_pods=pool))
            if bench.pool is not pool:
                bench.set_pool(pool)
            bench.reseed(rankings)
            before = bench.switched
            want = rank(bench, state, pod, np.random.default_rng(0)).node
            switched += bench.switched - before
            assert node == want, f"decision {rankings}: the agent picked {node}, the search {want}"
        gpus = d.models.current.scheduler.select_gpus(cache.state, pod, node)
        cache.bind(f"u-{sim.k}", pod, dec.chosen, gpus)
        sim.bind(Placement(node, gpus))
        rankings += 1
    assert rankings == DECISIONS
    no_pool = searches(d, "no-pool")
    assert no_pool == MIN_POOL - 1  # the pod asked for is in the pool of its own decision
    assert switched > 0 and searches(d, "switched") == switched
    assert no_pool + searches(d, "switched") + searches(d, "kept") + searches(d, "single") == DECISIONS
    used = d.metrics.registry.get_sample_value("fedsched_early_rankings_total", {"result": "used"})
    assert used and used > DECISIONS / 2  # the search ran ahead, as filter answered


def test_the_pool_keeps_the_last_pods_asked_for_once_each_and_is_rebuilt_when_an_eighth_is_new():
    s = ServingSearch(LookaheadArgs(), max_pool=16, min_pool=4)
    pods = [Pod(-1, 100 * (i + 1), 128, 0, 0, 0, 1) for i in range(40)]
    for i in range(3):
        s.record(f"u{i}", pods[i])
    assert s.pool() is None  # fewer than min_pool asked for: the model alone answers
    s.record("u0", pods[0])  # a retry is the same arrival
    assert s.pool() is None
    s.record("u3", pods[3])
    first = s.pool()
    assert first is not None and sorted(first.cpu.tolist()) == [100, 200, 300, 400]
    for i in range(4, 40):
        s.record(f"u{i}", pods[i])
    pool = s.pool()
    assert pool is not first and sorted(pool.cpu.tolist()) == [100 * (i + 1) for i in range(24, 40)]
    s.record("u39", pods[39])  # retries never count as new
    assert s.pool() is pool
    s.record("u40", pods[0])
    assert s.pool() is pool  # 1 new of 16: kept
    s.record("u41", pods[1])
    assert s.pool() is not pool  # 2 of 16: an eighth is new
    with pytest.raises(ValueError, match="min_pool <= max_pool"):
        ServingSearch(LookaheadArgs(), max_pool=4, min_pool=8)


@pytest.mark.parametrize("text,want", [
    (None, None), ("default", LookaheadArgs()), (" default ", LookaheadArgs()),
    ("candidates=8,horizon=20", LookaheadArgs(candidates=8, horizon=20)),
])
def test_the_option_reads_default_or_arguments(text, want):
    assert search_args(text) == want


@pytest.mark.parametrize("text,msg", [
    ("", "needs 'default' or key=value"), ("on", "'on' is not key=value"),
    ("candidates=0", "out of range"), ("horizon=" + "9" * 10_000, "horizon must be an integer"),
    ("candidates=4," * 5_000, "candidates is given twice"),
])
def test_a_bad_option_is_refused_naming_it(text, msg):
    with pytest.raises(ValueError, match=msg) as e:
        search_args(text)
    assert str(e.value).startswith("--search ")
