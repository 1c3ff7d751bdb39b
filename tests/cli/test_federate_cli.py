"""``fedsched federate``'s argument handling: a bad value is one clear error before any work (the
job itself runs end to end in ``tests/experiment/test_federate.py``)."""

from __future__ import annotations

import pytest

from fedsched.cli.main import main


@pytest.mark.parametrize(("args", "message"), [
    (["--eval-seeds", "1"], "--eval-seeds must be at least 2"),
    (["--clusters", "1"], "--clusters must be at least 2"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--seed", "-1"], "--seed must be in [0, 2**63), got -1"),
    (["--seed", str(2**64 + 5)], "--seed must be in [0, 2**63)"),
    (["--eta", "1.5"], "--eta must be in [0, 1]"),
    (["--kube-weight", "-1"], "--kube-weight must be in [0, 1e+06]"),
    (["--kube-weight", "nan"], "--kube-weight must be in [0, 1e+06]"),
    (["--kube-weight", "1e7"], "--kube-weight must be in [0, 1e+06]"),
    (["--training-seed", "0"], "--training-seed must be in [1, 4000], got 0"),
    (["--training-seed", "-1"], "--training-seed must be in [1, 4000]"),
    (["--training-seed", "4001"], "--training-seed must be in [1, 4000]"),
    (["--training-seed", str(2**40)], "--training-seed must be in [1, 4000]"),
])
def test_a_bad_value_is_one_clear_error_and_nothing_runs(tmp_path, capsys, args, message) -> None:
    out = tmp_path / "out"
    assert main(["federate", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_an_unknown_member_size_is_refused_by_the_parser(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["federate", "--out", str(tmp_path / "out"), "--member-size", "huge"])
    assert exc.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "init"), [([], "shipped"), (["--init", "random"], "random"),
                                            (["--quick", "--init", "random"], "random")])
def test_the_start_flag_reaches_the_job(tmp_path, monkeypatch, args, init) -> None:
    import fedsched.experiment.federate as job
    import fedsched.experiment.report_text as report_text

    seen = {}

    def fake_federate(out, cfg, app_dir, progress, reuse=False):  # what the CLI hands the job
        seen["cfg"] = cfg
        return {}

    monkeypatch.setattr(job, "federate", fake_federate)
    monkeypatch.setattr(report_text, "format_report", lambda report: "")
    assert main(["federate", "--out", str(tmp_path / "out"), *args]) == 0
    assert seen["cfg"].init == init


@pytest.mark.parametrize(("args", "field", "key", "value"), [
    ([], "kube_weight", "kube-weight", 2.0), (["--kube-weight", "0"], "kube_weight", "kube-weight", 0.0),
    (["--quick", "--kube-weight", "3.5"], "kube_weight", "kube-weight", 3.5),
    ([], "training_seed", "training-seed", 1),
    (["--training-seed", "3"], "training_seed", "training-seed", 3),
    (["--quick", "--training-seed", "4000"], "training_seed", "training-seed", 4000),
])
def test_a_setting_reaches_the_job_and_its_run_config(tmp_path, monkeypatch, args, field, key, value) -> None:
    import fedsched.experiment.federate as job
    import fedsched.experiment.report_text as report_text

    seen = {}
    monkeypatch.setattr(job, "federate", lambda out, cfg, *a, **k: seen.setdefault("cfg", cfg) and {})
    monkeypatch.setattr(report_text, "format_report", lambda report: "")
    assert main(["federate", "--out", str(tmp_path / "out"), *args]) == 0
    assert getattr(seen["cfg"], field) == value
    assert seen["cfg"].run_config("fedavg", tmp_path)[key] == value


def test_an_unknown_start_is_refused_by_the_parser(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["federate", "--out", str(tmp_path / "out"), "--init", "pretrained"])
    assert exc.value.code == 2 and "invalid choice: 'pretrained'" in capsys.readouterr().err

