"""The main job's verdicts and goals, per member, from seed-by-seed runs (no Flower run needed):
a data-scarce member must beat local-only by 0.10 with the interval clear of it, a rich member
must be not worse than local-only (one-sided 95%) and better than kube-default, the late member
must reach local-only's final validation score within a third of the rounds."""

from __future__ import annotations

import pytest

from fedsched.experiment.baselines import SCARCE_MARGIN, fleet_verdicts, verdicts
from fedsched.experiment.config import FederateConfig

CFG = FederateConfig(rounds=6, eta=0.2)
NOISE = (0.02, -0.02, 0.01, -0.01, 0.0, 0.015, -0.015, 0.005)  # small seed-to-seed spread


def runs(trouble: list[float], failed: float = 100.0) -> dict:
    return {"runs": {"trouble_score": list(trouble), "failed_pods": [failed] * len(trouble)}}


def report(pers: float, local: float, kube: float = 0.0, *, start: float = 1.0, scarce: bool = False,
           late: bool = False, federated_val: list[float] | None = None,
           local_val: list[float] | None = None) -> dict:
    """One member whose personalised model, local-only, kube-default and the random start score
    ``pers``, ``local``, ``kube`` and ``start`` on every seed, plus a little noise."""
    pols = {"personalised eta=0.2": runs([pers + n for n in NOISE]),
            "local-only": runs([local - n for n in NOISE]),
            "kube-default": runs([kube for _ in NOISE]),
            "random start": runs([start + 2 * n for n in NOISE])}
    info = {"scarce": scarce, "late": late, "joins_at": 3 if late else 1,
            "federated_val": federated_val or [0.0] * CFG.rounds,
            "local_only_val": local_val or [0.0] * CFG.rounds}
    return {"clusters": {"m": pols}, "members": {"m": info}}


@pytest.mark.parametrize(("pers", "local", "met"), [
    (-0.30, 0.0, True),     # 0.30 better, interval narrow: clear of 0.10
    (-0.09, 0.0, False),    # better than local-only, clear of 0, but not by 0.10
    (0.0, 0.0, False),      # a tie
    (0.20, 0.0, False),     # worse
])
def test_a_scarce_member_must_beat_local_only_by_the_margin(pers, local, met) -> None:
    goals = verdicts(report(pers, local, kube=1.0, scarce=True), CFG)["m"]["goals"]
    assert goals[f"beats local-only by {SCARCE_MARGIN:g} (scarce member)"] is met
    assert not any("rich member" in g for g in goals)


@pytest.mark.parametrize(("pers", "local", "kube", "not_worse", "beats_kube"), [
    (-0.30, -0.30, 0.0, True, True),    # as good as local-only, better than kube-default
    (-0.20, -0.30, 0.0, False, True),   # 0.10 worse than local-only with a narrow interval: worse
    (0.00, 0.00, 0.0, True, False),     # a tie with both
    (0.30, 0.40, 0.0, True, False),     # better than local-only, worse than kube-default
])
def test_a_rich_member_must_be_not_worse_than_local_only_and_better_than_kube_default(
        pers, local, kube, not_worse, beats_kube) -> None:
    goals = verdicts(report(pers, local, kube), CFG)["m"]["goals"]
    assert goals["not worse than local-only, one-sided 95% (rich member)"] is not_worse
    assert goals["better than kube-default (rich member)"] is beats_kube


@pytest.mark.parametrize(("local", "start", "learned"), [(0.2, 1.0, True), (1.0, 1.0, False),
                                                         (1.3, 1.0, False)])
def test_a_rich_members_budget_must_let_learning_alone_learn(local, start, learned) -> None:
    v = verdicts(report(0.0, local, start=start), CFG)["m"]
    assert v["local-only against its start"]["mean"] == pytest.approx(local - start, abs=0.01)
    assert v["goals"]["local-only better than its start (rich member)"] is learned
    assert "local-only against its start" not in {k for k in v if " vs " in k}  # not a verdict on the model


@pytest.mark.parametrize(("federated_val", "reached", "met"), [
    ([9, 9, 0.5, -0.1, -0.2, -0.3], 2, True),   # joins at 3, at local-only's final -0.1 in its 2nd round
    ([9, 9, 0.5, 0.4, 0.3, 0.2], None, False),  # never
    ([9, 9, 0.5, 0.4, -0.1, -0.2], 3, False),   # in its 3rd round: more than a third of 6
])
def test_the_late_member_must_reach_local_only_within_a_third_of_the_rounds(federated_val, reached,
                                                                            met) -> None:
    local_val = [0.5, 0.3, 0.2, 0.1, 0.0, -0.1]
    v = verdicts(report(0.0, 0.0, late=True, federated_val=federated_val, local_val=local_val), CFG)["m"]
    assert v["rounds_to_local_only"] == reached and v["rounds_budget"] == 2
    assert v["goals"]["reaches local-only within a third of the rounds (late member)"] is met


def test_across_the_members_each_seed_is_the_mean_over_the_members() -> None:
    """Two members on the same three seeds: the fleet's per-seed difference is the mean of theirs,
    paired over the seeds; FedProx against FedAvg only when both ran."""
    def member(pers: list[float], local: list[float]) -> dict:
        return {"personalised eta=0.2": runs(pers), "local-only": runs(local),
                "kube-default": runs([0.0] * 3)}
    rep = {"clusters": {"a": member([0.1, 0.2, 0.3], [0.3, 0.3, 0.3]),
                        "b": member([-0.5, 0.0, 0.1], [0.1, 0.2, 0.1])}}
    fleet = fleet_verdicts(rep, CFG)
    d = fleet["trouble_score personalised eta=0.2 vs local-only"]
    assert d["values"] == pytest.approx([(-0.2 - 0.6) / 2, (-0.1 - 0.2) / 2, (0.0 + 0.0) / 2]) and d["n"] == 3
    assert set(fleet) == {"trouble_score personalised eta=0.2 vs local-only",
                          "trouble_score personalised eta=0.2 vs kube-default",
                          "trouble_score local-only vs kube-default"}  # CFG runs FedAvg and FedProx, but
    # the report has no global models: a comparison a member lacks is left out
