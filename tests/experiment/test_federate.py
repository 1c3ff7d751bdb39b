"""The main job (``fedsched.experiment``): short real Flower simulations (``flwr run``: Flower's
own runtime, Ray backend) of member clusters, its settings and its report.

Checks that the ServerApp and ClientApp run two rounds end to end with INT8 uploads, that the
hub checkpoints every round, that members keep their local weights in their state
directories, that a hub restarted with more rounds resumes without losing or repeating a
round, that the main job's defaults are pyproject's ``[tool.flwr.app.config]``, and the whole
job with its HTML report, tiny. The job runs once for the module (:func:`main_job`): the
round, checkpoint and state checks and the resume use its FedAvg run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.common.config import parse_config_args

from fedsched.common.federation.run_config import run_config_arg, with_defaults
from fedsched.common.learning.decision_log import DecisionLog
from fedsched.coordinator.evaluation import load_checkpoint
from fedsched.experiment.config import FederateConfig
from fedsched.experiment.federate import federate, reusable, run_flower, stop_local_superlink
from tests.browser_support import open_page
from tests.paths import REPO

pytest.importorskip("flwr.simulation")


def pyproject_table() -> dict:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


def test_the_main_jobs_defaults_are_the_run_configs():
    """FederateConfig's defaults are pyproject's table (no second copy)."""
    table = pyproject_table()
    cfg = FederateConfig()
    assert (cfg.rounds, cfg.local_decisions, cfg.scarce_decisions, cfg.late_round, cfg.local_epochs,
            cfg.local_learning_rate, cfg.eta, cfg.proximal_mu, cfg.seed, cfg.clusters) == (
        table["num-server-rounds"], table["local-decisions"], table["scarce-decisions"], table["late-round"],
        table["local-epochs"], table["local-learning-rate"], table["eta"], table["proximal-mu"],
        table["seed"], table["min-nodes"])
    assert cfg.init == table["init"] == "shipped"  # the experiment starts where a fleet does
    assert cfg.kube_weight == table["kube-weight"]
    assert cfg.training_seed == table["training-seed"] == 1  # 1: the seeds of the results of record


def test_only_the_first_strategys_members_validate(tmp_path):
    """The report reads the validation scores of the first strategy's run alone (the plot, the late
    member's rounds to local-only's quality): the other runs skip those replays; local-only,
    which trains with the first run's member settings, validates."""
    cfg = FederateConfig()
    assert [cfg.run_config(s, tmp_path)["validate"] for s in cfg.strategies] == [1, 0]
    assert cfg.member_config(tmp_path).validate == 1


def test_the_main_jobs_run_config_argument_parses_back_as_flwr_run_reads_it(tmp_path):
    cfg = FederateConfig.quick()
    values = {**cfg.run_config("fedprox", tmp_path / "a dir"), "codec": "fp32", "fail-rate": 0.3,
              "upload-norm": 1e9, "poison-members": "1,4"}
    parsed = parse_config_args([run_config_arg(values)])
    assert parsed == values
    assert with_defaults(parsed)["num-server-rounds"] == 3 and with_defaults(parsed)["finetune-epochs"] == (
        pyproject_table()["finetune-epochs"])
    with pytest.raises(ValueError, match="not present"):
        run_config_arg({"local-step": 5})



def test_the_fab_flwr_run_builds_is_the_package_sources_under_flowers_cap():
    """``flwr run`` bundles the app directory into a FAB that Flower refuses above 10 MB: it holds
    the package's sources (what the apps import) and none of the benchmarks' results of record."""
    import io
    import zipfile

    from flwr.cli.build import build_fab_from_disk
    from flwr.common.constant import FAB_MAX_SIZE

    fab = build_fab_from_disk(REPO)
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    assert len(fab) < FAB_MAX_SIZE / 2
    assert {"coordinator/server_app.py", "agent/federation/client_app.py", "pyproject.toml"} <= set(names)
    assert not [n for n in names if n.startswith(("bench/", "tests/", "charts/"))]


TINY = dict(local_decisions=40, scarce_decisions=20, local_epochs=2, eval_seeds=2, member_size="small")
#: The main job's settings: one FedAvg run (online mode) of the five members, two rounds, the late
#: member (partition 4) joining at round 2. ``etas`` is no run-config value: the job's run is the
#: run ``FederateConfig(clusters=5, rounds=2, late_round=2, strategies=("fedavg",), **TINY)`` starts.
#: Local-only and the first replays run beside the Flower run, as by default (the reuse test
#: evaluates the same models again without that: both orders give the same figures).
#: It starts from the random model: from the shipped one these small members' honest updates fell
#: below the hub's direction floor (a cosine of -0.4 in one run, when members uploaded their offset
#: from the global; not retried since they upload their round's learning), which the rounds test
#: forbids.
MAIN_JOB = FederateConfig(clusters=5, rounds=2, late_round=2, strategies=("fedavg",), etas=(0.0, 0.2, 1.0),
                          beside_flower=True, init="random", **TINY)


@dataclasses.dataclass
class MainJob:
    out: Path
    report: dict
    history: list[dict]  # the hub's rounds.json as the job left it (before any resume)
    stopped_after: int  # local SuperLink processes still to stop right after the job returned


@pytest.fixture(scope="module")
def main_job(tmp_path_factory: pytest.TempPathFactory) -> MainJob:
    """The main job end to end, tiny, once for this module: its FedAvg run (``flwr run``, two
    rounds) is the run the resume test checks and then resumes (one ``flwr run`` of two rounds
    fewer than two separate runs)."""
    base = tmp_path_factory.mktemp("main-job")
    out = base / "out"
    # As a user runs it: --out relative to the working directory, the app directory elsewhere
    # (flwr runs in the app directory: the hub once wrote its rounds there, and the job failed)
    cwd = os.getcwd()
    os.chdir(base)
    try:
        report = federate(Path("out"), MAIN_JOB, REPO, progress=lambda m: None)
    finally:
        os.chdir(cwd)
    stopped_after = stop_local_superlink(out / "flwr-home")  # read now: the resume starts another
    return MainJob(out, report, json.loads((out / "fedavg" / "hub" / "rounds.json").read_text()),
                   stopped_after)


def test_a_finished_training_is_evaluated_again_without_training(main_job: MainJob):
    """``reuse``: the same job's finished training in its directory, evaluated again with more
    seeds: no Flower run and no local-only round, the first seeds' figures as before (the same
    models and replays), one more seed; a job with other training settings is not reused. (Runs
    before the resume test, which changes the FedAvg run.)"""
    out = main_job.out
    logs = {p.name: p.read_text() for p in out.glob("flwr-*.log")}
    local_before = {p: p.stat().st_mtime_ns for p in (out / "local-only").rglob("*.npz")}
    said: list[str] = []
    report = federate(out, dataclasses.replace(MAIN_JOB, eval_seeds=3, beside_flower=False), REPO,
                      progress=said.append, reuse=True)
    assert report["config"]["reused_training"] and any("reusing the finished training" in m for m in said)
    assert {p.name: p.read_text() for p in out.glob("flwr-*.log")} == logs  # no flwr run
    assert {p: p.stat().st_mtime_ns for p in (out / "local-only").rglob("*.npz")} == local_before
    for name, pols in report["clusters"].items():
        for policy, figures in pols.items():
            before = main_job.report["clusters"][name][policy]["runs"]["trouble_score"]
            after = figures["runs"]["trouble_score"]
            assert after[:2] == before and len(after) == 3
    assert report["members"]["web-late-4"]["local_only_val"] == main_job.report["members"]["web-late-4"][
        "local_only_val"]
    assert not reusable(out, dataclasses.replace(MAIN_JOB, local_decisions=41), None)
    assert not reusable(out, MAIN_JOB, {"codec": "fp32"})


def test_two_rounds_then_resume_to_three(main_job: MainJob):
    """Online mode: members learn from their own rewards, the late member (partition 4) joins at
    round 2 and sends nothing before; the hub resumes to a third round. The two rounds are the
    main job's FedAvg run (:func:`main_job`)."""
    cfg, out = MAIN_JOB, main_job.out
    run_dir = out / "fedavg"
    history = main_job.history
    assert [h["round"] for h in history] == [1, 2]
    for h in history:
        assert {"trouble_score", "trouble_score_web"} <= set(h["central"]) and h["rejected"] == []
        assert h["clipped"] == {}  # honest members' weights count as they are (the run config's weight-bound)
        assert h["train"]["bytes-up"] <= 0.26 * h["train"]["bytes-up-fp32"]  # INT8 uploads
        assert sorted(h["members"]) == ["0", "1", "2", "3", "4"]  # per-cluster metrics of the round
        for pid, m in h["members"].items():
            scarce = pid in ("2", "3")
            late_and_early = pid == "4" and h["round"] == 1
            assert m["num-examples"] == (0 if late_and_early else 20 if scarce else 40)
            assert m["joined"] == int(not late_and_early) and np.isfinite(m["val-score"]) != late_and_early
    assert history[0]["skipped"] and not history[1]["skipped"]  # the late member, then no one
    assert load_checkpoint(run_dir / "hub")[0] == 2
    members = sorted(p.name for p in (run_dir / "state").iterdir())
    assert members == ["edge-2", "gpu-cpuheavy-3", "gpu-train-0", "web-1", "web-late-4"]
    for m in members:
        assert (run_dir / "state" / m / "local.npz").exists()
        assert len(DecisionLog(run_dir / "state" / m / "experience")) == (20 if m[-1] in "23" else 40) * (
            1 if m == "web-late-4" else 2)  # every decision kept on the member, never sent
    # The hub restarts with a target of three rounds: only round 3 runs, numbered 3 throughout.
    run_flower(REPO, out, "fedavg", dataclasses.replace(cfg, rounds=3), progress=lambda m: None,
               fresh=False)
    history = json.loads((run_dir / "hub" / "rounds.json").read_text())
    assert [h["round"] for h in history] == [1, 2, 3] and "train" in history[2]
    final = json.loads((run_dir / "hub" / "final.json").read_text())
    assert final["resumed_from"] == 2 and [h["round"] for h in final["history"]] == [1, 2, 3]
    log = (out / "flwr-fedavg.log").read_text()
    assert "round 3: 5 updates kept" in log and log.count("updates kept") == 3
    assert not reusable(out, cfg, None)  # the resumed hub's model is another training


def test_federate_main_job_runs_flwr_reports_and_its_html_renders(main_job: MainJob):
    """The main job end to end, tiny: `flwr run` with a private FLWR_HOME, the run's final state
    read back, the SuperLink stopped, report.json in the promised shape (every member's policies,
    the online metrics and GPU fragmentation only where the member has GPUs, no NaN), the
    verdicts, the bytes each member sent, and report.html rendered in headless Chromium: the
    tables and the plot are there and the console has no error. (The resume test may have run
    one more round into the same directory since: nothing checked here depends on it.)"""
    report, out = main_job.report, main_job.out
    assert set(report["clusters"]) == {"gpu-train-0", "web-1", "edge-2", "gpu-cpuheavy-3", "web-late-4"}
    for name, pols in report["clusters"].items():
        assert {"kube-default", "random start", "local-only", "global fedavg", "personalised eta=0.2",
                "personalised eta=1"} <= set(pols)
        gpus = report["members"][name]["gpus"]
        for p in pols.values():
            assert ("gpu_frag_amount_avg" in p) == gpus and {"trouble_score", "hot_cpu_node_s"} <= set(p)
            assert all(np.isfinite(v["mean"]) for k, v in p.items() if k != "runs")
        assert pols["kube-default"]["trouble_score"]["mean"] == 0.0
    assert report["members"]["edge-2"]["scarce"] and report["members"]["web-late-4"]["joins_at"] == 2
    assert set(report["verdicts"]["web-late-4"]) >= {"no_worse", "rounds_to_local_only",
                                                     "trouble_score vs local-only"}
    goals = {name: set(v["goals"]) for name, v in report["verdicts"].items()}
    assert "beats local-only by 0.1 (scarce member)" in goals["edge-2"]
    assert {"not worse than local-only, one-sided 95% (rich member)",
            "better than kube-default (rich member)"} <= goals["web-1"]
    assert report["config"]["member_size"] == "small" and report["members"]["web-1"]["nodes"] == 8
    b = report["bytes"]["fedavg"]
    assert b["members"]["4"]["uploads"] == 1 and b["members"]["0"]["uploads"] == 2  # the late member: 1 round
    # its round-1 reply carried a zero update: sent too, as many bytes as a real one
    assert b["members"]["4"]["int8"] == b["members"]["0"]["int8"]
    assert 0 < b["int8"] <= 0.26 * b["fp32"] and b["int8"] == sum(m["int8"] for m in b["members"].values())
    assert (out / "report.json").exists() and (out / "rounds.png").exists()
    assert main_job.stopped_after == 0  # already stopped when the job returned
    page = open_page(out / "report.html")
    assert page.console_errors == [] and page.images == page.images_decoded == 1
    assert "Verdicts" in page.headings and "web-late-4" in page.headings
    verdicts, fleet, *members, sent = page.tables
    assert [r[0] for r in verdicts[1:]] == list(report["clusters"]) and len(members) == 5
    assert [r[0] for r in fleet[1:]] == list(report["fleet"]) and len(report["fleet"]) == 5  # FedAvg only
    assert "trouble_score local-only vs random start" in report["fleet"]
    assert members[0][0][:3] == ["policy", "trouble_score", "hot_cpu_node_s"]
    assert [r[0] for r in members[1][1:]] == list(report["clusters"]["web-1"])
    assert sent[1][0] == "fedavg"


def test_local_flower_simulations_wait_for_each_other(tmp_path, monkeypatch):
    """Two local simulations would share Flower's fixed SuperLink ports: a second one waits, and
    says so, until the first process's run ends."""
    import subprocess
    import sys
    import time

    from fedsched.experiment import federate as fed

    monkeypatch.setattr(fed, "LOCK_PATH", tmp_path / "flower.lock")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(1.5)"), str(tmp_path / "flower.lock")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    said: list[str] = []
    t0 = time.monotonic()
    with fed.local_flower_lock(said.append):
        waited = time.monotonic() - t0
    holder.wait(timeout=10)
    assert waited > 0.5 and len(said) == 1 and "waiting for another local Flower simulation" in said[0]
    with fed.local_flower_lock(said.append):  # free again: no wait, nothing said
        pass
    assert len(said) == 1


def test_a_flwr_run_that_flower_refuses_is_one_clear_error(tmp_path):
    """``flwr run`` refusing its options (here a federation size Flower cannot read) ends the job
    with Flower's own message, not with an empty run listing."""
    cfg = dataclasses.replace(FederateConfig.quick(), clusters=2.5)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError) as err:
        run_flower(REPO, tmp_path, "fedavg", cfg, progress=lambda m: None)
    message = str(err.value)
    assert "flwr run (fedavg) exited with status" in message
    assert "cannot be interpreted as an integer" in message and "flwr-fedavg.log" in message
    import time

    deadline = time.monotonic() + 20  # the SuperLink it started was stopped: gone once it exits
    while stop_local_superlink(tmp_path / "flwr-home") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stop_local_superlink(tmp_path / "flwr-home") == 0


def test_a_logs_tail_drops_colour_codes_and_frames(tmp_path):
    from fedsched.experiment.federate import log_tail

    log = tmp_path / "flwr.log"
    log.write_text("\n".join(["first", "", "\x1b[92mINFO \x1b[0m:      started",
                              "\u256d\u2500 Error \u2500\u2500\u256e", "\u2502 bad option  \u2502",
                              "\u2570\u2500\u2500\u2500\u256f", ""]))
    assert log_tail(log, 3) == "INFO :      started | Error | bad option"
    assert log_tail(log) == "first | INFO :      started | Error | bad option"
    assert log_tail(tmp_path / "missing.log") == "(no log)"
    (tmp_path / "empty.log").write_text("\n\n")
    assert log_tail(tmp_path / "empty.log") == "(empty log)"


@pytest.mark.parametrize("repeats", [0, 3], ids=["once", "repeated"])
def test_a_stopped_main_job_leaves_no_flower_runtime_running(tmp_path, repeats):
    """SIGTERM (a job runner's stop) in the middle of a federated round: the job ends as Ctrl-C
    does (status 130), and stops every process of the local runtime it started (SuperLink,
    SuperExec, simulation, Ray, the apps' actors), which would otherwise go on computing and hold
    Flower's fixed ports for the next run. ``repeated``: an impatient user's Ctrl-C and the job
    runner's SIGTERM again while the job is stopping its runtime do not cut the stop short."""
    import signal
    import subprocess
    import sys
    import time

    from fedsched.experiment.federate import runtime_sessions, session_members

    out = tmp_path / "out"
    job = subprocess.Popen([sys.executable, "-m", "fedsched.cli.main", "federate", "--quick", "--out",
                            str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        log, deadline = out / "flwr-fedavg.log", time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None:
            if log.exists() and "[ROUND 1/" in log.read_text(errors="replace"):
                break
            time.sleep(0.5)
        assert job.poll() is None, "the job ended before its first round"
        sessions = runtime_sessions(out / "flwr-home")
        assert sessions and session_members(sessions), "no local runtime found to stop"
        job.send_signal(signal.SIGTERM)
        for sig in [signal.SIGINT, signal.SIGTERM, signal.SIGINT][:repeats]:
            time.sleep(0.3)
            job.send_signal(sig)
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert session_members(sessions) == set()


def test_local_only_trains_with_the_jobs_training_seed(tmp_path):
    """The local-only baseline is seeded like the federated members of the same job: another
    training seed is another local-only training, the same one repeats."""
    import dataclasses

    import numpy as np

    from fedsched.coordinator.server_app import initial_weights
    from fedsched.experiment.baselines import local_only

    quick = dataclasses.replace(FederateConfig.quick(), rounds=1, local_decisions=30, scarce_decisions=30,
                                local_epochs=1)
    init = initial_weights("random", 1, "online")

    def trained(ts: int, name: str):
        return local_only(2, dataclasses.replace(quick, training_seed=ts), init, tmp_path / name)[0]

    one, again, two = trained(1, "a"), trained(1, "b"), trained(2, "c")
    assert all(np.array_equal(one[k], again[k]) for k in one)
    assert any(not np.allclose(one[k], two[k]) for k in one)
