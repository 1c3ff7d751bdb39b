"""The packing check (``fedsched serve --packing-check``): a model stays active only where the
benchmark's packing simulation of the pods asked for, on the cache's own node table, allocates more
with it than with the scheduler it replaces, with evidence; verdicts per model and node table, on a
thread of their own, figures equal to the benchmark's own simulation."""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.arrivals import ArrivalPool
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.model_store import LoadedModel, ModelStore, load_model
from fedsched.agent.serving.packing_check import POLICY, PackingCheck
from fedsched.common.model.cluster import Pod
from fedsched.common.model.metrics import TROUBLE_SMOOTHING
from fedsched.common.schedulers import (
    LEARNED_ONLINE,
    Lookahead,
    LookaheadArgs,
    SchedulerContext,
    default_policy_path,
    make_scheduler,
)
from fedsched.common.schedulers.base import rank
from fedsched.common.sim.portfolio import proven_better, simulated_allocations
from tests.checkpoint_support import write_scaled
from tests.common.schedulers.sched_testkit import nodes, pod_table

# Four 2-GPU nodes; single-GPU pods and whole-node pods: packing the single-GPU pods (FGD) keeps
# nodes whole for the 2-GPU pods, spreading them (kube-default) does not.
CLUSTER = nodes(cpu=[16000] * 4, gpu=[2] * 4)
POOL = pod_table([(2000, 1024, 1, 1000)] * 6 + [(4000, 2048, 2, 1000)] * 6)


def as_model(name: str) -> LoadedModel:
    """A baseline served as if it were a model (what the check needs of a model: a second scorer)."""
    def make():
        return make_scheduler(name, SchedulerContext(train_pods=POOL))

    return LoadedModel(make(), name, "", 0.0, make_scheduler=make)


def filled(n: int) -> ArrivalPool:
    arrivals = ArrivalPool(max_pool=64, min_pool=1)
    for i in range(n):
        arrivals.record(f"u{i}", Pod.from_table(POOL, i % len(POOL)))
    return arrivals


@pytest.mark.parametrize(("served", "against", "active"), [("fgd", "kube-default", True),
                                                          ("kube-default", "fgd", False),
                                                          ("fgd", "fgd", False)])  # a tie is not more
def test_the_verdict_is_the_benchmarks_simulation_of_both_on_the_node_table(served, against, active):
    arrivals = filled(len(POOL))
    check = PackingCheck(arrivals, against, seeds=4, min_pool=len(POOL))
    model = as_model(served)
    assert check.verdict(model, CLUSTER) is None  # started, not yet known
    check.wait(60)
    v = check.verdict(model, CLUSTER)
    assert v is not None and v.active is active and (v.pods, v.nodes) == (len(POOL), 4)
    pool = arrivals.pool()
    for figure, name in ((v.policy_runs, served), (v.against_runs, against)):
        again = simulated_allocations(CLUSTER, pool, lambda c, n=name: make_scheduler(n, c), 4)
        assert list(figure) == pytest.approx(again)
    assert against in v.reason(against) and f"{v.policy:.2f}%" in v.reason(against)


def test_nothing_runs_before_min_pool_and_each_model_and_table_is_simulated_once(monkeypatch):
    from fedsched.agent.serving import packing_check

    runs = []
    real = packing_check.simulated_allocations
    monkeypatch.setattr(packing_check, "simulated_allocations",
                        lambda nodes_, *a: runs.append(nodes_) or real(nodes_, *a))
    arrivals = filled(5)
    check = PackingCheck(arrivals, "kube-default", seeds=2, min_pool=6, min_interval_s=0.0)
    fgd = as_model("fgd")
    assert check.verdict(fgd, CLUSTER) is None and runs == []  # 5 pods asked for: too few
    arrivals.record("u5", Pod.from_table(POOL, 5))
    check.verdict(fgd, CLUSTER)
    check.wait(60)
    first = check.verdict(fgd, CLUSTER)
    assert first is not None and runs == [CLUSTER, CLUSTER]
    assert check.verdict(fgd, CLUSTER) is first and len(runs) == 2  # known: not simulated again
    grown = nodes(cpu=[16000] * 5, gpu=[2] * 5)
    assert check.verdict(fgd, grown) is first  # the last verdict stands while the new table runs
    check.wait(60)
    assert check.verdict(fgd, grown) is not first and runs[2:] == [grown, grown]
    kd = as_model("kube-default")
    assert check.verdict(kd, grown) is None  # another model: its own verdict
    check.wait(60)
    assert check.verdict(kd, grown) is not None and len(runs) == 6


def test_a_model_is_checked_again_each_time_the_pool_has_doubled(monkeypatch):
    """The first pods can mislead: the verdict is taken again on twice as many, and stands
    meanwhile; a pool that has not doubled is not simulated again, whatever the interval."""
    from fedsched.agent.serving import packing_check

    runs = []
    real = packing_check.simulated_allocations
    monkeypatch.setattr(packing_check, "simulated_allocations",
                        lambda nodes_, pool, *a: runs.append(len(pool)) or real(nodes_, pool, *a))
    arrivals = ArrivalPool(max_pool=24, min_pool=1)
    check = PackingCheck(arrivals, "kube-default", seeds=2, min_pool=6, min_interval_s=3600.0)
    fgd = as_model("fgd")

    def ask(upto: int) -> None:
        for i in range(len(arrivals), upto):
            arrivals.record(f"u{i}", Pod.from_table(POOL, i % len(POOL)))

    ask(6)
    check.verdict(fgd, CLUSTER)
    check.wait(60)
    first = check.verdict(fgd, CLUSTER)
    assert first is not None and first.pods == 6 and runs == [6, 6]
    ask(11)
    assert check.verdict(fgd, CLUSTER) is first and not check.running  # not yet twice as many
    ask(12)
    assert check.verdict(fgd, CLUSTER) is first and check.running  # twice: checked again, first stands
    check.wait(60)
    second = check.verdict(fgd, CLUSTER)
    assert second is not first and second.pods == 12 and runs == [6, 6, 12, 12]
    assert first.incumbent is None and second.incumbent == first.choose((POLICY,))
    ask(24)  # the pool is full at 24: the last check
    check.verdict(fgd, CLUSTER)
    check.wait(60)
    ask(40)  # still 24 kept: never twice the last verdict's again
    assert check.verdict(fgd, CLUSTER).pods == 24 and not check.running and runs[4:] == [24, 24]


@pytest.mark.parametrize("keep", [True, False])
def test_a_recheck_keeps_what_served_unless_a_challenger_is_proven_better_than_it(monkeypatch, keep):
    """Each re-check's candidates are simulated anew; the model, chosen first, keeps serving while
    FGD's lead over it is inside the noise, and FGD takes over once proven to allocate more than it
    (scripted figures: the choice, not the simulation, is under test here). Without the history
    (``keep_incumbent`` off, what the served benchmark compares) FGD takes over at once."""
    from fedsched.agent.serving import packing_check

    kube = [94.0, 94.1, 93.9, 94.0]
    script = iter([
        ([95.5, 95.6, 95.4, 95.5], kube, [[95.3, 95.4, 95.2, 95.3]]),  # the model leads
        ([95.38, 95.47, 95.33, 95.40], kube, [[95.40, 95.50, 95.30, 95.44]]),  # FGD ahead by noise
        ([95.38, 95.47, 95.33, 95.40], kube, [[96.4, 96.5, 96.3, 96.4]]),  # FGD a point ahead
    ])
    monkeypatch.setattr(packing_check, "_simulate", lambda *a: next(script))
    arrivals = ArrivalPool(max_pool=64, min_pool=1)
    check = PackingCheck(arrivals, "kube-default", seeds=4, min_pool=6, alternatives=("fgd",))
    check.keep_incumbent = keep
    model = as_model("most-allocated")
    chosen, verdicts = [], []
    for upto in (6, 12, 24):
        for i in range(len(arrivals), upto):
            arrivals.record(f"u{i}", Pod.from_table(POOL, i % len(POOL)))
        check.verdict(model, CLUSTER)
        check.wait(60)
        v = check.verdict(model, CLUSTER)
        assert v is not None and v.pods == upto
        verdicts.append(v)
        chosen.append((v.incumbent, v.choose((POLICY, "fgd")), v.active))
    if not keep:
        assert chosen == [(None, POLICY, True), (None, "fgd", False), (None, "fgd", False)]
        return
    assert chosen == [(None, POLICY, True), (POLICY, POLICY, True), (POLICY, "fgd", False)]
    # without the history the second verdict would have handed the cluster to FGD
    assert dataclasses.replace(verdicts[1], incumbent=None).choose((POLICY, "fgd")) == "fgd"
    assert "policy served before this check" in verdicts[1].reason("kube-default")


def test_a_changed_node_table_waits_for_the_interval_but_a_new_model_does_not():
    check = PackingCheck(filled(12), "kube-default", seeds=2, min_pool=1, min_interval_s=3600.0)
    fgd = as_model("fgd")
    check.verdict(fgd, CLUSTER)
    check.wait(60)
    first = check.verdict(fgd, CLUSTER)
    grown = nodes(cpu=[16000] * 5, gpu=[2] * 5)
    assert first is not None and check.verdict(fgd, grown) is first
    check.wait(60)
    assert check.verdict(fgd, grown) is first  # nothing was started: too soon after the last
    kd = as_model("kube-default")
    check.verdict(kd, CLUSTER)  # a model without a verdict is simulated at once
    check.wait(60)
    assert check.verdict(kd, CLUSTER) is not None


def test_a_model_whose_file_is_another_model_by_now_is_simulated_in_the_thread():
    """A refused reload keeps serving a model whose file has moved on: the child finds another
    version there, and the model in memory is simulated instead (one verdict, no second child)."""
    path = default_policy_path()
    real = load_model(path)
    stale = dataclasses.replace(real, version="an-earlier-file")  # served, but the file has moved on
    pool = filled(12)
    check = PackingCheck(pool, "kube-default", seeds=2, min_pool=1)
    assert check.verdict(stale, CLUSTER) is None and check.running
    check.wait(120)
    v = check.verdict(stale, CLUSTER)
    assert v is not None and not check.running
    assert v.model_version == "an-earlier-file"
    expected = simulated_allocations(CLUSTER, pool.pool(), lambda _c: stale.make_scheduler(), 2)
    assert list(v.policy_runs) == pytest.approx(expected)


def test_close_stops_the_child_and_the_model_gets_no_verdict():
    """``Decider.close()`` (the agent stopping) terminates a simulation under way in its child: the
    waiting thread ends, nothing is recorded as evidence and nothing starts again."""
    model = load_model(default_policy_path())
    check = PackingCheck(filled(12), "kube-default", seeds=16, min_pool=1)
    assert check.verdict(model, CLUSTER) is None and check.running
    deadline = time.monotonic() + 60
    while (check._child is None or not check._child.is_alive()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = check._child
    assert child is not None and child.is_alive()
    check.close()
    check.wait(60)
    assert not check.running and not child.is_alive()
    assert check.verdict(model, CLUSTER) is None and not check.running  # recorded: not started again


def test_a_failing_simulation_gives_no_verdict_and_is_not_retried(monkeypatch):
    from fedsched.agent.serving import packing_check

    calls = []

    def broken(*_a):
        calls.append(1)
        raise RuntimeError("boom")

    monkeypatch.setattr(packing_check, "simulated_allocations", broken)
    check = PackingCheck(filled(12), "kube-default", seeds=2, min_pool=1)
    model = as_model("fgd")
    check.verdict(model, CLUSTER)
    check.wait(60)
    assert check.verdict(model, CLUSTER) is None and check.verdict(model, CLUSTER) is None and calls == [1]


@pytest.mark.parametrize(("kw", "msg"), [({"against": "lookahead:fgd"}, "a baseline"),
                                         ({"against": "learned"}, "a baseline"),
                                         ({"seeds": 1}, "seeds"), ({"min_pool": 0}, "min_pool"),
                                         ({"alternatives": ("learned",)}, "are baselines"),
                                         ({"alternatives": ("fgd", "fgd")}, "differ"),
                                         ({"alternatives": ("kube-default",)}, "differ")])
def test_bad_arguments_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        PackingCheck(ArrivalPool(), **kw)
    if "against" in kw:
        with pytest.raises(ValueError, match=msg):
            DeciderConfig(packing_check=kw["against"])


@pytest.mark.parametrize(("against", "active"), [("fgd", False), ("kube-default", True)])
def test_the_decider_serves_the_checks_verdict_and_exports_its_figures(against, active):
    """The shipped packing policy served with the check: its figures are the benchmark's simulation
    of the pods the decider was asked for on the cache's node table, the mode follows the verdict,
    and the answer is the policy's or the default's. On this cluster the policy is not proven to
    pack more than FGD (shadow), and is proven to pack more than kube-default, which spreads the
    1-GPU pods and strands 2-GPU pods (active)."""
    cache = ClusterCache.from_table(CLUSTER)
    cfg = DeciderConfig(gate=None, budget_ms=60_000.0, packing_check=against)
    d = Decider(cache, ModelStore("learned"), cfg)
    assert d.packing_check is not None and d.search is None
    d.packing_check.min_pool = d.arrivals.min_pool = len(POOL)
    names = list(CLUSTER.names)
    model = d.models.current
    for i in range(len(POOL)):
        obj = pod_to_json(Pod.from_table(POOL, i), f"p-{i}", CLUSTER.models, uid=f"u-{i}")
        d.filter(obj, names)  # pods asked for are recorded; nothing is bound
    assert d.mode_for(model) == "shadow"  # the first verdict is being simulated: no evidence yet
    d.packing_check.wait(120)
    v = d.packing_check.verdict(model, cache.table)
    assert v is not None and v.active is active
    pool = d.arrivals.pool()
    policy = simulated_allocations(cache.table, pool, lambda _c: model.make_scheduler(), 4)
    assert list(v.policy_runs) == pytest.approx(policy)
    baseline = simulated_allocations(cache.table, pool, lambda c: make_scheduler(against, c), 4)
    assert list(v.against_runs) == pytest.approx(baseline)
    assert d.mode_for(model) == ("active" if v.active else "shadow")
    sample = d.metrics.registry.get_sample_value
    assert sample("fedsched_packing_check_allocation_percent",
                  {"model_version": model.version, "scheduler": "policy"}) == pytest.approx(v.policy)
    assert sample("fedsched_packing_check_allocation_percent",
                  {"model_version": model.version, "scheduler": against}) == pytest.approx(v.against)
    obj = pod_to_json(Pod.from_table(POOL, 0), "p-last", CLUSTER.models, uid="u-last")
    d.filter(obj, names)
    dec = d.prioritize(obj, names)
    # active: the policy answers; shadow: the default scores answer, the policy's pick only logged
    assert (dec.source, dec.reason) == (("policy", "") if v.active else ("fallback", "shadow"))
    assert dec.served is None  # no alternative: the model's ranking or none answered


def test_the_alternatives_are_simulated_on_the_same_workloads_and_the_most_proven_serves():
    """Each alternative's figures are the benchmark's simulation of the same pods on the same node
    table; of the candidates allowed to serve, those proven to pack more than the scheduler they
    replace compete on their means, and none proven is shadow."""
    arrivals = filled(len(POOL))
    check = PackingCheck(arrivals, "kube-default", seeds=4, min_pool=len(POOL),
                         alternatives=("fgd", "most-allocated"))
    model = as_model("kube-default")  # a model that packs as kube-default does: never proven
    check.verdict(model, CLUSTER)
    check.wait(60)
    v = check.verdict(model, CLUSTER)
    assert v is not None and [n for n, _ in v.alternative_runs] == ["fgd", "most-allocated"]
    pool = arrivals.pool()
    for name, runs in v.alternative_runs:
        assert list(runs) == pytest.approx(
            simulated_allocations(CLUSTER, pool, lambda c, n=name: make_scheduler(n, c), 4))
    assert not v.active and v.choose([POLICY]) is None
    proven = [n for n, r in v.alternative_runs if proven_better(list(r), list(v.against_runs))[0]]
    assert "fgd" in proven  # FGD keeps nodes whole for the 2-GPU pods
    figures = v.figures()
    assert v.choose((POLICY, "fgd", "most-allocated")) == max(proven, key=figures.__getitem__)
    assert v.choose(("fgd",)) == "fgd" and v.choose(()) is None
    assert v.choose(("most-allocated",)) == ("most-allocated" if "most-allocated" in proven else None)
    assert f"fgd {figures['fgd']:.2f}%" in v.reason("kube-default")


def _admitting(profile: str) -> dict:
    """Evidence the gate admits on ``profile`` for gpu-alloc: more GPU allocated, no guardrail worse."""
    calm = {"values": [0.0] * 8}
    packs = {"values": [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.1]}
    return {"format": 1, "reference": "kube-default", "quick": False, "profiles": {profile: {
        "nodes": 100, "seeds": list(range(8)), "trouble_score": calm,
        "log_ratio": {m: calm for m in TROUBLE_SMOOTHING},
        "diff": {"pending_p99_s": calm, "alloc_gpu": packs, "gpu_frag_amount_avg": calm}}}}


@pytest.mark.parametrize("admitted", [True, False])
def test_an_alternative_serves_in_the_models_place_only_where_its_own_evidence_admits_it(
        monkeypatch, admitted):
    """The roll-out gate refuses the shipped packing policy on a GPU cluster (its OOM guardrail).
    FGD, the check's alternative, serves in its place where the gate admits FGD by FGD's own
    evidence and the check proves it packing more than kube-default: the answers are FGD's ranking
    on the live state, ties to the first node in the decider's fixed node order (the packing
    simulation's tie-break). Without such evidence nothing is even
    simulated, and kube-default's scores answer."""
    from fedsched.agent.serving import decider as decider_module

    monkeypatch.setattr(decider_module, "baseline_evidence",
                        lambda name: _admitting("gpu") if admitted and name == "fgd" else None)
    cache = ClusterCache.from_table(CLUSTER)
    cfg = DeciderConfig(gate="auto", gate_objective="gpu-alloc", budget_ms=60_000.0, packing_check="auto",
                        packing_alternatives=("fgd",))
    d = Decider(cache, ModelStore("learned"), cfg)
    model = d.models.current
    assert d.packing_check is not None and d._gate_mode(model) == "shadow"
    d.packing_check.min_pool = d.arrivals.min_pool = len(POOL)
    names = list(CLUSTER.names)
    for i in range(len(POOL)):
        d.filter(pod_to_json(Pod.from_table(POOL, i), f"p-{i}", CLUSTER.models, uid=f"u-{i}"), names)
    assert d.mode_for(model) == "shadow"  # no verdict yet (or nothing may serve)
    assert d.packing_check.running is admitted  # nothing eligible: nothing simulated
    d.packing_check.wait(120)
    obj = pod_to_json(Pod.from_table(POOL, 0), "p-last", CLUSTER.models, uid="u-last")
    pod = cache.pod(obj)
    if not admitted:
        assert d.packing_check.verdict(model, cache.table) is None and d.mode_for(model) == "shadow"
        assert d.prioritize(obj, names).source == "fallback"
        return
    v = d.packing_check.verdict(model, cache.table)
    assert v is not None and v.choose(("fgd",)) == "fgd"  # the model, refused by the gate, may not serve
    mode, served = d.serving(model)
    assert mode == "active" and served is not None and served.name == "fgd"
    assert d.serving(model)[1] is served  # built once per verdict
    rng = np.random.default_rng()
    rng.bit_generator.state = d.rng.bit_generator.state
    ids = cache.lookup_positions(names)[0]
    fgd = make_scheduler("fgd", SchedulerContext(train_pods=v.pool))
    want = rank(fgd, cache.state, pod, rng, candidates=ids, node_rank=d._tie_order())
    d.filter(obj, names)
    dec = d.prioritize(obj, names)
    assert (dec.source, dec.chosen) == ("policy", CLUSTER.names[want.node])
    assert dec.served is served  # the decision says which candidate answered it
    sample = d.metrics.registry.get_sample_value
    assert sample("fedsched_packing_check_serving", {"model_version": model.version, "scheduler": "fgd"}) == 1
    assert sample("fedsched_packing_check_allocation_percent",
                  {"model_version": model.version, "scheduler": "fgd"}) == pytest.approx(v.figures()["fgd"])


def test_the_tie_order_is_a_fixed_priority_per_node_name_that_survives_a_changed_table():
    """The alternative's ties go to the first node in a fixed random order of the node names: the
    same order for the same names whatever the table's layout, a new node slotted in without
    moving the others, and another order for another seed."""
    def order(cluster, seed=0):
        cfg = DeciderConfig(gate=None, seed=seed)
        d = Decider(ClusterCache.from_table(cluster), ModelStore("learned"), cfg)
        ranks = d._tie_order()
        assert sorted(ranks.tolist()) == list(range(len(cluster)))
        return sorted(cluster.names, key=lambda n: ranks[list(cluster.names).index(n)])

    wide = nodes(cpu=[16000] * 12, gpu=[2] * 12)
    first = order(wide)
    assert first != sorted(wide.names) and first == order(wide)
    grown = nodes(cpu=[16000] * 13, gpu=[2] * 13)
    assert [n for n in order(grown) if n in set(wide.names)] == first
    assert order(wide, seed=1) != first


KUBE = [94.0, 94.1, 93.9, 94.0]
FGD = [95.3, 95.4, 95.2, 95.3]  # proven above KUBE


def scripted(monkeypatch, figures: list) -> threading.Event:
    """The check's simulations answer ``figures`` in turn, each once the returned event is set
    (the choice and its timing, not the simulation, are under test)."""
    from fedsched.agent.serving import packing_check

    script, release = iter(figures), threading.Event()

    def simulate(*_a):
        assert release.wait(60)
        answer = next(script)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(packing_check, "_simulate", simulate)
    return release


def reloadable_decider(tmp_path) -> tuple[Decider, Path]:
    """A decider serving a copy of the online policy (rewritten to load a new model version), with
    the packing check (FGD as the alternative) simulating in its own thread (where ``scripted``
    reaches it), once every pod of ``POOL`` has been asked for, as it now has."""
    path = tmp_path / "policy.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), path)
    cfg = DeciderConfig(gate=None, budget_ms=60_000.0, packing_check="kube-default",
                        packing_alternatives=("fgd",))
    d = Decider(ClusterCache.from_table(CLUSTER), ModelStore(str(path)), cfg)
    assert d.packing_check is not None
    d.packing_check.use_child = False
    d.packing_check.min_pool = d.arrivals.min_pool = len(POOL)
    names = list(CLUSTER.names)
    for i in range(len(POOL)):
        d.filter(pod_to_json(Pod.from_table(POOL, i), f"p-{i}", CLUSTER.models, uid=f"u-{i}"), names)
    return d, path


def test_a_new_model_is_carried_the_latest_earlier_verdict_only_until_its_first_one(monkeypatch):
    """``carried``: while a model's first simulation is due or under way, the latest verdict of an
    earlier model; never for a model with a verdict of its own, one whose simulation failed or one
    that cannot be simulated."""
    release = scripted(monkeypatch, [([95.5] * 4, KUBE, [FGD]), ([93.0] * 4, KUBE, [FGD]),
                                     RuntimeError("boom")])
    check = PackingCheck(filled(12), "kube-default", seeds=4, min_pool=1, alternatives=("fgd",))
    a, b, c = (dataclasses.replace(as_model("fgd"), version=v) for v in "abc")
    assert check.verdict(a, CLUSTER) is None and check.carried(a) is None  # nothing earlier
    release.set()
    check.wait(60)
    va = check.verdict(a, CLUSTER)
    assert va is not None and check.carried(a) is None  # its own verdict
    assert check.carried(b) is va  # due: not started yet
    release.clear()
    assert check.verdict(b, CLUSTER) is None and check.running and check.carried(b) is va  # under way
    release.set()
    check.wait(60)
    vb = check.verdict(b, CLUSTER)
    assert vb is not None and check.carried(b) is None and check.carried(c) is vb  # the latest
    check.verdict(c, CLUSTER)
    check.wait(60)
    assert check.verdict(c, CLUSTER) is None and check.carried(c) is None  # failed: nothing carried
    unsimulated = dataclasses.replace(as_model("fgd"), version="d", make_scheduler=None)
    assert check.carried(unsimulated) is None


@pytest.mark.parametrize("fgd_proven", [True, False])
def test_after_a_reload_the_alternative_an_earlier_verdict_proved_serves_until_the_new_models_verdict(
        monkeypatch, tmp_path, fgd_proven):
    """A federation reloads a model every round. Model A's verdict chose the model, with FGD proven
    to pack more than kube-default too; model B, just loaded, has no evidence of its own, so it may
    not serve, but FGD's evidence does not depend on the model: FGD serves until B's simulation ends
    (exported as what serves for B). B's verdict then keeps FGD, what served meanwhile, as its
    incumbent: B's lead over FGD is inside the noise. Where A's verdict proved no alternative, B
    starts in shadow mode and its verdict lets it serve."""
    fgd = FGD if fgd_proven else KUBE
    b_runs = [95.40, 95.38, 95.30, 95.32]  # above FGD's mean by 0.05, not proven; proven above KUBE
    release = scripted(monkeypatch, [([95.5] * 4, KUBE, [fgd]), (b_runs, KUBE, [fgd])])
    d, path = reloadable_decider(tmp_path)
    check, cache, names = d.packing_check, d.cache, list(CLUSTER.names)
    assert check is not None
    a = d.models.current
    assert d.serving(a) == ("shadow", None) and check.running  # nothing earlier to carry
    release.set()
    check.wait(60)
    assert d.serving(a) == ("active", None)  # A's verdict: the model
    release.clear()
    write_scaled(path, 0.5)
    assert d.models.reload()[0]
    b = d.models.current
    assert b.version != a.version and check.running  # B's simulation started at the reload
    sample = d.metrics.registry.get_sample_value
    obj = pod_to_json(Pod.from_table(POOL, 0), "p-next", CLUSTER.models, uid="u-next")
    d.filter(obj, names)
    dec = d.prioritize(obj, names)
    mode, served = d.serving(b)
    if fgd_proven:
        assert mode == "active" and served is not None and served.name == "fgd"
        assert (dec.source, dec.served) == ("policy", served)
        assert sample("fedsched_packing_check_serving", {"model_version": b.version, "scheduler": "fgd"}) == 1
    else:
        assert (mode, served) == ("shadow", None) and (dec.source, dec.reason) == ("fallback", "shadow")
        assert sample("fedsched_packing_check_serving",
                      {"model_version": b.version, "scheduler": "kube-default"}) == 1
    release.set()
    check.wait(60)
    v = check.verdict(b, cache.table)
    assert v is not None and check.carried(b) is None
    if fgd_proven:
        assert v.incumbent == "fgd" and not v.active and d.serving(b)[1] is not None
        assert dataclasses.replace(v, incumbent=None).choose((POLICY, "fgd")) == POLICY  # without it
    else:
        assert v.incumbent is None and v.active and d.serving(b) == ("active", None)


def test_the_incumbent_is_what_served_among_the_candidates_the_gate_allows(monkeypatch):
    """With the model refused by the roll-out gate and two alternatives allowed, the first verdict's
    choice among every candidate is the model, which never served; FGD did. A re-check keeps FGD
    while most-allocated's lead over it is inside the noise (without ``eligible`` the incumbent
    would be the model, ignored, and most-allocated would take over on noise)."""
    alts = ("fgd", "most-allocated")
    release = scripted(monkeypatch, [([96.5] * 4, KUBE, [FGD, [95.2, 95.3, 95.1, 95.2]]),
                                     ([96.5] * 4, KUBE, [FGD, [95.45, 95.35, 95.15, 95.40]])])
    release.set()
    arrivals = ArrivalPool(max_pool=64, min_pool=1)
    check = PackingCheck(arrivals, "kube-default", seeds=4, min_pool=6, alternatives=alts,
                         eligible=lambda _m: alts)
    model = as_model("most-allocated")
    verdicts = []
    for upto in (6, 12):
        for i in range(len(arrivals), upto):
            arrivals.record(f"u{i}", Pod.from_table(POOL, i % len(POOL)))
        check.verdict(model, CLUSTER)
        check.wait(60)
        verdicts.append(check.verdict(model, CLUSTER))
    first, second = verdicts
    assert first.choose(alts) == "fgd" and first.choose((POLICY, *alts)) == POLICY
    assert second.incumbent == "fgd" and second.choose(alts) == "fgd"
    assert dataclasses.replace(second, incumbent=POLICY).choose(alts) == "most-allocated"


def test_with_the_search_on_the_check_simulates_the_search_over_the_model():
    """``fedsched serve --search``: what serves as the policy is the search over the model, so that is
    what the check simulates (the benchmark's ``lookahead[...]`` over the model, its arrivals drawn
    from the workload's pods). Here the search packs the 1-GPU pods that kube-default spreads: its
    figures are not the model's alone."""
    args = LookaheadArgs(candidates=3, horizon=4)
    arrivals = filled(len(POOL))
    check = PackingCheck(arrivals, "fgd", seeds=4, min_pool=len(POOL), search=args)
    model = as_model("kube-default")
    check.verdict(model, CLUSTER)
    check.wait(60)
    v = check.verdict(model, CLUSTER)
    assert v is not None and v.search == args.spec()
    assert f"through the search {args.spec()}" in v.reason("fgd")
    pool = arrivals.pool()
    searched = simulated_allocations(CLUSTER, pool, lambda c: Lookahead(c, model.make_scheduler, args), 4)
    alone = simulated_allocations(CLUSTER, pool, lambda c: make_scheduler("kube-default", c), 4)
    assert list(v.policy_runs) == pytest.approx(searched) and searched != alone


def test_the_decider_checks_what_it_serves_with_the_search_on_in_the_child_too():
    """Through the decider, the shipped packing policy simulated in the check's spawned child: the
    search's arguments reach the child, and the verdict's figures are the search over the model's."""
    args = LookaheadArgs(candidates=2, horizon=3)
    cache = ClusterCache.from_table(CLUSTER)
    cfg = DeciderConfig(gate=None, budget_ms=60_000.0, packing_check="kube-default", search=args)
    d = Decider(cache, ModelStore("learned"), cfg)
    check = d.packing_check
    assert check is not None and check.search is args and check.use_child
    check.min_pool = d.arrivals.min_pool = len(POOL)
    names = list(CLUSTER.names)
    for i in range(len(POOL)):
        d.filter(pod_to_json(Pod.from_table(POOL, i), f"p-{i}", CLUSTER.models, uid=f"u-{i}"), names)
    model = d.models.current
    d.serving(model)
    check.wait(120)
    v = check.verdict(model, cache.table)
    assert v is not None and v.search == args.spec()
    want = simulated_allocations(cache.table, d.arrivals.pool(),
                                 lambda c: Lookahead(c, model.make_scheduler, args), 4)
    assert list(v.policy_runs) == pytest.approx(want)


def test_a_verdict_on_a_model_replaced_meanwhile_exports_what_serves_the_current_one(monkeypatch, tmp_path):
    """Model B is loaded while A's first simulation runs. When A's verdict lands (FGD proven), it is
    what B is carried: FGD serves B, and that is what is exported for B (not A's figures under A's
    version, which no longer serves)."""
    release = scripted(monkeypatch, [([95.5] * 4, KUBE, [FGD]), ([95.5] * 4, KUBE, [FGD])])
    d, path = reloadable_decider(tmp_path)
    check = d.packing_check
    assert check is not None
    a = d.models.current
    assert d.serving(a) == ("shadow", None) and check.running  # A's simulation, held
    write_scaled(path, 0.5)
    assert d.models.reload()[0]
    b = d.models.current
    assert d.serving(b) == ("shadow", None)  # nothing to carry yet
    release.set()
    check.wait(60)
    release.clear()  # B's own simulation, started by the next question, is held
    sample = d.metrics.registry.get_sample_value
    assert sample("fedsched_packing_check_serving", {"model_version": b.version, "scheduler": "fgd"}) == 1
    assert sample("fedsched_packing_check_allocation_percent",
                  {"model_version": a.version, "scheduler": "policy"}) is None
    mode, served = d.serving(b)
    assert mode == "active" and served is not None and served.name == "fgd" and check.running
    release.set()
    check.wait(60)
