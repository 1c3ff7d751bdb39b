"""Short real Flower simulations (``flwr run``: Flower's own runtime, Ray backend) of member clusters,
and the one source of the run config's defaults.

Checks that the ServerApp and ClientApp run two rounds end to end with INT8 uploads, that the
hub checkpoints every round, that members keep their local weights in their state
directories, that a hub restarted with more rounds resumes without losing or repeating a
round (also when it was killed between writing a round's history and its checkpoint), and that
every default comes from pyproject's ``[tool.flwr.app.config]``.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord
from flwr.common.config import parse_config_args

from fedsched.common.federation.run_config import app_defaults, run_config_arg, with_defaults
from fedsched.common.federation.weights import save_npz, weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.coordinator.evaluation import HubRecorder, central_evaluator, load_checkpoint
from fedsched.coordinator.federate import FederateConfig, federate, run_flower, stop_local_superlink
from fedsched.coordinator.strategies import make_strategy
from tests.paths import REPO

pytest.importorskip("flwr.simulation")


def pyproject_table() -> dict:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


def test_run_config_defaults_are_pyprojects_table_and_nothing_else():
    table = pyproject_table()
    assert app_defaults() == table and with_defaults({}) == table
    assert with_defaults({"eta": 0.5}) == {**table, "eta": 0.5}
    with pytest.raises(ValueError, match="not present"):
        with_defaults({"rounds": 3})  # not a key of the table
    # The main job's defaults are the same values (no second copy).
    cfg = FederateConfig()
    assert (cfg.rounds, cfg.local_steps, cfg.eta, cfg.proximal_mu, cfg.openb_nodes, cfg.eval_nodes, cfg.init,
            cfg.seed, cfg.clusters) == (
        table["num-server-rounds"], table["local-steps"], table["eta"], table["proximal-mu"],
        table["openb-nodes"], table["eval-nodes"], table["init"], table["seed"], table["min-nodes"])


def test_the_main_jobs_run_config_argument_parses_back_as_flwr_run_reads_it(tmp_path):
    cfg = FederateConfig.quick()
    values = {**cfg.run_config("fedprox", tmp_path / "a dir"), "codec": "fp32", "fail-rate": 0.3,
              "upload-norm": 1e9, "poison-members": "1,4"}
    parsed = parse_config_args([run_config_arg(values)])
    assert parsed == values
    assert with_defaults(parsed)["num-server-rounds"] == 3 and with_defaults(parsed)["ppo-update-epochs"] == (
        pyproject_table()["ppo-update-epochs"])
    with pytest.raises(ValueError, match="not present"):
        run_config_arg({"local-step": 5})


def test_recorder_resumes_a_hub_killed_between_history_and_checkpoint(tmp_path):
    """Round 3's entry was written, its checkpoint was not: round 3 runs again, recorded once."""
    weights = weights_of(NodeScoringPolicy())
    save_npz(tmp_path / "global.npz", {**weights, "__round__": np.array(2)})
    (tmp_path / "rounds.json").write_text(json.dumps([{"round": r, "central": {}} for r in (1, 2, 3)]))
    done, saved = load_checkpoint(tmp_path)
    assert done == 2 and saved is not None and set(saved) == set(weights)
    strategy = make_strategy("fedavg", norm_bound=5.0, fraction_train=1.0, min_train_nodes=2,
                             min_available_nodes=2, round_offset=done)
    recorder = HubRecorder(tmp_path, strategy, central_evaluator(30), resumed_from=done)
    arrays = ArrayRecord({k: Array(v) for k, v in saved.items()})
    assert recorder(2, arrays) is None  # Flower's initial call: the checkpoint's own round
    central = recorder(3, arrays)
    assert isinstance(central, MetricRecord) and 0 < central["alloc_gpu"] <= 100
    recorder.finish(3)
    history = json.loads((tmp_path / "rounds.json").read_text())
    assert [h["round"] for h in history] == [1, 2, 3]
    assert history[2]["central"] == dict(central) and history[2]["rejected"] == []
    assert load_checkpoint(tmp_path)[0] == 3
    assert json.loads((tmp_path / "final.json").read_text())["resumed_from"] == 2


def test_two_rounds_then_resume_to_three(tmp_path):
    cfg = FederateConfig(clusters=3, rounds=2, local_steps=64, openb_nodes=40, eval_nodes=60,
                         strategies=("fedavg",))
    run_dir = run_flower(REPO, tmp_path, "fedavg", cfg, progress=lambda m: None)
    history = json.loads((run_dir / "hub" / "rounds.json").read_text())
    assert [h["round"] for h in history] == [1, 2]
    for h in history:
        assert 0 < h["central"]["alloc_gpu"] <= 100 and h["rejected"] == [] and h["skipped"] == []
        assert h["train"]["bytes-up"] <= 0.26 * h["train"]["bytes-up-fp32"]  # INT8 uploads
        assert sorted(h["members"]) == ["0", "1", "2"]  # per-cluster metrics of the round
        assert all(m["num-examples"] == 64 for m in h["members"].values())
    assert load_checkpoint(run_dir / "hub")[0] == 2
    members = sorted(p.name for p in (run_dir / "state").iterdir())
    assert members == ["edge-2", "gpu-openb-0", "web-1"]
    for m in members:
        assert (run_dir / "state" / m / "local.npz").exists()
    # The hub restarts with a target of three rounds: only round 3 runs, numbered 3 throughout.
    run_flower(REPO, tmp_path, "fedavg", dataclasses.replace(cfg, rounds=3), progress=lambda m: None,
               fresh=False)
    history = json.loads((run_dir / "hub" / "rounds.json").read_text())
    assert [h["round"] for h in history] == [1, 2, 3] and "train" in history[2]
    final = json.loads((run_dir / "hub" / "final.json").read_text())
    assert final["resumed_from"] == 2 and [h["round"] for h in final["history"]] == [1, 2, 3]
    log = (tmp_path / "flwr-fedavg.log").read_text()
    assert "round 3: 3 updates kept" in log and log.count("updates kept") == 3


def test_federate_main_job_runs_flwr_and_reports(tmp_path):
    """The main job's orchestration end to end, tiny: `flwr run` with a private FLWR_HOME, the
    run's final state read back, the SuperLink stopped, and report.json in the promised shape."""

    cfg = FederateConfig(clusters=2, rounds=1, local_steps=32, openb_nodes=30, eval_nodes=40, eval_seeds=1,
                         strategies=("fedavg",))
    app_dir = REPO
    report = federate(tmp_path / "out", cfg, app_dir, progress=lambda m: None)
    assert set(report["clusters"]) == {"gpu-openb-0", "web-1"}
    for pols in report["clusters"].values():
        assert {"default", "local", "global", "personalised"} <= set(pols)
        assert set(pols["default"]["alloc_cpu"]) == {"mean", "ci95"}
    assert 0 < report["bytes"]["int8"] <= 0.26 * report["bytes"]["fp32"]
    assert (tmp_path / "out" / "report.json").exists() and (tmp_path / "out" / "rounds.png").exists()
    assert stop_local_superlink(tmp_path / "out" / "flwr-home") == 0  # already stopped


def test_run_simulation_passes_no_run_config_and_the_apps_use_pyprojects(tmp_path, monkeypatch):
    """flwr.simulation.run_simulation gives both apps an empty run config: every value comes from
    pyproject's table (out-dir and state-dir relative to the working directory). A hub
    checkpointed one round short of the table's num-server-rounds runs exactly that last round,
    with the table's local-steps on every member."""
    from flwr.simulation import run_simulation

    from fedsched.agent.federation.client_app import app as client
    from fedsched.coordinator.server_app import app as server

    table = pyproject_table()
    monkeypatch.chdir(tmp_path)
    last = int(table["num-server-rounds"])
    save_npz(tmp_path / table["out-dir"] / "global.npz", {**weights_of(NodeScoringPolicy()),
                                                          "__round__": np.array(last - 1)})
    run_simulation(server_app=server, client_app=client, num_supernodes=int(table["min-nodes"]),
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2}})
    history = json.loads((tmp_path / table["out-dir"] / "rounds.json").read_text())
    assert [h["round"] for h in history] == [last]
    assert len(history[0]["members"]) == table["min-nodes"]  # every member replied
    assert all(m["num-examples"] == table["local-steps"] for m in history[0]["members"].values())
    members = sorted(p.name for p in (tmp_path / table["state-dir"]).iterdir())
    assert members == ["edge-2", "gpu-openb-0", "web-1"]
