"""The paired comparison every verdict uses: differences seed by seed, their 95% interval and
verdict, the trouble score's log ratios, and what ``evaluate`` reports with it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.model.metrics import TROUBLE_SMOOTHING, mean_ci95, trouble_score
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.sim.evaluate import EvalSpec, evaluate
from fedsched.common.sim.paired import TROUBLE, log_ratios, paired_against, paired_difference, verdict

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
NO_DEADLINE = settings(deadline=None)  # the first example imports scipy; a loaded machine is slow


@NO_DEADLINE
@given(st.lists(finite, min_size=2, max_size=20), finite)
def test_a_constant_shift_is_found_exactly_whatever_the_seeds_spread(b: list[float], shift: float) -> None:
    a = [x + shift for x in b]
    out = paired_difference(a, b)
    assert out["n"] == len(b)
    assert out["mean"] == pytest.approx(shift, abs=1e-6 * (1 + max(map(abs, b))))
    assert out["ci95"] == pytest.approx(0.0, abs=1e-6 * (1 + max(map(abs, b))))
    assert out["values"] == [x - y for x, y in zip(a, b, strict=True)]


@NO_DEADLINE
@given(st.lists(st.tuples(finite, finite), min_size=2, max_size=20))
def test_the_interval_is_student_t_of_the_seed_differences(pairs: list[tuple[float, float]]) -> None:
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    out = paired_difference(a, b)
    mean, ci = mean_ci95([x - y for x, y in pairs])
    assert (out["mean"], out["ci95"]) == (mean, ci)
    assert out["verdict"] == ("better" if mean + ci < 0 else "worse" if mean - ci > 0 else "tie")


@pytest.mark.parametrize(("mean", "ci", "n", "lower", "want"), [
    (-1.0, 0.5, 5, True, "better"),
    (-1.0, 0.5, 5, False, "worse"),
    (1.0, 0.5, 5, True, "worse"),
    (1.0, 0.5, 5, False, "better"),
    (-0.4, 0.5, 5, True, "tie"),
    (-1.0, 1.0, 5, True, "tie"),  # an interval touching 0 does not exclude it
    (-1.0, 0.0, 1, True, "tie"),  # one seed: no interval, no verdict
    (math.nan, 0.1, 5, True, "tie"),
    (-1.0, math.nan, 5, True, "tie"),
])
def test_verdict(mean: float, ci: float, n: int, lower: bool, want: str) -> None:
    assert verdict(mean, ci, n, lower) == want


def test_paired_values_need_one_per_seed_on_both_sides() -> None:
    with pytest.raises(ValueError, match="one per seed"):
        paired_difference([1.0, 2.0], [1.0])


def test_one_seed_has_no_interval_and_no_verdict() -> None:
    out = paired_difference([5.0], [1.0])
    assert out["mean"] == 4.0 and math.isnan(out["ci95"]) and out["verdict"] == "tie" and out["n"] == 1


def test_seeds_with_a_missing_value_are_left_out_of_the_interval() -> None:
    out = paired_difference([1.0, math.nan, 3.0, 4.0], [0.0, 1.0, 1.0, 1.0])
    assert out["n"] == 3 and out["mean"] == pytest.approx(2.0)
    assert math.isnan(out["values"][1])


@NO_DEADLINE
@given(st.fixed_dictionaries({m: st.floats(0, 1e7) for m in TROUBLE_SMOOTHING}),
       st.fixed_dictionaries({m: st.floats(0, 1e7) for m in TROUBLE_SMOOTHING}))
def test_the_trouble_score_is_the_mean_of_the_log_ratios(p: dict[str, float], r: dict[str, float]) -> None:
    ratios = log_ratios(p, r)
    assert set(ratios) == set(TROUBLE_SMOOTHING)
    assert float(np.mean(list(ratios.values()))) == trouble_score(p, r)
    assert all(v == 0.0 for v in log_ratios(p, p).values())


def test_paired_against_takes_each_seed_against_the_same_seed_of_the_reference() -> None:
    ref = {"1": {**dict.fromkeys(TROUBLE_SMOOTHING, 10.0), "util_mean": 50.0},
           "2": {**dict.fromkeys(TROUBLE_SMOOTHING, 1000.0), "util_mean": 60.0}}
    # twice the reference's trouble on every seed, however far apart the seeds are
    pol = {s: {m: (2 * v + TROUBLE_SMOOTHING[m] if m in TROUBLE_SMOOTHING else v + 1.0) for m, v in r.items()}
           for s, r in ref.items()}
    out = paired_against({"kube-default": ref, "p": pol, "only-3": {"3": ref["1"]}}, "kube-default")
    assert set(out) == {"p", "only-3"}
    p = out["p"]
    assert p["seeds"] == ["1", "2"]
    assert p[TROUBLE]["values"] == pytest.approx([math.log(2)] * 2)
    assert p[TROUBLE]["verdict"] == "worse" and p[TROUBLE]["ci95"] == pytest.approx(0.0, abs=1e-12)
    assert p["log_ratio"]["hot_cpu_node_s"]["mean"] == pytest.approx(math.log(2))
    assert p["diff"]["util_mean"]["mean"] == pytest.approx(1.0)
    assert p["diff"]["util_mean"]["verdict"] == "better"  # higher utilisation is better
    assert out["only-3"][TROUBLE]["n"] == 0 and out["only-3"][TROUBLE]["verdict"] == "tie"
    with pytest.raises(ValueError, match="reference"):
        paired_against({"p": pol}, "kube-default")


def test_evaluate_reports_every_policy_paired_against_kube_default_seed_by_seed() -> None:
    nodes, pods = generate_cluster("web", 7, n_nodes=4, n_pods=2000, trace_hours=4.0)
    spec = EvalSpec(nodes=nodes, pods=pods, policies=["kube-default", "prefer-hot"], seeds=[1, 2, 3],
                    mode="replay", replay_options={"target_load": 0.8, "allow_unreachable_load": True})
    res = evaluate(spec, jobs=1)
    assert res["reference"] == "kube-default" and set(res["paired"]) == {"prefer-hot"}
    runs, got = res["runs"], res["paired"]["prefer-hot"]
    want = [trouble_score(runs["prefer-hot"][s], runs["kube-default"][s]) for s in ("1", "2", "3")]
    assert got[TROUBLE]["values"] == want
    assert (got[TROUBLE]["mean"], got[TROUBLE]["ci95"]) == mean_ci95(want)
    hot = got["diff"]["hot_cpu_node_s"]["values"]
    assert hot == [runs["prefer-hot"][s]["hot_cpu_node_s"] - runs["kube-default"][s]["hot_cpu_node_s"]
                   for s in ("1", "2", "3")]
