"""best-of[...]: the reference (first member) unless the packing simulation of the pods on the
cluster shows another allocating more with evidence."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedsched.common.model.cluster import ClusterState
from fedsched.common.schedulers import SchedulerContext, make_scheduler
from fedsched.common.sim.packing import run_packing
from fedsched.common.sim.portfolio import (
    SIM_TARGET_LOAD,
    BestOf,
    BestOfArgs,
    best_proven,
    forget_simulations,
    parse_name,
    proven_better,
)
from tests.common.schedulers.sched_testkit import nodes, pod_table, whole

# Four 2-GPU nodes; single-GPU pods and whole-node pods. Spreading the single-GPU pods (kube-default)
# leaves no node free for the 2-GPU pods; packing them (FGD) keeps nodes whole.
CLUSTER = nodes(cpu=[16000] * 4, gpu=[2] * 4)
POOL = pod_table([(2000, 1024, 1, 1000)] * 6 + [(4000, 2048, 2, 1000)] * 6)


@pytest.fixture(autouse=True)
def _fresh_figures():
    """Each test simulates (or fakes) its own figures: none are kept from another test."""
    forget_simulations()
    yield
    forget_simulations()


@pytest.mark.parametrize(("name", "members", "seeds"), [
    ("best-of[fgd,kube-default]", ["fgd", "kube-default"], 4),
    ("best-of[ fgd , kube-default ;seeds=3]", ["fgd", "kube-default"], 3),
    ("best-of[lookahead[candidates=2,horizon=3]:fgd,best-fit,kube-default]",
     ["lookahead[candidates=2,horizon=3]:fgd", "best-fit", "kube-default"], 4),
])
def test_names_read_as_members_and_arguments(name, members, seeds):
    assert parse_name(name) == (members, BestOfArgs(seeds=seeds))


@pytest.mark.parametrize(("name", "msg"), [
    ("best-of[fgd]", "at least two"),
    ("best-of[fgd,]", "at least two"),
    ("best-of[fgd,fgd]", "named twice"),
    ("best-of[fgd,kube-default", "expected best-of["),
    ("best-of[fgd,kube-default;seeds=1]", "2 <= seeds <= 16"),
    ("best-of[fgd,kube-default;seeds=x]", "integer"),
    ("best-of[fgd,kube-default;seeds=2,seeds=3]", "seeds=N (once)"),
    ("best-of[fgd,kube-default;horizon=2]", "seeds=N (once)"),
    ("best-of[fgd,best-of[fgd,best-fit]]", "a choice itself"),
    ("best-of[" + ",".join(f"m{i}" for i in range(9)) + "]", "at most 8"),
])
def test_bad_names_are_refused_saying_why(name, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        parse_name(name)


def test_other_names_are_not_choices():
    assert parse_name("fgd") is None and parse_name("lookahead:fgd") is None


def test_an_unknown_member_and_missing_pods_are_refused():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_scheduler("best-of[fgd,nope]", SchedulerContext(train_pods=POOL))
    with pytest.raises(ValueError, match="pods it may learn from"):
        make_scheduler("best-of[fgd,kube-default]", SchedulerContext())


def runs(member: str, seeds: int) -> list[float]:
    """The benchmark's own packing runs of ``member`` on CLUSTER with POOL's pods, one per workload."""
    out = []
    for s in range(seeds):
        sched = make_scheduler(member, SchedulerContext(train_pods=POOL, rng=np.random.default_rng(s)))
        res = run_packing(CLUSTER, POOL, sched, target_load=SIM_TARGET_LOAD, seed=s)
        out.append(float(res.alloc_pct[-1]))
    return out


@pytest.mark.parametrize(("candidate", "reference", "proven"), [
    ([77.0, 77.2, 76.9, 77.1], [76.0] * 4, True),  # steadily 1 point more
    ([77.0] * 4, [76.0] * 4, True),  # exactly 1 point more every time
    ([78.0, 75.0, 77.5, 75.5], [76.0] * 4, False),  # 0.5 more on average, with no evidence
    ([76.03, 76.32], [76.47, 75.79], False),  # two workloads once said +0.05 (six said -0.4)
    ([76.0] * 4, [76.0] * 4, False),  # equal is not more
    ([75.0, 75.1, 74.9, 75.0], [76.0] * 4, False),
])
def test_more_means_more_with_evidence(candidate, reference, proven):
    assert proven_better(candidate, reference)[0] is proven


KUBE = [94.0, 94.1, 93.9, 94.0]
FGD = [95.40, 95.50, 95.30, 95.44]  # proven over KUBE
MODEL = [95.38, 95.47, 95.33, 95.40]  # proven over KUBE, a few hundredths below FGD: no evidence either way
PACKER = [96.4, 96.5, 96.3, 96.4]  # a point above FGD and the model every time


@pytest.mark.parametrize(("runs", "incumbent", "choice"), [
    ({"model": MODEL, "fgd": FGD}, None, "fgd"),  # the highest mean of the proven
    ({"model": MODEL, "fgd": FGD}, "model", "model"),  # FGD is not proven better than the incumbent
    ({"model": MODEL, "fgd": FGD}, "fgd", "fgd"),
    ({"model": MODEL, "packer": PACKER}, "model", "packer"),  # proven better than the incumbent: replaces it
    ({"model": KUBE, "fgd": FGD}, "model", "fgd"),  # an incumbent no longer proven is no incumbent
    ({"model": MODEL, "fgd": FGD}, "gone", "fgd"),  # nor is one that is not a candidate
    ({"model": KUBE}, "model", None),  # none proven: shadow, whatever served before
])
def test_an_incumbent_stays_until_a_challenger_is_proven_better_than_it(runs, incumbent, choice):
    assert best_proven(runs, KUBE, incumbent) == choice


@pytest.mark.parametrize("order", [["kube-default", "fgd"], ["fgd", "kube-default"]])
def test_the_choice_follows_the_simulations_of_the_pods_on_the_cluster_and_it_decides(order):
    sched = make_scheduler(f"best-of[{','.join(order)}]", SchedulerContext(train_pods=POOL))
    assert isinstance(sched, BestOf) and sched.chosen is None
    live = ClusterState(CLUSTER)
    p = whole(1, cpu=2000, mem=1024)
    scores = sched.score(live, p, np.arange(4))
    expected = {m: runs(m, 4) for m in order}
    assert sched.per_seed == {m: pytest.approx(v) for m, v in expected.items()}
    # the cluster is built so that packing pays, every workload
    assert proven_better(expected["fgd"], expected["kube-default"])[0]
    assert sched.chosen == "fgd"  # as the reference, and against it
    fgd = make_scheduler("fgd", SchedulerContext(train_pods=POOL))
    live.allocate(0, p, (0,))
    np.testing.assert_array_equal(sched.score(live, p, np.arange(4)), fgd.score(live, p, np.arange(4)))
    assert sched.select_gpus(live, p, 0) == fgd.select_gpus(live, p, 0)
    assert len(scores) == 4


def test_a_higher_mean_without_evidence_does_not_replace_the_reference(monkeypatch):
    from fedsched.common.sim import portfolio

    figures = {"kube-default": [76.0] * 4, "best-fit": [78.0, 75.0, 77.5, 75.5],
               "fgd": [77.0, 77.2, 76.9, 77.1]}

    def fixed(_nodes, pool, make, _seeds):
        return figures[make(SchedulerContext(train_pods=pool)).name]

    monkeypatch.setattr(portfolio, "simulated_allocations", fixed)
    for members, chosen in ((["kube-default", "best-fit"], "kube-default"),
                            (["kube-default", "best-fit", "fgd"], "fgd"),
                            (["best-fit", "kube-default"], "best-fit")):
        sched = make_scheduler(f"best-of[{','.join(members)}]", SchedulerContext(train_pods=POOL))
        sched.score(ClusterState(CLUSTER), whole(1, cpu=2000, mem=1024), np.arange(4))
        assert sched.chosen == chosen, members


def test_equal_simulations_keep_the_first_listed_member():
    one = nodes(cpu=[16000], gpu=[2])  # one node: every scheduler places alike
    for order in (["best-fit", "kube-default"], ["kube-default", "best-fit"]):
        sched = make_scheduler(f"best-of[{','.join(order)};seeds=2]", SchedulerContext(train_pods=POOL))
        sched.score(ClusterState(one), whole(1, cpu=2000, mem=1024), np.arange(1))
        assert len(set(sched.simulated.values())) == 1 and sched.chosen == order[0]


def test_each_node_table_is_simulated_once(monkeypatch):
    from fedsched.common.sim import portfolio

    calls = []
    real = portfolio.run_packing
    monkeypatch.setattr(portfolio, "run_packing",
                        lambda nodes_, *a, **k: calls.append(nodes_) or real(nodes_, *a, **k))
    sched = make_scheduler("best-of[kube-default,fgd]", SchedulerContext(train_pods=POOL))
    p = whole(1, cpu=2000, mem=1024)
    sched.score(ClusterState(CLUSTER), p, np.arange(4))
    sched.select_gpus(ClusterState(CLUSTER), p, 0)
    assert calls == [CLUSTER] * 8 and sched.chosen == "fgd"  # two members, four workloads, once
    one = nodes(cpu=[16000], gpu=[2])
    sched.score(ClusterState(one), p, np.arange(1))  # a changed table: simulated again
    assert calls[8:] == [one] * 8 and sched.chosen == "kube-default"  # equal on one node: the reference


def test_equal_tables_built_apart_are_simulated_once_in_a_process(monkeypatch):
    """An evaluation builds a scheduler, its node table and its pods anew in each run: the figures
    of equal content are reused, a different pool or member list is simulated."""
    from fedsched.common.sim import portfolio

    calls = []
    real = portfolio.run_packing
    monkeypatch.setattr(portfolio, "run_packing", lambda *a, **k: calls.append(1) or real(*a, **k))
    p = whole(1, cpu=2000, mem=1024)
    chosen = []
    for _ in range(3):  # three runs, each with tables of its own
        cluster = nodes(cpu=[16000] * 4, gpu=[2] * 4)
        pool = pod_table([(2000, 1024, 1, 1000)] * 6 + [(4000, 2048, 2, 1000)] * 6)
        assert cluster is not CLUSTER and pool is not POOL
        sched = make_scheduler("best-of[kube-default,fgd]", SchedulerContext(train_pods=pool))
        sched.score(ClusterState(cluster), p, np.arange(4))
        chosen.append((sched.chosen, sched.per_seed))
    assert len(calls) == 8 and all(c == chosen[0] for c in chosen) and chosen[0][0] == "fgd"
    other_pool = pod_table([(2000, 1024, 1, 1000)] * 12)
    make_scheduler("best-of[kube-default,fgd]", SchedulerContext(train_pods=other_pool)).score(
        ClusterState(CLUSTER), p, np.arange(4))
    assert len(calls) == 16
    make_scheduler("best-of[fgd,kube-default]", SchedulerContext(train_pods=POOL)).score(
        ClusterState(CLUSTER), p, np.arange(4))
    assert len(calls) == 24  # the members in another order: another choice
