"""best-of[...]: the member whose packing simulation of the pods on the cluster allocates most."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedsched.common.model.cluster import ClusterState
from fedsched.common.schedulers import SchedulerContext, make_scheduler
from fedsched.common.sim.packing import run_packing
from fedsched.common.sim.portfolio import SIM_TARGET_LOAD, BestOf, BestOfArgs, parse_name
from tests.common.schedulers.sched_testkit import nodes, pod_table, whole

# Four 2-GPU nodes; single-GPU pods and whole-node pods. Spreading the single-GPU pods (kube-default)
# leaves no node free for the 2-GPU pods; packing them (FGD) keeps nodes whole.
CLUSTER = nodes(cpu=[16000] * 4, gpu=[2] * 4)
POOL = pod_table([(2000, 1024, 1, 1000)] * 6 + [(4000, 2048, 2, 1000)] * 6)


@pytest.mark.parametrize(("name", "members", "seeds"), [
    ("best-of[fgd,kube-default]", ["fgd", "kube-default"], 2),
    ("best-of[ fgd , kube-default ;seeds=3]", ["fgd", "kube-default"], 3),
    ("best-of[lookahead[candidates=2,horizon=3]:fgd,best-fit,kube-default]",
     ["lookahead[candidates=2,horizon=3]:fgd", "best-fit", "kube-default"], 2),
])
def test_names_read_as_members_and_arguments(name, members, seeds):
    assert parse_name(name) == (members, BestOfArgs(seeds=seeds))


@pytest.mark.parametrize(("name", "msg"), [
    ("best-of[fgd]", "at least two"),
    ("best-of[fgd,]", "at least two"),
    ("best-of[fgd,fgd]", "named twice"),
    ("best-of[fgd,kube-default", "expected best-of["),
    ("best-of[fgd,kube-default;seeds=0]", "seeds"),
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


def simulated(member: str, seeds: int) -> float:
    """The benchmark's own packing runs of ``member`` on CLUSTER with POOL's pods, averaged."""
    out = []
    for s in range(seeds):
        sched = make_scheduler(member, SchedulerContext(train_pods=POOL, rng=np.random.default_rng(s)))
        out.append(run_packing(CLUSTER, POOL, sched, target_load=SIM_TARGET_LOAD, seed=s).alloc_pct[-1])
    return float(np.mean(out))


@pytest.mark.parametrize("order", [["kube-default", "fgd"], ["fgd", "kube-default"]])
def test_the_choice_is_the_member_whose_simulation_allocates_most_and_it_decides(order):
    sched = make_scheduler(f"best-of[{','.join(order)}]", SchedulerContext(train_pods=POOL))
    assert isinstance(sched, BestOf) and sched.chosen is None
    live = ClusterState(CLUSTER)
    p = whole(1, cpu=2000, mem=1024)
    scores = sched.score(live, p, np.arange(4))
    expected = {m: simulated(m, 2) for m in order}
    assert sched.simulated == pytest.approx(expected)
    assert expected["fgd"] > expected["kube-default"]  # the cluster is built so that packing pays
    assert sched.chosen == "fgd"
    fgd = make_scheduler("fgd", SchedulerContext(train_pods=POOL))
    live.allocate(0, p, (0,))
    np.testing.assert_array_equal(sched.score(live, p, np.arange(4)), fgd.score(live, p, np.arange(4)))
    assert sched.select_gpus(live, p, 0) == fgd.select_gpus(live, p, 0)
    assert len(scores) == 4


def test_equal_simulations_go_to_the_first_listed_member():
    one = nodes(cpu=[16000], gpu=[2])  # one node: every scheduler places alike
    for order in (["best-fit", "kube-default"], ["kube-default", "best-fit"]):
        sched = make_scheduler(f"best-of[{','.join(order)};seeds=1]", SchedulerContext(train_pods=POOL))
        sched.score(ClusterState(one), whole(1, cpu=2000, mem=1024), np.arange(1))
        assert len(set(sched.simulated.values())) == 1 and sched.chosen == order[0]


def test_each_node_table_is_simulated_once(monkeypatch):
    from fedsched.common.sim import portfolio

    calls = []
    real = portfolio.run_packing
    monkeypatch.setattr(portfolio, "run_packing",
                        lambda nodes_, *a, **k: calls.append(nodes_) or real(nodes_, *a, **k))
    sched = make_scheduler("best-of[kube-default,fgd;seeds=1]", SchedulerContext(train_pods=POOL))
    p = whole(1, cpu=2000, mem=1024)
    sched.score(ClusterState(CLUSTER), p, np.arange(4))
    sched.select_gpus(ClusterState(CLUSTER), p, 0)
    assert calls == [CLUSTER, CLUSTER] and sched.chosen == "fgd"  # two members, one seed, once
    one = nodes(cpu=[16000], gpu=[2])
    sched.score(ClusterState(one), p, np.arange(1))  # a changed table: simulated again
    assert calls[2:] == [one, one] and sched.chosen == "kube-default"  # equal on one node: first listed
