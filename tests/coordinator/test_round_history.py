"""The hub's round history (``rounds.json``) under members' own reports: a member's made-up
partition (NaN, a fraction, another member's) neither stops the hub nor hides another member's
row, and the weights the hub clipped, the updates it rescaled and every update's norm are recorded."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsched.common.federation.codec import encode_int8
from fedsched.coordinator.evaluation import HubRecorder, member_keys
from fedsched.coordinator.strategies import RoundReport, make_strategy


@pytest.fixture(autouse=True)
def _task_identity():
    # Building Messages outside a Flower runtime needs flwr's TaskIdentity (run, node and task ids).
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield


@pytest.mark.parametrize(("partitions", "want"), [
    ({11: 0.0, 12: 1.0, 13: 2.0}, {11: "0", 12: "1", 13: "2"}),
    ({11: 0.0, 12: math.nan, 13: 2.0}, {11: "0", 12: "12", 13: "2"}),
    ({11: 0.0, 12: math.inf, 13: -math.inf}, {11: "0", 12: "12", 13: "13"}),
    ({11: 0.0, 12: 0.5, 13: None}, {11: "0", 12: "12", 13: "13"}),  # a fraction; no partition at all
    ({11: 1.0, 12: 1.0, 13: 2.0}, {11: "1", 12: "12", 13: "2"}),  # the same partition twice: one row each
])
def test_member_keys(partitions, want):
    members = {n: ({} if p is None else {"partition": p}) for n, p in partitions.items()}
    report = RoundReport(1, members=members)
    assert member_keys(report) == want


class ThreeNodes:
    def get_node_ids(self):
        return [11, 12, 13]


def test_a_made_up_partition_weight_and_norm_are_recorded_and_the_hub_goes_on(tmp_path):
    s = make_strategy("fedavg", norm_bound=5.0, fraction_train=1.0, min_train_nodes=3, min_available_nodes=3,
                      weight_bound=10.0, norm_action="rescale")
    global_w = {"w": np.zeros((2, 3), np.float32)}
    msgs = list(s.configure_train(1, ArrayRecord({k: Array(v) for k, v in global_w.items()}),
                                  ConfigRecord({}), ThreeNodes()))
    claims = [(10.0, 0.0, 0.1), (10.0, 1.0, 0.1), (1e9, math.nan, 1e3)]  # (num-examples, partition, update)
    replies = []
    for m, (n, part, value) in zip(msgs, claims, strict=True):
        enc = encode_int8({"w": np.full((2, 3), value, np.float32)})
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in enc.items()}),
                              "metrics": MetricRecord({"num-examples": n, "partition": part})})
        replies.append(Message(content, reply_to=m))
    arrays, _ = s.aggregate_train(1, replies)
    recorder = HubRecorder(tmp_path, s, lambda w: {"trouble_score": 0.0}, resumed_from=0)
    recorder(1, arrays)
    entry = json.loads((tmp_path / "rounds.json").read_text())[0]
    liar = str(int(msgs[2].metadata.dst_node_id))
    assert sorted(entry["members"]) == sorted(["0", "1", liar])
    assert entry["clipped"] == {liar: {"claimed": 1e9, "counted": 100.0}}
    honest = 0.1 * math.sqrt(6)
    assert entry["norms"] == pytest.approx({"0": honest, "1": honest, liar: 1e4 * honest}, rel=1e-3)
    assert entry["rescaled"] == {liar: pytest.approx({"norm": 1e4 * honest, "counted": honest}, rel=1e-3)}
