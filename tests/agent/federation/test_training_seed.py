"""The run config's ``training-seed``: another value is another training run of the same
configuration (other replay windows, exploration and fits in every member's round, federated and
alone); seed 1 keeps the seeds every run had before there was one (the results of record)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedsched.agent.federation.round import (
    MAX_TRAINING_SEED,
    MemberRunConfig,
    MemberState,
    RoundInfo,
    member_round,
)


@pytest.mark.parametrize(("server_round", "partition", "training_seed", "seed"), [
    (1, 0, 1, 1000), (8, 4, 1, 8004), (3, 2, 1, 3002),  # seed 1: the seeds of record
    (1, 0, 2, 1_001_000), (8, 4, 3, 2_008_004),
    (1, 0, MAX_TRAINING_SEED, 3_999_001_000),
])
def test_a_rounds_seed(server_round, partition, training_seed, seed):
    info = RoundInfo.for_member(server_round, partition, training_seed=training_seed)
    assert info.seed == seed and info.seed < 2**32  # a valid numpy seed


def test_training_seeds_never_share_a_rounds_seed():
    """Any round up to 999 of any member up to partition 999: no two training seeds meet."""
    seen: set[int] = set()
    for ts in (1, 2, 3, MAX_TRAINING_SEED):
        seeds = {RoundInfo.for_member(r, p, training_seed=ts).seed
                 for r in range(1, 1000) for p in range(0, 1000, 7)}
        assert not seeds & seen
        seen |= seeds


@pytest.mark.parametrize("bad", [0, -1, MAX_TRAINING_SEED + 1, 2**40])
def test_a_training_seed_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="training-seed must be in"):
        RoundInfo.for_member(1, 0, training_seed=bad)


def test_the_run_configs_training_seed_reaches_the_member():
    assert MemberRunConfig.defaults().training_seed == 1
    assert MemberRunConfig.from_run_config({"training-seed": 7}).training_seed == 7


def test_another_training_seed_is_another_training_and_the_same_one_repeats(tmp_path):
    """A member's round (its replay window, exploration and fit) follows the training seed: two
    seeds learn different weights, the same seed the same weights bit for bit."""
    from fedsched.agent.federation.learners import ReplayCreditLearner
    from fedsched.common.federation.members import member_cluster
    from fedsched.common.federation.weights import weights_of
    from fedsched.common.learning.nets import NodeScoringPolicy

    member = member_cluster(2, size="small")
    cfg = MemberRunConfig.from_run_config({"validate": 0, "local-decisions": 30, "scarce-decisions": 30,
                                           "local-epochs": 1})
    learner = ReplayCreditLearner.from_config(member, cfg)
    start = weights_of(NodeScoringPolicy())

    def learned(ts: int, name: str):
        info = RoundInfo.for_member(1, 2, training_seed=ts)
        return member_round(learner, MemberState(tmp_path / name), start,
                            dataclasses.replace(cfg, training_seed=ts), info).delta

    one, again, two = learned(1, "a"), learned(1, "b"), learned(2, "c")
    assert all(np.array_equal(one[k], again[k]) for k in one)
    assert any(not np.allclose(one[k], two[k]) for k in one)
