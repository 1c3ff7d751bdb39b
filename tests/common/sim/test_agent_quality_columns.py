"""``bench/agent_quality.py``'s column arguments: a label, a checkpoint, a shipped name or a
decision-time search with or without arguments (whose ``=`` signs are not a label's)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.paths import REPO

if str(REPO / "bench") not in sys.path:  # the benchmark imports its harness as the script would
    sys.path.insert(0, str(REPO / "bench"))
_spec = importlib.util.spec_from_file_location("bench_agent_quality", REPO / "bench" / "agent_quality.py")
assert _spec is not None and _spec.loader is not None
agent_quality = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agent_quality)


@pytest.mark.parametrize("arg,expected", [
    ("runs/a/checkpoint.pt", ("checkpoint", "runs/a/checkpoint.pt")),
    ("mine=runs/a/checkpoint.pt", ("mine", "runs/a/checkpoint.pt")),
    ("learned", ("learned", "learned")),
    ("lookahead:fgd", ("lookahead:fgd", "lookahead:fgd")),
    ("lookahead[candidates=8,futures=2]:fgd",
     ("lookahead[candidates=8,futures=2]:fgd", "lookahead[candidates=8,futures=2]:fgd")),
    ("wide=lookahead[candidates=8]:fgd", ("wide", "lookahead[candidates=8]:fgd")),
])
def test_columns(arg, expected):
    assert agent_quality.parse_policy(arg) == expected
