"""``bench/federation_training_runs.py``: verdicts over several training runs of the main job
hold the training's variation (the between-runs spread) as well as the evaluation seeds', and
refuse reports that are not runs of one configuration."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_federation_training_runs",
                                               REPO / "bench" / "federation_training_runs.py")
assert _spec is not None and _spec.loader is not None
pooling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pooling)

SEEDS = [-0.30, -0.10, -0.25, -0.05, -0.20]  # one run's per-seed differences: clearly better alone


def test_identical_runs_give_the_seeds_interval():
    one = pooling.pooled([SEEDS, SEEDS])
    alone = 2.776 * np.std(SEEDS, ddof=1) / np.sqrt(5)  # t(0.975, 4)
    assert one["mean"] == pytest.approx(np.mean(SEEDS)) and one["ci95"] == pytest.approx(alone, rel=1e-3)
    assert one["verdict"] == "better"


def test_runs_that_disagree_widen_the_interval_into_a_tie():
    """Two runs alone say better, one training run 0.4 worse says worse: pooled, a tie."""
    table = [SEEDS, [x + 0.4 for x in SEEDS], [x + 0.05 for x in SEEDS]]
    assert [pooling.run_verdict(row) for row in table] == ["better", "worse", "better"]
    r = pooling.pooled(table)
    assert r["verdict"] == "tie" and r["ci95"] > pooling.pooled([SEEDS, SEEDS])["ci95"]
    assert r["run_means"] == pytest.approx([np.mean(row) for row in table])


@pytest.mark.parametrize("table", [[SEEDS], [[0.1], [0.2]], [[0.1, np.nan], [0.2, 0.3]], []])
def test_too_small_or_non_finite_tables_are_refused(table):
    with pytest.raises(ValueError, match="need at least 2 runs x 2 seeds"):
        pooling.pooled(table)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.integers(2, 8), st.floats(-5, 5), st.integers(0, 2**31 - 1))
def test_a_shift_moves_the_mean_and_keeps_the_interval(k, s, shift, seed):
    table = np.random.default_rng(seed).normal(size=(k, s))
    a, b = pooling.pooled(table), pooling.pooled(table + shift)
    assert b["mean"] == pytest.approx(a["mean"] + shift, abs=1e-9)
    assert b["ci95"] == pytest.approx(a["ci95"], rel=1e-9, abs=1e-12) and a["ci95"] >= 0


def _report(training_seed: int, offset: float, **config) -> dict:
    values = [x + offset for x in SEEDS]
    return {"config": {"eta": 0.2, "eval_seeds": 5, "workers": 2, "training_seed": training_seed, **config},
            "verdicts": {"edge-2": {"trouble_score vs local-only": {"values": values},
                                    "no worse": True}},
            "fleet": {"trouble_score personalised eta=0.2 vs local-only": {"values": values}}}


def _write(tmp_path: Path, reports: list[dict]) -> list[str]:
    paths = []
    for i, r in enumerate(reports):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    return paths


def test_the_pooled_verdicts_of_three_runs(tmp_path, capsys):
    paths = _write(tmp_path, [_report(1, 0.0), _report(2, 0.4, workers=1), _report(3, 0.05)])
    assert pooling.main([*paths, "--json", str(tmp_path / "pooled.json")]) == 0
    out = capsys.readouterr().out
    assert "3 training runs x 5 evaluation seeds" in out and "edge-2: vs local-only" in out
    rows = json.loads((tmp_path / "pooled.json").read_text())["rows"]
    assert [(r["member"], r["verdict"], r["flips"]) for r in rows] == [
        ("edge-2", "tie", 3), ("across the members", "tie", 3)]


@pytest.mark.parametrize(("reports", "message"), [
    ([_report(1, 0.0), _report(2, 0.0, eta=0.5)], "not runs of one configuration: they differ in eta"),
    ([_report(1, 0.0), _report(2, 0.0, eval_seeds=30)], "they differ in eval_seeds"),
    ([_report(2, 0.0), _report(2, 0.1)], "share a training seed"),
    ([{"config": {"training_seed": 1}}, {"config": {"training_seed": 2}}], "no trouble-score comparison"),
    ([[1, 2], _report(2, 0.0)], "not a main-job report"),
    ([_report(1, 0.0), {"config": "x"}], "not a main-job report"),
    ([_report(1, 0.0), {**_report(2, 0.0), "verdicts": [1]}], "not a main-job report"),
    ([{"config": {"training_seed": 1}, "verdicts": {"edge-2": 3}}, {"config": {"training_seed": 2}}],
     "no trouble-score comparison in common"),
    ([_report(1, 0.0), {**_report(2, 0.0), "fleet": {"trouble_score a": {"values": [None, {}]}}}],
     "across the members: a: per-seed values must be numbers"),
])
def test_reports_of_other_configurations_are_one_clear_error(tmp_path, capsys, reports, message):
    assert pooling.main(_write(tmp_path, reports)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_one_report_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        pooling.main(_write(tmp_path, [_report(1, 0.0)]))
    assert exc.value.code == 2 and "at least 2 training runs" in capsys.readouterr().err
