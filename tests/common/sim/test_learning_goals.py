"""The online benchmark's goals for a learned policy (``bench/online_quality.py``,
``learning_goals``): paired against the scenario's best heuristic on the same seeds, with the
guardrails against kube-default."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.sim.paired import paired_against
from tests.paths import bench_module


@pytest.fixture(scope="module")
def oq():
    with bench_module("online_quality") as module:
        yield module


def _runs(factors: dict[str, dict[str, float]], seeds: int = 8) -> dict:
    """Per policy and seed, kube-default's figures times the policy's factor per metric, with
    a per-seed common level (paired seeds share it) and a little noise."""
    rng = np.random.default_rng(3)
    base = {"hot_cpu_node_s": 100_000.0, "throttled_cpu_core_s": 50_000.0, "oom_kills_per_1k_starts": 4.0,
            "failed_pods": 200.0, "failed_cpu_cores": 300.0, "failed_gpus": 0.0, "pending_p99_s": 100.0}
    levels = rng.uniform(0.5, 2.0, seeds)
    runs: dict = {}
    for p, f in factors.items():
        runs[p] = {str(s): {m: v * levels[s] * f.get(m, 1.0) * rng.uniform(0.99, 1.01)
                            for m, v in base.items()} for s in range(seeds)}
    return runs


def _result(runs: dict) -> dict:
    return {"runs": runs, "reference": "kube-default", "paired": paired_against(runs, "kube-default")}


def test_a_policy_clearly_below_the_best_heuristic_meets_the_goals(oq):
    res = _result(_runs({"kube-default": {}, "target-load-packing": {"hot_cpu_node_s": 0.7},
                         "load-variation-risk-balancing": {"hot_cpu_node_s": 1.2},
                         "learned-online": {"hot_cpu_node_s": 0.35, "throttled_cpu_core_s": 0.8}}))
    goals = oq.learning_goals(res)
    assert goals["best_heuristic"] == "target-load-packing"
    g = goals["policies"]["learned-online"]
    assert g["trouble_goal_met"] and g["hot_goal_met"] and g["guardrails_worse"] == []
    assert g["hot_ratio_vs_best"] == pytest.approx(0.5, rel=0.03)
    assert set(goals["policies"]) == {"learned-online"}  # heuristics are not judged against themselves


def test_kube_default_is_the_bar_when_every_heuristic_is_worse(oq):
    res = _result(_runs({"kube-default": {}, "target-load-packing": {"throttled_cpu_core_s": 3.0},
                         "learned-online": {"hot_cpu_node_s": 0.95}}))
    goals = oq.learning_goals(res)
    assert goals["best_heuristic"] == "kube-default"
    g = goals["policies"]["learned-online"]
    assert not g["trouble_goal_met"] and not g["hot_goal_met"]  # -0.013 on the score, 0.95x hot


def test_a_policy_that_buys_its_score_with_oom_kills_fails_a_guardrail(oq):
    res = _result(_runs({"kube-default": {}, "learned-online": {"hot_cpu_node_s": 0.2,
                                                                "oom_kills_per_1k_starts": 1.5,
                                                                "pending_p99_s": 1.3}}))
    g = oq.learning_goals(res)["policies"]["learned-online"]
    assert g["trouble_goal_met"]
    assert g["guardrails_worse"] == ["oom_kills_per_1k_starts", "pending_p99_s"]
    assert "WORSE: oom_kills_per_1k_starts, pending_p99_s" in oq.goals_table(oq.learning_goals(res))


def test_failed_pods_count_beside_what_they_requested(oq):
    """A policy that lets large pods in fails more pods and fewer requested cores: the count's
    guardrail says worse, and the requested cores are printed beside it (not a guardrail)."""
    res = _result(_runs({"kube-default": {}, "learned-online": {"hot_cpu_node_s": 0.8, "failed_pods": 1.05,
                                                                "failed_cpu_cores": 0.95}}))
    g = oq.learning_goals(res)["policies"]["learned-online"]
    assert g["guardrails_worse"] == ["failed_pods"]
    assert g["failed_requests"]["failed_cpu_cores"]["verdict"] == "better"
    assert g["failed_requests"]["failed_cpu_cores"]["mean"] < 0
    line = oq.goals_table(oq.learning_goals(res))
    assert "WORSE: failed_pods; failed_cpu_cores -" in line and "(better)" in line
    assert "failed_gpus" not in line  # nothing requested GPUs: not printed
