"""The hub's online central evaluation: the same scores whether its replays run in the hub's
process or in worker processes, and ``central-workers`` read strictly."""

from __future__ import annotations

import math

import pytest

from fedsched.coordinator.evaluation import OnlineCentralEvaluator, central_worker_count
from fedsched.coordinator.server_app import central_workers, initial_weights


def test_worker_processes_give_the_scores_of_the_hubs_own_process():
    weights = initial_weights("random", 3, "online")
    alone = OnlineCentralEvaluator(profiles=3, size="small", workers=1)
    pooled = OnlineCentralEvaluator(profiles=3, size="small", workers=2)
    try:
        assert pooled._pool is not None and alone._pool is None
        assert pooled.refs == alone.refs
        got, want = pooled(weights), alone(weights)
        assert got == want
        assert set(got) == {"trouble_score", *(f"trouble_score_{n}" for n in alone.names)}
        assert all(math.isfinite(v) for v in got.values())
    finally:
        pooled.close()
    assert pooled._pool is None
    pooled.close()  # a second close does nothing


@pytest.mark.parametrize("workers, size, cpus, want", [
    ("auto", "full", 8, 2), ("auto", "full", 1, 1), ("auto", "small", 8, 1), (3, "small", 8, 3),
    (1, "full", 8, 1),
])
def test_auto_uses_processes_only_for_full_size_clusters(monkeypatch, workers, size, cpus, want):
    monkeypatch.setattr("fedsched.coordinator.evaluation.os.cpu_count", lambda: cpus)
    assert central_worker_count(workers, size) == want


@pytest.mark.parametrize("workers", [0, -2, "2", True, 1.0])
def test_the_evaluator_refuses_a_bad_worker_count(workers):
    with pytest.raises(ValueError, match="workers"):
        central_worker_count(workers, "full")


@pytest.mark.parametrize("value, want", [("auto", "auto"), (1, 1), (3, 3), ("2", 2)])
def test_central_workers_reads_auto_or_a_positive_count(value, want):
    assert central_workers(value) == want


@pytest.mark.parametrize("value", [0, -1, "many", 1.5, True, "", None])
def test_central_workers_refuses_anything_else_with_the_key_in_the_message(value):
    with pytest.raises(ValueError, match="central-workers"):
        central_workers(value)

