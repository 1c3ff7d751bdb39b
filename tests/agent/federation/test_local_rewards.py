"""A member's local update learns from its own rewards, in deployment (its decision log's
outcomes) and in simulation (its replay twin's node credit): table-driven cases of the credit a
logged outcome earns, the kube-default tie computed from features, and a member whose log shows
that its choices of crowded nodes were followed by hot nodes moving away from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsched.agent.federation.learners import Experience, LogFinetuneLearner, ReplayCreditLearner, member_env
from fedsched.agent.federation.round import MemberRunConfig, MemberState, RoundInfo, member_round
from fedsched.agent.learning.bc import BCConfig, collect, fit
from fedsched.agent.learning.credit import log_credit, tie_from_features
from fedsched.agent.learning.env import EnvConfig, RewardConfig, SchedulingEnv
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.weights import load_weights, weights_of
from fedsched.common.learning.decision_log import DecisionLog
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import make_scheduler
from fedsched.common.schedulers.kube_default import KubeDefault
from tests.builders import crowded, log_with_outcomes


@pytest.mark.parametrize(("reward", "credit"), [
    ({"credit": -1.5, "tie": 0.9}, -1.5),  # a simulated member's experience: recorded exactly
    ({"credit": 0.2}, 0.0),  # a credit is never a gain
    ({"hot_s": 600.0, "oom": 0.0}, -1.0),  # ten hot minutes at node_hot 0.1
    ({"hot_s": 0.0, "oom": 2.0}, -4.0),  # two OOM kills at node_oom 2
    ({"oom": 1.0}, -2.0),  # no telemetry: hot_s unknown, the OOM kills still count
    ({"pending_s": 3.0, "cpu_util": 0.5}, None),  # no outcome of the node: not a sample
])
def test_the_credit_of_a_logged_outcome(reward, credit):
    assert log_credit(reward, RewardConfig()) == credit


def test_the_tie_from_features_is_kube_defaults_score():
    """The pessimism margin of a logged decision (features, no state) is kube-default's score to
    within a few points of its 50..200 range, on real feature rows."""
    nodes, pods = generate_cluster("web", seed=5, n_nodes=12, n_pods=300)
    env = SchedulingEnv(nodes, pods, config=EnvConfig(target_load=1.0), seed=0)
    env.reset()
    kube, errors = KubeDefault(), []
    for _ in range(150):
        pod, state, cand, feats = env.decision
        exact = np.asarray(kube.score(state, pod, cand), dtype=np.float64)
        assert len(feats.nodes) == len(cand)
        approx = 100.0 * tie_from_features(feats.nodes, feats.pod)
        errors.append(np.abs(exact - approx).max())
        _, _, term, trunc, _ = env.step(int(cand[int(np.argmax(exact))]))
        if term or trunc:
            break
    assert len(errors) == 150 and max(errors) < 4.0, max(errors)


def _share_on_crowded(policy: NodeScoringPolicy, records) -> float:
    from fedsched.agent.learning.bc import _batch

    mixed = [r for r in records if crowded(r.decision).any() and not crowded(r.decision).all()]
    assert len(mixed) > 50
    with torch.no_grad():
        nodes, pod, ctx, mask, _ = _batch([r.decision for r in mixed], np.arange(len(mixed)))
        logits, _ = policy(nodes, pod, ctx, mask)
    picks = logits.argmax(dim=1).numpy()
    return float(np.mean([crowded(r.decision)[p] for r, p in zip(mixed, picks, strict=True)]))


def test_a_member_whose_log_shows_bad_node_choices_moves_away_from_them(tmp_path):
    """The member packed (best-fit, its start policy imitates it): its log shows every pod put
    on a crowded node followed by 30 minutes of that node running hot. Its local update (the
    deployed ClientApp's, on the log's outcomes) stops choosing crowded nodes on decisions it
    has not seen."""
    nodes, pods = generate_cluster("web", seed=3, n_nodes=12, n_pods=500)
    log_with_outcomes(tmp_path / "log", nodes, pods, 400)
    _, held_out_pods = generate_cluster("web", seed=4, n_nodes=12, n_pods=500)
    held_out = DecisionLog(log_with_outcomes(tmp_path / "held-out", nodes, held_out_pods, 300).path)
    torch.manual_seed(0)
    start = NodeScoringPolicy()
    env = SchedulingEnv(nodes, pods, config=EnvConfig(target_load=1.0), seed=1)
    fit(start, collect([env], make_scheduler("best-fit"), 400), BCConfig(epochs=6, seed=0))
    start_w = weights_of(start)
    before = _share_on_crowded(start, held_out.tail_records(300))
    learner = LogFinetuneLearner(str(tmp_path / "log"), window=400, epochs=40, learning_rate=3e-3)
    learned = learner.learn(start_w, start_w, MemberState(tmp_path / "state"), RoundInfo(1, seed=0))
    new, used = learned.weights, learned.examples
    after_policy = NodeScoringPolicy()
    load_weights(after_policy, new)
    after = _share_on_crowded(after_policy.eval(), held_out.tail_records(300))
    assert used == 400
    assert before > 0.8 and after < 0.3, (before, after)


def test_a_log_without_outcomes_is_refused(tmp_path):
    nodes, pods = generate_cluster("web", seed=3, n_nodes=8, n_pods=80)
    env = SchedulingEnv(nodes, pods, config=EnvConfig(target_load=1.0), seed=0)
    log = DecisionLog(tmp_path / "log")
    for d in collect([env], make_scheduler("kube-default"), 30):
        log.append(d, int(d.best[0]), model_version="kube-default")
    log.flush()
    w = weights_of(NodeScoringPolicy())
    with pytest.raises(ValueError, match="known outcome"):
        LogFinetuneLearner(str(tmp_path / "log"), window=30, epochs=1, learning_rate=1e-3).learn(
            w, w, MemberState(tmp_path / "state"), RoundInfo(server_round=1, seed=0))


def test_a_simulated_members_round_learns_from_its_replay_twin_and_keeps_its_experience(tmp_path):
    """One online round on the edge member: decisions collected after the warm-up of a window of
    its own training pods, credited, kept in its experience log (on the member), the policy
    refit from the start, a finite validation score, the delta to upload."""
    member = member_cluster(2, size="small")
    env = member_env(member, seed=5, window=0.6)
    assert 50 <= len(env.pool) <= len(member.train)
    torch.manual_seed(0)
    glob = weights_of(NodeScoringPolicy())
    learner = ReplayCreditLearner(member, decisions=60, epochs=2)
    state = MemberState(tmp_path / member.name)
    cfg = MemberRunConfig.from_run_config({"eta": 0.2})
    r = member_round(learner, state, glob, cfg, RoundInfo(server_round=1, seed=7))
    assert r.examples == 60 and r.upload and math.isfinite(r.val_score) and r.mean_reward <= 0
    assert any(np.abs(v).max() > 0 for v in r.delta.values())
    assert len(Experience(state.dir)) == 60 and (state.dir / "kube-validation.json").exists()
    data = learner.collect(glob, seed=7)  # the same seed: the same decisions
    assert [c.credit for c in data] == [c.credit for c in Experience(state.dir).newest(60)]
