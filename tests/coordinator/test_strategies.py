"""Hub strategies: INT8 deltas dequantised before Flower's aggregation, validation, zero-example rounds."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsched.common.federation.codec import ErrorFeedback, encode_int8
from fedsched.coordinator.strategies import make_strategy


@pytest.fixture(autouse=True)
def _task_identity():
    # Building Messages outside a Flower runtime needs an identity (reference section 5).
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield


class ThreeNodes:
    """The part of Flower's Grid that node sampling reads: the connected node ids."""

    def get_node_ids(self):
        return [11, 12, 13]


GLOBAL = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(4, np.float32)}


def send(strategy, config=None):
    arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    return list(strategy.configure_train(1, arrays, config or ConfigRecord({"lr": 0.1}), ThreeNodes()))


def reply(to: Message, delta: dict, n: float, codec=encode_int8) -> Message:
    enc = codec(delta)
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in enc.items()}),
                          "metrics": MetricRecord({"num-examples": n, "reward": 1.0})})
    return Message(content, reply_to=to)


def deltas(seed: int, scale: float = 0.1) -> dict:
    rng = np.random.default_rng(seed)
    return {k: (rng.normal(size=v.shape) * scale).astype(np.float32) for k, v in GLOBAL.items()}


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_dequantised_aggregation_equals_the_fp32_weighted_mean(name):
    s = make_strategy(name, min_available_nodes=3, min_train_nodes=3)
    msgs = send(s)
    ds, ns = [deltas(i) for i in range(3)], [10.0, 30.0, 60.0]
    arrays, metrics = s.aggregate_train(1, [reply(m, d, n) for m, d, n in zip(msgs, ds, ns, strict=True)])
    expected = {k: GLOBAL[k] + sum(n * d[k] for d, n in zip(ds, ns, strict=True)) / sum(ns) for k in GLOBAL}
    for k in GLOBAL:
        step = max(float(np.abs(d[k]).max()) for d in ds) / 127
        np.testing.assert_allclose(arrays[k].numpy(), expected[k], atol=step)
    assert metrics["reward"] == pytest.approx(1.0)
    assert s.rejections[1] == [] and s.skipped[1] == []


def test_bad_updates_are_rejected_with_node_and_reason_and_the_round_goes_on():
    s = make_strategy("fedavg", min_available_nodes=3, min_train_nodes=3)
    msgs = send(s)
    good = deltas(0)
    nan = deltas(1)
    nan["w"][0, 0] = np.nan
    huge = {k: v * 1e4 for k, v in deltas(2).items()}
    replies = [reply(msgs[0], good, 10), reply(msgs[1], huge, 10)]
    # NaN cannot be int8-encoded: a member that sends raw float garbage under the .q/.scale keys
    def raw_floats(d):
        out = {}
        for k, v in d.items():
            out[k + ".q"], out[k + ".scale"] = v, np.array(1.0, np.float32)
        return out

    replies.append(reply(msgs[2], nan, 10, codec=raw_floats))
    arrays, _ = s.aggregate_train(1, replies)
    reasons = {r["node"]: r["reason"] for r in s.rejections[1]}
    node = [m.metadata.dst_node_id for m in msgs]  # sampling shuffles the node order
    assert set(reasons) == {node[1], node[2]}
    assert "norm" in reasons[node[1]] and "NaN" in reasons[node[2]]
    np.testing.assert_allclose(arrays["w"].numpy(), GLOBAL["w"] + good["w"], atol=0.1 / 127 * 4)


def test_shape_mismatch_and_zero_example_rounds():
    s = make_strategy("fedavg", min_available_nodes=3, min_train_nodes=3)
    msgs = send(s)
    wrong = {"w": np.zeros((3, 2), np.float32), "b": np.zeros(4, np.float32)}
    replies = [reply(msgs[0], wrong, 10), reply(msgs[1], deltas(1), 0), reply(msgs[2], deltas(2), 0)]
    arrays, metrics = s.aggregate_train(1, replies)
    node = [m.metadata.dst_node_id for m in msgs]
    assert s.rejections[1][0]["node"] == node[0] and "shape" in s.rejections[1][0]["reason"]
    assert sorted(s.skipped[1]) == sorted(node[1:])
    for k in GLOBAL:  # nothing usable: the global model is kept
        np.testing.assert_array_equal(arrays[k].numpy(), GLOBAL[k])
    assert metrics is None


def test_config_is_copied_rounds_are_offset_and_fedprox_sends_mu():
    shared = ConfigRecord({"lr": 0.1})
    s = make_strategy("fedprox", proximal_mu=0.05, round_offset=4, min_available_nodes=3, min_train_nodes=3)
    msgs = send(s, shared)
    cfg = msgs[0].content["config"]
    assert cfg["server-round"] == 5 and cfg["proximal-mu"] == pytest.approx(0.05)
    assert "server-round" not in shared and "proximal-mu" not in shared
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("fedsgd")


def test_error_feedback_uploads_average_correctly_over_rounds():
    s = make_strategy("fedavg", min_available_nodes=3, min_train_nodes=3)
    efs = [ErrorFeedback() for _ in range(3)]
    total = {k: np.zeros_like(v) for k, v in GLOBAL.items()}
    for rnd in range(5):
        msgs = send(s)
        ds = [deltas(10 * rnd + i, scale=0.01) for i in range(3)]
        arrays, _ = s.aggregate_train(1, [reply(m, d, 1.0, codec=ef.encode)
                                          for m, d, ef in zip(msgs, ds, efs, strict=True)])
        for k in GLOBAL:
            total[k] += sum(d[k] for d in ds) / 3
            moved = arrays[k].numpy() - GLOBAL[k]
            # each round aggregates relative to GLOBAL here; the mean of the sent deltas
            assert np.abs(moved - sum(d[k] for d in ds) / 3).max() < 0.05
