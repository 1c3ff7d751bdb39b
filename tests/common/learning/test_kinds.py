"""The policy-kind registry: names, networks, adapters and checkpoints agree."""

from __future__ import annotations

import pytest

from fedsched.common.learning.checkpoint import load_checkpoint, save_checkpoint
from fedsched.common.learning.kinds import KINDS, NODE_SCORING, WEIGHTS, build, kind_of, policy_kind
from fedsched.common.learning.nets import NodeScoringPolicy, WeightPolicy
from fedsched.common.learning.scorers import SCORERS, PolicyScheduler, WeightScheduler, scorer_for


@pytest.mark.parametrize(("name", "net", "adapter"), [(NODE_SCORING, NodeScoringPolicy, PolicyScheduler),
                                                      (WEIGHTS, WeightPolicy, WeightScheduler)])
def test_each_kind_builds_its_net_and_adapter(name, net, adapter) -> None:
    policy = build(name, {"hidden": 16})
    assert isinstance(policy, net) and kind_of(policy) == name
    assert isinstance(scorer_for(policy, None), adapter)


def test_every_kind_has_an_adapter() -> None:
    assert set(SCORERS) == set(KINDS)


def test_unknown_kind_and_foreign_module_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown policy kind 'tree'"):
        policy_kind("tree")
    import torch

    with pytest.raises(ValueError, match="not a registered policy kind"):
        kind_of(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("name", [NODE_SCORING, WEIGHTS])
def test_checkpoint_keeps_the_kind(tmp_path, name) -> None:
    policy = build(name, {"hidden": 8})
    path = save_checkpoint(tmp_path / "p.pt", policy, algorithm="test", hyperparameters={}, typical=None,
                           data="x")
    loaded, meta, _ = load_checkpoint(path)
    assert meta["kind"] == name and kind_of(loaded) == name and loaded.cfg.hidden == 8
