"""``bench/federation.py``: which runs ``--only`` selects and how the start is named (the shipped
start is reported as the main job reports it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from fedsched.experiment.config import FederateConfig

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_federation", REPO / "bench" / "federation.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.path.insert(0, str(REPO / "bench"))  # the benchmark imports its harness package from there
try:
    _spec.loader.exec_module(bench)
finally:
    sys.path.remove(str(REPO / "bench"))

PLAN = [("clean", "fedavg", {}), ("poison-huge", "fedavg", {"poison-kind": "huge"}),
        ("poison-flip", "fedavg", {"poison-kind": "flip"}), ("flip-krum", "krum", {"poison-kind": "flip"})]


@pytest.mark.parametrize(("only", "names"), [
    (set(), ["clean", "poison-huge", "poison-flip", "flip-krum"]),
    ({"clean"}, ["clean"]),
    ({"flip-krum", "clean"}, ["clean", "flip-krum"]),  # the plan's order, not the flag's
    ({"clean", "hub-kill"}, ["clean"]),  # hub-kill runs after the plan
])
def test_only_selects_runs_in_the_plans_order(only, names):
    assert [name for name, _, _ in bench.select_runs(PLAN, only)] == names


@pytest.mark.parametrize(("only", "message"), [
    ({"poison-flip"}, "clean is missing"),
    ({"clean", "poison-flipp"}, "unknown run(s) poison-flipp"),
    ({"clean", "Clean", "x"}, "unknown run(s) Clean, x"),
])
def test_only_refuses_unknown_runs_and_a_missing_reference(only, message):
    with pytest.raises(ValueError) as err:
        bench.select_runs(PLAN, only)
    assert message in str(err.value) and "poison-huge, poison-flip, flip-krum and hub-kill" in str(err.value)


@pytest.mark.parametrize(("init", "label"), [("random", "random start"), ("shipped", "shipped start")])
def test_the_start_is_named_as_the_main_job_names_it(init, label):
    assert bench.start_label(FederateConfig(init=init)) == label
