"""The federation scores a member's weights one way everywhere: its collection, its validation,
the experiment's evaluation, the hub's central evaluation and the checkpoint a deployed member
serves all add the run's ``kube-weight`` times kube-default's score to the logits. Serving is
tested against the member's own replay twin, not a copy of it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsched.agent.federation.learners import ReplayCreditLearner, write_serving_checkpoint
from fedsched.agent.federation.round import MemberRunConfig
from fedsched.agent.federation.validation import replay_metrics, validation_rows
from fedsched.agent.serving.model_store import load_model
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.scoring import member_scheduler
from fedsched.common.federation.weights import weights_of
from fedsched.common.learning.checkpoint import load_checkpoint
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.coordinator.evaluation import OnlineCentralEvaluator
from fedsched.experiment.baselines import _replay
from fedsched.experiment.config import FederateConfig


@pytest.fixture(scope="module")
def member():
    return member_cluster(1, size="small")  # web: CPU only, kube-default's spread matters


@pytest.fixture(scope="module")
def weights():
    torch.manual_seed(11)
    return weights_of(NodeScoringPolicy())


def test_the_run_configs_weight_reaches_every_member_setting(member):
    cfg = MemberRunConfig.defaults()
    assert cfg.kube_weight == FederateConfig().kube_weight == 2.0
    assert FederateConfig(kube_weight=0.5).member_config(Path("x")).kube_weight == 0.5
    learner = ReplayCreditLearner.from_config(member, cfg)
    assert learner.kube_weight == 2.0


@pytest.mark.parametrize("kube_weight, scoring", [(2.0, {"kube_weight": 2.0}), (0.0, {})])
def test_the_served_checkpoint_replays_as_the_member_validated_it(member, weights, tmp_path, kube_weight,
                                                                  scoring):
    path = write_serving_checkpoint(tmp_path / "policy.pt", weights, 3, kube_weight=kube_weight)
    _, meta, _ = load_checkpoint(path)
    assert meta["scoring"] == scoring and meta["server_round"] == 3
    served = load_model(path).scheduler
    assert served.kube_weight == kube_weight
    np.testing.assert_equal(replay_metrics(member, served, member.val),  # NaN (no GPUs) equal to NaN
                            replay_metrics(member, member_scheduler(weights, kube_weight), member.val))


def test_the_weight_changes_what_validation_and_evaluation_see(member, weights, tmp_path):
    alone = validation_rows(member, weights, tmp_path, kube_weight=0.0)["policy"]
    mixed = validation_rows(member, weights, tmp_path, kube_weight=2.0)["policy"]
    assert mixed == {k: v for k, v in replay_metrics(member, member_scheduler(weights, 2.0),
                                                      member.val).items() if k in mixed}
    assert mixed != alone  # a random network's logits alone schedule otherwise
    # the experiment's evaluation replays: the same figures as the member's own scheduler
    got = _replay((1, "small", weights, 2024, "val", 2.0))
    assert {k: got[k] for k in mixed} == mixed


def test_the_hubs_central_evaluation_scores_with_the_weight(weights):
    plain = OnlineCentralEvaluator(profiles=2, size="small", workers=1)
    mixed = OnlineCentralEvaluator(profiles=2, size="small", workers=1, kube_weight=2.0)
    try:
        assert plain.refs == mixed.refs  # kube-default's reference does not depend on it
        a, b = plain(weights), mixed(weights)
        assert all(math.isfinite(v) for v in (*a.values(), *b.values()))
        assert a != b
    finally:
        plain.close()
        mixed.close()


@pytest.mark.parametrize("bad", [-1.0, math.nan, 1e7])
def test_a_bad_weight_is_refused_where_a_member_would_score_with_it(weights, bad):
    with pytest.raises(ValueError, match="kube_weight"):
        member_scheduler(weights, bad)
