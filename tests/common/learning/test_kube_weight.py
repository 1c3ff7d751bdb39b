"""A node-scoring policy with kube-default beside it (``PolicyScheduler.kube_weight``): the
score is the logits plus the weight times kube-default's score / 100 on every path that scores
with a checkpoint (the benchmarks' resolver, the serving model store), and a checkpoint's
scoring options are refused, naming the fault, when they are not the adapter's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsched.agent.serving.model_store import load_model
from fedsched.common.learning.checkpoint import CheckpointError, save_checkpoint
from fedsched.common.learning.kinds import NODE_SCORING, WEIGHTS
from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig
from fedsched.common.learning.scorers import SCORING_KEY, PolicyScheduler, scoring_options
from fedsched.common.model.cluster import Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import make_scheduler
from fedsched.common.schedulers.base import rank
from fedsched.common.schedulers.kube_default import kube_default_scores
from tests.builders import first_fit_state


@pytest.fixture(scope="module")
def decision():
    """A web cluster half filled (first fit) and the next pods with their feasible nodes."""
    nodes, pods = generate_cluster("web", 5, n_nodes=24, n_pods=200)
    state = first_fit_state(nodes, pods, 100)
    asks = [(pod, np.flatnonzero(state.feasible(pod))) for pod in (Pod.from_table(pods, i)
                                                                   for i in range(100, 130))]
    return state, [(p, c) for p, c in asks if len(c) > 1], TypicalPods.from_pods(pods)


def _policy(seed: int = 0) -> NodeScoringPolicy:
    torch.manual_seed(seed)
    return NodeScoringPolicy(PolicyConfig(hidden=16)).eval()


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0, 7.5])
def test_the_score_is_the_logits_plus_the_weighted_kube_default_score(decision, weight):
    state, asks, typical = decision
    plain = PolicyScheduler(_policy(), typical)
    mixed = PolicyScheduler(_policy(), typical, kube_weight=weight)
    for pod, cand in asks:
        expected = plain.score(state, pod, cand) + weight * kube_default_scores(state, pod, cand) / 100.0
        np.testing.assert_allclose(mixed.score(state, pod, cand), expected, rtol=0, atol=1e-9)


def test_a_large_weight_chooses_as_kube_default_and_none_as_the_policy(decision):
    state, asks, typical = decision
    big = PolicyScheduler(_policy(), typical, kube_weight=1e6)
    none = PolicyScheduler(_policy(), typical)
    varied = 0
    for pod, cand in asks:
        kd = kube_default_scores(state, pod, cand)
        varied += int(kd.min() < kd.max())
        assert kd[int(np.argmax(big.score(state, pod, cand)))] == kd.max()  # one of kube-default's best
        logits = none.score(state, pod, cand)
        np.testing.assert_array_equal(logits, none.logits(none.last_features.nodes, none.last_features.pod,
                                                          none.last_features.context).astype(np.float64))
    assert varied >= 5  # the fixture's decisions do tell nodes apart by kube-default's score


@pytest.mark.parametrize("weight", [-0.1, math.nan, math.inf, 1e308])
def test_a_bad_weight_is_refused(decision, weight):
    with pytest.raises(ValueError, match=r"kube_weight must be a number in \[0, 1e\+06\]"):
        PolicyScheduler(_policy(), decision[2], kube_weight=weight)


_RANGE = r"kube_weight must be a number in \[0, 1e\+06\]"


@pytest.mark.parametrize(("meta", "kind", "fault"), [
    ({SCORING_KEY: {"kube_weight": -1}}, NODE_SCORING, _RANGE + ", got -1$"),
    ({SCORING_KEY: {"kube_weight": float("nan")}}, NODE_SCORING, "kube_weight must be a number in"),
    ({SCORING_KEY: {"kube_weight": 1e308}}, NODE_SCORING, "got 1e\\+308"),
    ({SCORING_KEY: {"kube_weight": "1"}}, NODE_SCORING, "got '1'"),
    ({SCORING_KEY: {"kube_weight": True}}, NODE_SCORING, "got True"),
    ({SCORING_KEY: {"kube_wieght": 1.0}}, NODE_SCORING, "'kube_wieght' not an option of a node-scoring"),
    ({SCORING_KEY: {"kube_weight": 1.0}}, WEIGHTS, "not an option of a weights policy \\(options: none\\)"),
    ({SCORING_KEY: [1.0]}, NODE_SCORING, "expected a mapping of options, got list"),
])
def test_scoring_options_that_are_not_the_adapters_are_refused(meta, kind, fault):
    with pytest.raises(ValueError, match=fault):
        scoring_options(meta, kind)


def test_scoring_options_default_to_none_and_pass_a_valid_weight():
    assert scoring_options({}, NODE_SCORING) == {} and scoring_options({SCORING_KEY: None}, WEIGHTS) == {}
    assert scoring_options({SCORING_KEY: {"kube_weight": 2}}, NODE_SCORING) == {"kube_weight": 2.0}


def test_a_checkpoint_is_scored_with_its_weight_by_the_benchmarks_and_by_serving(decision, tmp_path):
    state, asks, typical = decision
    policy = _policy(4)
    path = save_checkpoint(tmp_path / "mixed.pt", policy, algorithm="credit", hyperparameters={},
                           typical=typical, data="test", extra={SCORING_KEY: {"kube_weight": 1.5}})
    resolved = make_scheduler(str(path))
    served = load_model(path).scheduler
    direct = PolicyScheduler(policy, typical, kube_weight=1.5)
    assert resolved.kube_weight == served.kube_weight == 1.5
    rng = np.random.default_rng(0)
    for pod, cand in asks:
        expected = direct.score(state, pod, cand)
        np.testing.assert_allclose(resolved.score(state, pod, cand), expected, rtol=0, atol=1e-9)
        np.testing.assert_allclose(served.score(state, pod, cand), expected, rtol=0, atol=1e-6)
        # the ranking the extender and the decision service answer with is over that sum
        chosen = rank(served, state, pod, rng, candidates=cand).node
        assert expected[int(np.flatnonzero(cand == chosen)[0])] == pytest.approx(expected.max(), abs=1e-6)
    bad = save_checkpoint(tmp_path / "bad.pt", policy, algorithm="credit", hyperparameters={},
                          typical=typical, data="test", extra={SCORING_KEY: {"kube_weight": -2}})
    with pytest.raises(CheckpointError, match=r"cannot be served .*kube_weight must be a number in"):
        load_model(bad)
    with pytest.raises(ValueError, match="kube_weight must be a number in"):
        make_scheduler(str(bad))
