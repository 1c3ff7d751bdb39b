"""A deployed member's own cluster from its node config: the recording replays at the load it
offered, on its cluster's time scale, and a recording that offers none is a clear error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedsched.common.federation.members import member_from_node_config, recorded_load
from fedsched.common.model.synthetic import write_csvs
from fedsched.common.schedulers import SchedulerContext
from fedsched.common.sim.evaluate import make_policy
from fedsched.common.sim.replay import ReplayConfig, run_replay
from tests.common.sim.test_replay_usage import nodes_of, pods_of


def recording(n: int, cpu: int, start: float, life: float) -> tuple:
    creation = start + np.arange(n) * 10.0
    pods = pods_of(np.full(n, cpu), np.full(n, 256), np.ones(n, dtype=np.int64), creation=creation)
    return pods.__class__(**{**pods.__dict__, "deletion": creation + life})


@pytest.mark.parametrize(("cpu", "life"), [(1000, 1000.0), (500, 1000.0), (250, 400.0)])
def test_recorded_load_is_the_time_averaged_requested_share(cpu, life) -> None:
    # 400 pods arriving every 10 s (the last at 3990 s), each staying `life` seconds: over
    # [0, last arrival] the running count ramps up for `life` seconds, then holds at life / 10
    nodes = nodes_of([25_000] * 4, [10**6] * 4)
    pods = recording(400, cpu, 1.7e9, life)
    want = (life / 10.0) * cpu / 100_000 * (1.0 - life / 2.0 / 3990.0)
    assert recorded_load(pods, nodes) == pytest.approx(want, rel=0.01)


def test_member_from_a_recording_replays_at_the_recorded_load(tmp_path) -> None:
    nodes = nodes_of([25_000] * 4, [10**6] * 4)
    pods = recording(600, 500, 1.7e9, 1000.0)
    nodes_csv, pods_csv = write_csvs(nodes, pods, tmp_path, "rec")
    member = member_from_node_config({"cluster-name": "edge-1", "nodes-csv": str(nodes_csv),
                                      "pods-csv": str(pods_csv)})
    assert member is not None and member.name == "edge-1"
    assert member.replay["target_load"] == pytest.approx(recorded_load(pods, nodes))
    assert 0.4 < member.replay["target_load"] < 0.6
    assert len(member.train) + len(member.val) + len(member.test) == 600
    assert member_from_node_config({"cluster-name": "x"}) is None


def test_a_recording_without_load_is_refused() -> None:
    nodes = nodes_of([25_000], [10**6])
    pods = recording(1, 500, 1.7e9, 0.0)
    with pytest.raises(ValueError, match="offers no measurable load"):
        recorded_load(pods, nodes)


def test_a_compressed_recording_is_judged_on_its_clusters_time_scale(tmp_path) -> None:
    # a recording whose clock ran 120x fast (the kwok fleet's): a 2-core pod at 95% of its request
    # every 30 s of the cluster's life, each living 30 minutes there (15 s on the recorded clock)
    speed, n = 120.0, 1200
    nodes = nodes_of([16_000] * 8, [10**6] * 8)
    creation = 1.7e9 + np.arange(n) * 30.0 / speed
    pods = dataclasses.replace(
        pods_of(np.full(n, 2000), np.full(n, 256), np.ones(n, dtype=np.int64), creation=creation),
        deletion=creation + 1800.0 / speed, cpu_use=np.full(n, 1900.0), mem_use=np.full(n, 200.0))
    nodes_csv, pods_csv = write_csvs(nodes, pods, tmp_path, "rec")
    config = {"nodes-csv": str(nodes_csv), "pods-csv": str(pods_csv)}
    hot = {}
    for s in (1.0, speed):
        member = member_from_node_config({**config, "recording-speed": s})
        assert member is not None
        recorded = member_from_node_config(config)
        assert np.allclose(member.train.creation, recorded.train.creation * s)
        assert np.allclose(member.val.deletion - member.val.creation,
                           (recorded.val.deletion - recorded.val.creation) * s)
        assert member.replay["target_load"] == pytest.approx(recorded.replay["target_load"])
        kube = make_policy("kube-default", SchedulerContext(rng=np.random.default_rng(0)), "replay")
        res = run_replay(member.nodes, member.val, kube, seed=1,
                         config=ReplayConfig(**member.replay, allow_unreachable_load=True))
        hot[s] = res.metrics["hot_cpu_node_s"]
    # on the recorded clock no 5-minute mean is ever hot; stretched back, the loaded twin is
    assert hot[1.0] == 0.0 and hot[speed] > 3600.0


@pytest.mark.parametrize("bad", ["fast", 0, -2.0, float("nan"), float("inf"), None])
def test_a_bad_recording_speed_is_refused(tmp_path, bad) -> None:
    nodes = nodes_of([25_000] * 4, [10**6] * 4)
    nodes_csv, pods_csv = write_csvs(nodes, recording(600, 500, 1.7e9, 1000.0), tmp_path, "rec")
    with pytest.raises(ValueError, match="recording-speed must be"):
        member_from_node_config({"nodes-csv": str(nodes_csv), "pods-csv": str(pods_csv),
                                 "recording-speed": bad})
