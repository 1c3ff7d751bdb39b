"""A member's validation score: its kube-default reference is one replay, computed once per
state directory and read back after that, and the score is the trouble score of the policy's
replay against that reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedsched.agent.federation import validation
from fedsched.agent.learning.online import VALIDATION_METRICS
from fedsched.common.federation.members import member_cluster, reference_typical
from fedsched.common.federation.scoring import policy_of
from fedsched.common.federation.weights import weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.metrics import trouble_score
from fedsched.common.schedulers import SchedulerContext
from fedsched.common.sim.evaluate import make_policy


@pytest.fixture(scope="module")
def member():
    return member_cluster(2, size="small")


def test_kube_default_is_replayed_once_per_state_directory(member, tmp_path, monkeypatch):
    calls = []
    real = validation.replay_metrics

    def counted(m, scheduler, pods, seed=validation.VALIDATION_SEED):
        calls.append(type(scheduler).__name__)
        return real(m, scheduler, pods, seed)

    monkeypatch.setattr(validation, "replay_metrics", counted)
    weights = weights_of(NodeScoringPolicy())
    first = validation.validation_score(member, weights, tmp_path)
    # one replay of kube-default (it was one per metric) and one of the policy
    assert sorted(calls) == sorted(["KubeDefault", "PolicyScheduler"])
    calls.clear()
    assert validation.validation_score(member, weights, tmp_path) == first
    assert calls == ["PolicyScheduler"]  # the reference read back from the state directory
    kept = json.loads((tmp_path / "kube-validation.json").read_text())
    assert sorted(kept) == sorted(VALIDATION_METRICS)


def test_the_score_is_the_policys_trouble_against_kube_default(member, tmp_path):
    weights = weights_of(NodeScoringPolicy())
    kube = make_policy("kube-default", SchedulerContext(rng=np.random.default_rng(0)), "replay")
    ref = validation.replay_metrics(member, kube, member.val)
    policy = PolicyScheduler(policy_of(weights), reference_typical())
    got = validation.replay_metrics(member, policy, member.val)
    rows = validation.validation_rows(member, weights, tmp_path)
    assert rows["kube-default"] == {m: ref[m] for m in VALIDATION_METRICS}
    assert rows["policy"] == {m: got[m] for m in VALIDATION_METRICS}
    assert validation.validation_score(member, weights, tmp_path) == trouble_score(rows["policy"],
                                                                                  rows["kube-default"])
