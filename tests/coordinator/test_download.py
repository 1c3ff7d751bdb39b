"""Compressed downloads (``download-codec = "int8-delta"``): the hub's per-member reconstructions, the
members' ``download_mod`` (rebuild, check, keep, refuse), and bytes both ways; in process through
the real ClientApp (``InProcessGrid``) and through Flower's simulation runtime
(``flwr.simulation.run_simulation``) with a member whose learning step is a fixed random change."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsched.agent.federation.mods import DOWNLOAD_STATE
from fedsched.agent.federation.round import MemberRunConfig, member_state
from fedsched.common.federation.codec import SCALE_SUFFIX, digest, nbytes
from fedsched.common.federation.weights import load_npz, weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.coordinator.strategies import make_strategy
from tests.coordinator.test_strategies import InProcessGrid

SETTINGS = {"norm_bound": 5.0, "fraction_train": 1.0, "fraction_evaluate": 0.0}
TINY = {"mode": "packing", "local-steps": 16}  # the cheapest real round (the mods do not depend on it)
GLOBAL = weights_of(NodeScoringPolicy())
FP32 = nbytes(GLOBAL)


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield


def strategy(nodes: int, codec: str = "int8-delta"):
    return make_strategy("fedavg", min_train_nodes=nodes, min_available_nodes=nodes, download_codec=codec,
                         **SETTINGS)


def initial() -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})


def held_by(grid: InProcessGrid, node: int, run_config: dict) -> dict | None:
    ctx = grid.contexts[node]
    return member_state(ctx.node_config, MemberRunConfig.from_run_config(run_config)).load(DOWNLOAD_STATE)


def within_half_a_step(held: dict, sent: dict, scales: dict) -> None:
    for k, g in sent.items():
        scale = scales[k + SCALE_SUFFIX]
        scale = scale.reshape(-1, *([1] * (g.ndim - 1))) if scale.ndim == 1 and g.ndim >= 2 else scale
        assert (np.abs(held[k] - g) <= scale / 2 * (1 + 1e-5) + 1e-7).all(), k


def test_members_get_deltas_after_a_full_copy_and_track_the_hubs_global(tmp_path):
    """Round 1: a full copy (float32: an exact start); then INT8 deltas from what each member holds
    (encoded once for all of them): about a quarter of float32 both ways, each member's
    reconstruction within half a step of the global the hub sent. ``int8`` sends an INT8 full
    copy too; the float32 codec sends (and reports) the float32 global."""
    from fedsched.agent.federation.client_app import app as client_app

    run_config = {**TINY, "state-dir": str(tmp_path / "int8")}
    grid = InProcessGrid(client_app, [11, 12, 13], run_config)
    s = strategy(3)
    s.start(grid, initial(), num_rounds=2, train_config=ConfigRecord())
    kinds = [(int(m.content["config"]["server-round"]), str(m.content["config"]["download-kind"]))
             for m in grid.sent]
    assert kinds == [(1, "full")] * 3 + [(2, "delta")] * 3
    last = grid.sent[-3:]
    assert len({m.content["config"]["download-base"] for m in last}) == 1  # one shared reconstruction
    for rnd in (1, 2):
        members = s.reports[rnd].members.values()
        assert all(m["download-applied"] == 1 and m["bytes-down-fp32"] == FP32 for m in members)
        assert all(m["bytes-down"] == FP32 if rnd == 1 else m["bytes-down"] < 0.27 * FP32 for m in members)
        assert all(m["bytes-up"] < 0.27 * m["bytes-up-fp32"] for m in members)
    # What each member holds is the hub's last global to within half a step of the last delta.
    sent = s._global
    scales = {k: v.numpy() for k, v in last[0].content["arrays"].items()}
    for node in (11, 12, 13):
        held = held_by(grid, node, run_config)
        assert held is not None and set(held) == set(sent)
        within_half_a_step(held, sent, scales)
    assert set(s.held) == {11, 12, 13}

    int8_grid = InProcessGrid(client_app, [11, 12], {**TINY, "state-dir": str(tmp_path / "int8-full")})
    i = strategy(2, "int8")
    i.start(int8_grid, initial(), num_rounds=1, train_config=ConfigRecord())
    assert all(m["bytes-down"] < 0.27 * FP32 for m in i.reports[1].members.values())

    fp32_grid = InProcessGrid(client_app, [11, 12], {**TINY, "state-dir": str(tmp_path / "fp32")})
    f = strategy(2, "fp32")
    f.start(fp32_grid, initial(), num_rounds=1, train_config=ConfigRecord())
    assert all("download-kind" not in m.content["config"] for m in fp32_grid.sent)
    assert all(m["bytes-down"] == FP32 == m["bytes-down-fp32"] for m in f.reports[1].members.values())


def test_a_member_that_lost_its_copy_refuses_the_delta_and_gets_a_full_copy_next(tmp_path):
    """A member whose state directory was wiped (or restored from elsewhere) cannot apply a delta:
    it skips the round (no examples, download-applied 0) instead of training on a wrong model,
    and the hub sends it a full copy next round. A restarted hub, which holds nothing, sends
    full copies."""
    _, client_app = _sim_apps()  # the real download mod around a member with a fixed change
    run_config = {"state-dir": str(tmp_path)}
    grid = InProcessGrid(client_app, [11, 12], run_config)
    s = strategy(2)
    arrays = initial()
    for rnd in (1, 2, 3):
        if rnd == 2:  # member 12 loses its copy; member 11's is swapped for another model's
            ctx = grid.contexts[12]
            shutil.rmtree(member_state(ctx.node_config, MemberRunConfig.from_run_config(run_config)).dir)
            other = {k: v + np.float32(1e-3) for k, v in GLOBAL.items()}
            ctx11 = grid.contexts[11]
            member_state(ctx11.node_config, MemberRunConfig.from_run_config(run_config)).save(
                DOWNLOAD_STATE, other)
        replies = grid.send_and_receive(s.configure_train(rnd, arrays, ConfigRecord(), grid))
        arrays, _ = s.aggregate_train(rnd, replies)
    sent = {nid: [str(m.content["config"]["download-kind"]) for m in grid.sent
                  if m.metadata.dst_node_id == nid] for nid in (11, 12)}
    assert sent == {11: ["full", "delta", "full"], 12: ["full", "delta", "full"]}
    assert sorted(s.reports[2].skipped) == [11, 12] and s.reports[2].kept == []
    assert all(m["download-applied"] == 0 and m["num-examples"] == 0 for m in s.reports[2].members.values())
    assert sorted(s.reports[3].kept) == [11, 12]
    assert all(m["download-applied"] == 1 for m in s.reports[3].members.values())

    restarted = strategy(2)  # a new hub process: no reconstructions held
    msgs = list(restarted.configure_train(4, arrays, ConfigRecord(), grid))
    assert [str(m.content["config"]["download-kind"]) for m in msgs] == ["full", "full"]


def test_a_member_that_missed_a_round_gets_a_full_copy(tmp_path):
    """No reply (a failed member) means no acknowledgement: the hub no longer assumes what the member
    holds, and its next download is a full copy; the others keep getting deltas."""
    s = strategy(2)
    grid = InProcessGrid(None, [11, 12], {})
    msgs = list(s.configure_train(1, initial(), ConfigRecord(), grid))
    acked = Message(RecordDict({"arrays": ArrayRecord(), "metrics": MetricRecord(
        {"num-examples": 0, "download-applied": 1})}), reply_to=msgs[0])
    s.aggregate_train(1, [acked])  # node 12 never replied
    replied = int(msgs[0].metadata.dst_node_id)
    assert set(s.held) == {replied}
    again = {int(m.metadata.dst_node_id): str(m.content["config"]["download-kind"])
             for m in s.configure_train(2, initial(), ConfigRecord(), grid)}
    assert again == {nid: "delta" if nid == replied else "full" for nid in (11, 12)}
    with pytest.raises(ValueError, match="download codec"):
        strategy(2, "int4")


def _sim_train(msg: Message, context) -> Message:
    """A member of the simulation test: a fixed random change of whatever global it was handed."""
    glob = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    rnd, pid = int(msg.content["config"]["server-round"]), int(context.node_config["partition-id"])
    rng = np.random.default_rng([rnd, pid])
    delta = {k + ".raw": (1e-2 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in glob.items()}
    metrics = MetricRecord({"num-examples": 10, "uploaded": 1, "bytes-up": nbytes(delta),
                            "bytes-down": nbytes(glob), "bytes-down-fp32": nbytes(glob),
                            "bytes-up-fp32": nbytes(delta)})
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in delta.items()}),
                               "metrics": metrics}), reply_to=msg)


def _sim_apps():
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    from fedsched.agent.federation.mods import codec_mod, download_mod, run_config_defaults_mod

    client = ClientApp(mods=[run_config_defaults_mod])
    client.train(mods=[download_mod, codec_mod])(_sim_train)
    server = ServerApp()

    @server.main()
    def main(grid, context) -> None:
        from pathlib import Path

        s = strategy(3)
        sent: dict[int, dict] = {}

        def record(rnd: int, arrays: ArrayRecord) -> None:
            sent[rnd] = {k: v.numpy() for k, v in arrays.items()}

        s.start(grid=grid, initial_arrays=initial(), num_rounds=2, train_config=ConfigRecord(),
                evaluate_fn=record)
        out = Path("hub")
        out.mkdir()
        np.savez(out / "sent.npz", **{k: v for k, v in sent[1].items()})  # what round 2 sent
        np.savez(out / "start.npz", **{k: v for k, v in sent[0].items()})  # what round 1 sent, in full
        reports = {r: rep.members for r, rep in s.reports.items()}
        (out / "reports.json").write_text(json.dumps(reports))
        (out / "held.json").write_text(json.dumps(sorted(set(s.held.values()))))

    return server, client


def test_through_flowers_simulation_runtime_downloads_are_int8_and_members_track_the_global(tmp_path,
                                                                                            monkeypatch):
    """flwr.simulation.run_simulation (the runtime's own message transport and node ids): after round
    1 every member receives under 0.3x the float32 bytes, and what each holds after round 2 is
    the hub's record of it bit for bit, within half a step of the global the hub sent."""
    from flwr.simulation import run_simulation

    monkeypatch.chdir(tmp_path)
    server, client = _sim_apps()
    run_simulation(server_app=server, client_app=client, num_supernodes=3,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2}})
    reports = json.loads((tmp_path / "hub" / "reports.json").read_text())
    assert sorted(reports) == ["1", "2"] and all(len(reports[r]) == 3 for r in reports)
    for rnd in ("2",):
        for m in reports[rnd].values():
            assert m["download-applied"] == 1 and m["bytes-down"] < 0.3 * m["bytes-down-fp32"]
    sent = dict(np.load(tmp_path / "hub" / "sent.npz"))
    start = dict(np.load(tmp_path / "hub" / "start.npz"))  # every member's exact copy after round 1
    state_dir = tmp_path / str(MemberRunConfig.defaults().state_dir)
    holders = sorted(state_dir.iterdir())
    assert len(holders) == 3
    hub_held = json.loads((tmp_path / "hub" / "held.json").read_text())
    assert len(hub_held) == 1  # every member applied every round: one shared reconstruction
    for d in holders:
        held = load_npz(d / f"{DOWNLOAD_STATE}.npz")
        assert held is not None and digest(held) == hub_held[0]  # the hub knows it bit for bit
        for k, g in sent.items():  # within half an INT8 step of the round-2 delta from that copy
            step = np.abs(g - start[k]).max() / 127  # per tensor: at least every output channel's step
            assert np.abs(g - held[k]).max() <= step / 2 + 1e-7, k


def test_the_download_mods_state_directory_is_the_members():
    """The mod finds the member's state directory without building its cluster: the same one."""
    from fedsched.agent.federation.round import load_member

    cfg = MemberRunConfig.defaults()
    for pid in range(5):
        assert member_state({"partition-id": pid}, cfg).dir == load_member({"partition-id": pid}, cfg)[1].dir


@pytest.mark.parametrize("applied", [float("inf"), float("-inf"), float("nan"), 1e300, 0.5])
def test_a_hostile_acknowledgement_is_no_acknowledgement(applied: float) -> None:
    """``download-applied`` is the member's own report: inf (once an OverflowError out of the hub's
    round), NaN, a huge or a fractional value acknowledge nothing; the hub sends a full copy next."""
    s = strategy(2)
    grid = InProcessGrid(None, [11, 12], {})
    msgs = list(s.configure_train(1, initial(), ConfigRecord(), grid))
    replies = [Message(RecordDict({"arrays": ArrayRecord(), "metrics": MetricRecord(
        {"num-examples": 0, "download-applied": value})}), reply_to=m)
        for m, value in zip(msgs, (applied, 1), strict=True)]
    s.aggregate_train(1, replies)
    honest = int(msgs[1].metadata.dst_node_id)
    assert set(s.held) == {honest}
    kinds = {int(m.metadata.dst_node_id): str(m.content["config"]["download-kind"])
             for m in s.configure_train(2, initial(), ConfigRecord(), grid)}
    assert kinds == {nid: "delta" if nid == honest else "full" for nid in (11, 12)}
