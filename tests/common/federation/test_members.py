"""A deployed member's own cluster from its node config: the recording replays at the load it
offered, and a recording that offers none is a clear error."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.federation.members import member_from_node_config, recorded_load
from fedsched.common.model.synthetic import write_csvs
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
