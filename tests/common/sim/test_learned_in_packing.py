"""``learned`` in a packing evaluation (``fedsched evaluate``, the packing table) is, of the shipped
model and FGD, the one the packing simulation of the statistics pods on the cluster proves
allocating more than kube-default with the highest mean, and kube-default where neither is proven
(what the served packing check does); in replay mode it is the model alone."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.schedulers import LEARNED, SchedulerContext, default_policy_path
from fedsched.common.sim import portfolio
from fedsched.common.sim.evaluate import EvalSpec, evaluate, format_table, make_policy, run_one
from fedsched.common.sim.portfolio import BestOf, forget_simulations
from tests.common.schedulers.sched_testkit import nodes, pod_table

# Four 2-GPU nodes, single-GPU and whole-node pods: kube-default's spreading strands the 2-GPU
# pods, the shipped model packs (tests/agent/serving/test_packing_check.py: proven better).
CLUSTER = nodes(cpu=[16000] * 4, gpu=[2] * 4)
PODS = pod_table([(2000, 1024, 1, 1000)] * 6 + [(4000, 2048, 2, 1000)] * 6)
SEEDS = [42, 43, 44]


@pytest.fixture(autouse=True)
def _fresh_figures():
    forget_simulations()
    yield
    forget_simulations()


def spec() -> EvalSpec:
    return EvalSpec(nodes=CLUSTER, pods=PODS, policies=[], seeds=SEEDS, test_fraction=None)


def runs(policy: str) -> list[dict[str, float | None]]:
    """Each seed's metrics (NaN, a metric packing mode does not measure, as None: comparable)."""
    return [{k: None if v != v else v for k, v in run_one(spec(), policy, s).metrics.items()} for s in SEEDS]


def test_learned_is_the_choice_in_packing_mode_and_the_model_in_replay_mode():
    ctx = SchedulerContext(train_pods=PODS)
    packing = make_policy(LEARNED, ctx, "packing")
    assert isinstance(packing, BestOf) and packing.name == LEARNED
    assert packing.members == ["kube-default", LEARNED, "fgd"]
    assert isinstance(make_policy(LEARNED, ctx, "replay"), PolicyScheduler)
    assert not isinstance(make_policy(str(default_policy_path()), ctx, "packing"), BestOf)


def test_where_the_model_is_proven_better_learned_runs_are_the_models():
    model = runs(str(default_policy_path()))
    assert runs(LEARNED) == model
    assert any(m != k for m, k in zip(model, runs("kube-default"), strict=True))  # the choice mattered


def test_the_evaluation_reports_the_choice():
    """``fedsched evaluate`` says what ``learned`` was on the cluster, with the simulated figures."""
    s = spec()
    s.policies = [LEARNED, "kube-default"]
    result = evaluate(s, jobs=1)
    choices = result["choices"]
    assert list(choices) == [LEARNED] and set(choices[LEARNED]) == {str(x) for x in SEEDS}
    assert {c["chosen"] for c in choices[LEARNED].values()} == {LEARNED}
    sims = choices[LEARNED][str(SEEDS[0])]["simulated"]
    assert set(sims) == {"kube-default", LEARNED, "fgd"} and sims[LEARNED] > sims["kube-default"]
    assert f"{LEARNED}: the packing simulation of the statistics pods on this cluster chose {LEARNED} " \
        f"(simulated allocation: kube-default {sims['kube-default']:.2f}%" in format_table(result)


def test_where_it_is_not_learned_runs_are_kube_defaults(monkeypatch):
    """The same cluster, with the simulation's figures replaced by a CPU-bound inventory's (the
    model below kube-default on every workload): every decision is kube-default's."""
    def cpu_bound(_nodes, _pool, make, seeds):
        name = make(SchedulerContext(train_pods=PODS)).name
        return [79.6 + 0.1 * s if name == "kube-default" else 76.7 + 0.1 * s for s in range(seeds)]

    monkeypatch.setattr(portfolio, "simulated_allocations", cpu_bound)
    kube = runs("kube-default")
    assert runs(LEARNED) == kube
    assert runs(str(default_policy_path())) != kube
    assert np.isfinite([m["alloc_gpu"] for m in kube]).all()


def test_where_fgd_packs_the_most_learned_runs_are_fgds(monkeypatch):
    """The simulation's figures replaced by a CPU-heavy workload's (the model proven above
    kube-default, FGD proven and higher): every decision is FGD's."""
    def cpu_heavy(_nodes, _pool, make, seeds):
        name = make(SchedulerContext(train_pods=PODS)).name
        base = {"kube-default": 91.2, "fgd": 94.5}.get(name, 92.2)
        return [base + 0.1 * s for s in range(seeds)]

    monkeypatch.setattr(portfolio, "simulated_allocations", cpu_heavy)
    chooser = make_policy(LEARNED, SchedulerContext(train_pods=PODS), "packing")
    assert isinstance(chooser, BestOf)
    chooser._choose(CLUSTER)
    assert chooser.chosen == "fgd" and chooser.simulated["fgd"] > chooser.simulated[LEARNED]
    fgd = runs("fgd")
    assert runs(LEARNED) == fgd and fgd != runs("kube-default")
