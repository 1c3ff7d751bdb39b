"""The main job's console report (:func:`fedsched.experiment.report_text.format_report`) from a
report's plain dictionary: every member's table, each verdict with its interval and goals, what
the intervals cover, the bytes beside float32 and the phases' wall time."""

from __future__ import annotations

from fedsched.experiment.report_text import format_report


def _report() -> dict:
    cell = {"mean": 0.25, "ci95": 0.5}
    member = {"why": "web", "nodes": 60, "decisions_per_round": 100, "scarce": True, "late": False,
              "joins_at": 0}
    return {
        "config": {"eval_seeds": 5},
        "clusters": {"edge-2": {"kube-default": {"trouble_score": {"mean": 0.0, "ci95": 0.0}, "runs": 5},
                                "local-only": {"trouble_score": cell, "runs": 5}}},
        "members": {"edge-2": member},
        "verdicts": {"edge-2": {"scarce": True, "late": False, "no_worse": False,
                                "trouble_score vs local-only": {"mean": -0.117, "ci95": 0.467, "n": 5,
                                                                "verdict": "tie"},
                                "goals": {"beats local-only by 0.1 (scarce member)": False}}},
        "fleet": {},
        "bytes": {"fedavg": {"int8": 250, "fp32": 1000, "down": 355, "down-fp32": 1000}},
        "wall_s": 608.0, "phases_s": {"evaluation": 174.7},
    }


def test_the_console_report_says_what_its_verdicts_cover() -> None:
    text = format_report(_report())
    assert "edge-2: web (60 nodes, 100 decisions per round, data-scarce)" in text
    assert [ln.split() for ln in text.splitlines()[2:5]] == [
        ["policy", "trouble_score"], ["kube-default", "0", "±", "0"], ["local-only", "0.25", "±", "0.5"]]
    assert "edge-2: WORSE; trouble_score vs local-only: tie (-0.117 ± 0.47)" in text
    assert "goals: beats local-only by 0.1 (scarce member): MISSED" in text
    # one training run per model: the intervals are the evaluation seeds' spread only
    assert "evaluation seeds of one training run" in text and "can change a verdict" in text
    assert "--training-seed" in text and "federation_training_runs.py pools several" in text
    assert "int8 250 vs fp32 1,000 (0.250x); received 355 vs fp32 1,000 (0.355x)" in text
    assert text.endswith("wall time 608 s (evaluation 175 s)")


def test_the_console_report_says_how_the_models_score() -> None:
    report = _report()
    report["config"] |= {"kube_weight": 2.0, "init": "random"}
    first = format_report(report).splitlines()[0]
    assert first == ("every learned model scores nodes with its logits plus 2 x kube-default's score / 100 "
                     "(kube-weight); start: random")
    report["config"]["kube_weight"] = 0.0
    assert "with its logits alone (kube-weight)" in format_report(report).splitlines()[0]
    report["config"]["training_seed"] = 3  # another training of the configuration says which
    assert format_report(report).splitlines()[0].endswith("start: random; training seed 3")
