"""A short real Flower simulation (Flower's own runtime, Ray backend) of three member clusters.

Checks that the ServerApp and ClientApp run two rounds end to end with INT8 uploads, that the
hub checkpoints every round, that members keep their local weights in their state
directories, and that a hub restarted with more rounds resumes without losing or repeating
a round.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.paths import REPO

flwr_sim = pytest.importorskip("flwr.simulation")


def run(num_rounds: int, tmp_path, monkeypatch) -> list[dict]:
    from fedsched.agent.federation.client_app import app as client
    from fedsched.coordinator.server_app import app as server

    # run_simulation passes no run config: the apps fall back to FEDSCHED_* variables.
    for key, value in {"OUT_DIR": tmp_path / "hub", "STATE_DIR": tmp_path / "state", "LOCAL_STEPS": 64,
                       "NUM_SERVER_ROUNDS": num_rounds, "OPENB_NODES": 40, "EVAL_NODES": 60,
                       "MIN_NODES": 3}.items():
        monkeypatch.setenv(f"FEDSCHED_{key}", str(value))
    flwr_sim.run_simulation(server_app=server, client_app=client, num_supernodes=3,
                            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                            "init_args": {"num_cpus": 2}})
    return json.loads((tmp_path / "hub" / "rounds.json").read_text())


def test_two_rounds_then_resume_to_three(tmp_path, monkeypatch):
    history = run(2, tmp_path, monkeypatch)
    assert [h["round"] for h in history] == [1, 2]
    for h in history:
        assert 0 < h["central"]["alloc_gpu"] <= 100 and h["rejected"] == [] and h["skipped"] == []
        assert h["train"]["bytes-up"] <= 0.26 * h["train"]["bytes-up-fp32"]  # INT8 uploads
        assert sorted(h["members"]) == ["0", "1", "2"]  # per-cluster metrics of the round
        assert all(m["num-examples"] == 64 for m in h["members"].values())
    with np.load(tmp_path / "hub" / "global.npz") as z:
        assert int(z["__round__"]) == 2
    members = sorted(p.name for p in (tmp_path / "state").iterdir())
    assert members == ["edge-2", "gpu-openb-0", "web-1"]
    for m in members:
        assert (tmp_path / "state" / m / "local.npz").exists()
        assert (tmp_path / "state" / m / "residual.npz").exists()
    # The hub restarts with a target of three rounds: only round 3 runs.
    history = run(3, tmp_path, monkeypatch)
    assert [h["round"] for h in history] == [1, 2, 3]
    final = json.loads((tmp_path / "hub" / "final.json").read_text())
    assert final["resumed_from"] == 2


def test_federate_main_job_runs_flwr_and_reports(tmp_path):
    """The main job's orchestration end to end, tiny: `flwr run` with a private FLWR_HOME, the
    run's final state read back, the SuperLink stopped, and report.json in the promised shape."""

    from fedsched.coordinator.federate import FederateConfig, federate, stop_local_superlink

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
