"""The hub's side of a federation: the one source of the run config's defaults, the recorder's
checkpoint and resume, and a real Flower simulation (``flwr.simulation.run_simulation``) of the
ServerApp with the members' ClientApp on pyproject's run config.

The main job's ``flwr run`` simulations are tested in ``tests/experiment/test_federate.py``.
"""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord

from fedsched.common.federation.run_config import app_defaults, with_defaults
from fedsched.common.federation.weights import save_npz, weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.coordinator.evaluation import HubRecorder, central_evaluator, load_checkpoint
from fedsched.coordinator.server_app import initial_weights
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


def test_run_simulation_passes_no_run_config_and_the_apps_use_pyprojects(tmp_path, monkeypatch):
    """flwr.simulation.run_simulation gives both apps an empty run config: every value comes from
    pyproject's table (out-dir and state-dir relative to the working directory). A hub
    checkpointed one round short of the table's num-server-rounds runs exactly that last round,
    in the table's mode with its decision budgets on every member."""
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
    assert table["mode"] == "online" and last >= table["late-round"]
    budgets = sorted(m["num-examples"] for m in history[0]["members"].values())
    assert budgets == sorted([table["local-decisions"]] * 3 + [table["scarce-decisions"]] * 2)
    members = sorted(p.name for p in (tmp_path / table["state-dir"]).iterdir())
    assert members == ["edge-2", "gpu-cpuheavy-3", "gpu-train-0", "web-1", "web-late-4"]


def test_the_random_start_is_the_same_bits_whatever_the_thread_count():
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = initial_weights("random", 5, "online")
        torch.set_num_threads(2)
        two = initial_weights("random", 5, "online")
        assert torch.get_num_threads() == 2  # the caller's count is kept
    finally:
        torch.set_num_threads(threads)
    assert one.keys() == two.keys()
    assert all(np.array_equal(one[k], two[k]) for k in one)
