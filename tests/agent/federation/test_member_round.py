"""A member's round uploads what it learned this round (``W_local_new - start``), not its
personalisation offset from the global: honest members with different offsets send updates
that share the direction of their common learning, so the hub's direction check can tell a
sign-flipped one; sparse uploads send the whole change accumulated since the last upload."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.agent.federation.round import (
    Learned,
    Learner,
    MemberRunConfig,
    MemberState,
    RoundInfo,
    Weights,
    member_round,
)
from fedsched.common.federation.codec import personalised_mix

SHAPES = {"a": (4, 3), "b": (5,)}


class StepLearner(Learner):
    """Learns by adding a fixed step to its start (the round's learning, known exactly)."""

    def __init__(self, step: Weights, examples: int = 10) -> None:
        self.step, self.examples = step, examples

    def learn(self, start: Weights, global_w: Weights, state: MemberState, info: RoundInfo) -> Learned:
        return Learned({k: (start[k] + self.step[k]).astype(np.float32) for k in start}, self.examples, 0.0)


def _weights(seed: int, scale: float = 1.0) -> Weights:
    rng = np.random.default_rng(seed)
    return {k: (scale * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}


def _cosine(x: Weights, y: Weights) -> float:
    a = np.concatenate([v.ravel() for v in x.values()])
    b = np.concatenate([v.ravel() for v in y.values()])
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("eta", [0.0, 0.2, 0.5, 1.0])
def test_the_upload_is_the_rounds_learning_whatever_the_members_offset(tmp_path, eta):
    glob, step = _weights(0), _weights(1, 0.01)
    state = MemberState(tmp_path / "m")
    local = {k: glob[k] + _weights(2)[k] for k in glob}  # far from the global
    state.save("local", local)
    cfg = MemberRunConfig.from_run_config({"eta": eta})
    r = member_round(StepLearner(step), state, glob, cfg, RoundInfo(server_round=1, seed=0))
    assert r.upload and r.examples == 10
    for k in glob:
        np.testing.assert_allclose(r.delta[k], step[k], atol=1e-5)
        np.testing.assert_allclose(state.load("local")[k], personalised_mix(local, glob, eta)[k] + step[k],
                                   atol=1e-6)


def test_honest_members_with_opposite_offsets_upload_updates_that_share_a_direction(tmp_path):
    """Three members, offsets from the global that sum to about 0 (the global is their mean) and
    ten times their common learning step: their uploads point the same way."""
    glob, step = _weights(0), _weights(1, 0.05)
    offsets = [_weights(10 + i, 0.5) for i in range(3)]
    mean = {k: sum(o[k] for o in offsets) / 3 for k in glob}
    cfg = MemberRunConfig.from_run_config({"eta": 0.2})
    deltas = []
    for i, off in enumerate(offsets):
        state = MemberState(tmp_path / f"m{i}")
        state.save("local", {k: glob[k] + off[k] - mean[k] for k in glob})
        deltas.append(member_round(StepLearner(step), state, glob, cfg, RoundInfo(1, i)).delta)
    assert min(_cosine(d, e) for d in deltas for e in deltas) > 0.99


def test_a_sparse_upload_sends_everything_learned_since_the_last_one(tmp_path):
    glob, state = _weights(0), MemberState(tmp_path / "m")
    cfg = MemberRunConfig.from_run_config({"eta": 0.2, "upload-every": 2})
    steps = [_weights(1, 0.01), _weights(2, 0.01)]
    first = member_round(StepLearner(steps[0]), state, glob, cfg, RoundInfo(server_round=1, seed=0))
    assert not first.upload and first.examples == 0
    assert all(not v.any() for v in first.delta.values())
    second = member_round(StepLearner(steps[1]), state, glob, cfg, RoundInfo(server_round=2, seed=0))
    assert second.upload and second.examples == 10
    for k in glob:
        np.testing.assert_allclose(second.delta[k], steps[0][k] + steps[1][k], atol=1e-5)
    third = member_round(StepLearner(steps[0]), state, glob, cfg, RoundInfo(server_round=3, seed=0))
    assert not third.upload  # the accumulated change was reset by the upload
    assert all(np.allclose(v, steps[0][k], atol=1e-5) for k, v in state.load("pending").items())


@pytest.mark.parametrize(("validate", "reported"), [(1, True), (0, False)])
def test_a_member_validates_only_where_the_run_config_asks(tmp_path, validate, reported):
    """``validate = 0`` (a run whose validation scores nobody reads): the round reports NaN and
    replays no validation pods, not even kube-default's reference; its learning is the same."""
    from fedsched.agent.federation.learners import ReplayCreditLearner
    from fedsched.common.federation.members import member_cluster
    from fedsched.common.federation.weights import weights_of
    from fedsched.common.learning.nets import NodeScoringPolicy

    member = member_cluster(2, size="small")
    cfg = MemberRunConfig.from_run_config({"validate": validate, "local-decisions": 30,
                                           "scarce-decisions": 30, "local-epochs": 1})
    learner = ReplayCreditLearner.from_config(member, cfg)
    state = MemberState(tmp_path / member.name)
    r = member_round(learner, state, weights_of(NodeScoringPolicy()), cfg, RoundInfo(server_round=1, seed=3))
    assert r.upload and r.examples == 30
    assert np.isfinite(r.val_score) == reported
    assert (state.dir / "kube-validation.json").exists() == reported


@pytest.mark.parametrize("bad", [2, -1])
def test_a_bad_validate_value_is_refused(bad):
    from fedsched.agent.federation.learners import ReplayCreditLearner
    from fedsched.common.federation.members import member_cluster

    cfg = MemberRunConfig.from_run_config({"validate": bad})
    with pytest.raises(ValueError, match="validate must be 1 or 0"):
        ReplayCreditLearner.from_config(member_cluster(2, size="small"), cfg)
