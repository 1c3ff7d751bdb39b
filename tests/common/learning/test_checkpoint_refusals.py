"""A malformed or non-finite checkpoint is refused at load with a CheckpointError naming the file
and what is wrong (issue 26, items 3 and 7), never a RuntimeError/KeyError/TypeError traceback."""

from __future__ import annotations

import pytest

from fedsched.common.learning.checkpoint import CheckpointError, load_checkpoint
from tests.checkpoint_support import CORRUPTIONS, NON_FINITE, write_corrupt, write_scaled


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_malformed_checkpoint_is_a_checkpoint_error_naming_file_and_fault(tmp_path, corruption):
    path = write_corrupt(tmp_path / "policy.pt", corruption)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert str(path) in msg and CORRUPTIONS[corruption][1] in msg, msg
    assert "\n" not in msg  # one log line
    if corruption in NON_FINITE:
        assert e.value.reason == "non_finite"
    else:
        assert e.value.reason == "malformed"


def test_a_valid_checkpoint_still_loads(tmp_path):
    policy, meta, _ = load_checkpoint(write_scaled(tmp_path / "policy.pt", 0.5))
    assert meta["kind"] == "node-scoring" and policy.cfg.hidden == 64
