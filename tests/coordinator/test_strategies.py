"""Hub strategies: INT8 deltas dequantised before Flower's aggregation, validation, zero-example rounds,
the explicit subclasses' argument checks and summaries, one round numbering on a resumed hub, and
replies built new."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedProx, FedTrimmedAvg, Krum
from flwr.supercore.task_identity import TaskIdentity
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.federation.codec import ErrorFeedback, encode_int8
from fedsched.common.federation.weights import weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.coordinator.strategies import (
    STRATEGIES,
    QuantizedFedAvg,
    QuantizedFedProx,
    QuantizedFedTrimmedAvg,
    QuantizedKrum,
    QuantizedUpdates,
    make_strategy,
)


@pytest.fixture(autouse=True)
def _task_identity():
    # Building Messages outside a Flower runtime needs flwr's TaskIdentity (run, node and task ids).
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield


class ThreeNodes:
    """The part of Flower's Grid that node sampling reads: the connected node ids."""

    def get_node_ids(self):
        return [11, 12, 13]


# The arguments with a run-config key have no default (pyproject holds it): the tests' values.
SETTINGS = {"norm_bound": 5.0, "fraction_train": 1.0, "min_train_nodes": 3, "min_available_nodes": 3}


def strategy(name: str, **kwargs):
    own = {"proximal_mu": 0.01} if name == "fedprox" else {}
    return make_strategy(name, **{**SETTINGS, **own, **kwargs})


GLOBAL = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(4, np.float32)}


def send(strategy, config=None, server_round: int = 1):
    arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    config = config or ConfigRecord({"lr": 0.1})
    return list(strategy.configure_train(server_round, arrays, config, ThreeNodes()))


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
    s = strategy(name)
    msgs = send(s)
    ds, ns = [deltas(i) for i in range(3)], [10.0, 30.0, 60.0]
    arrays, metrics = s.aggregate_train(1, [reply(m, d, n) for m, d, n in zip(msgs, ds, ns, strict=True)])
    expected = {k: GLOBAL[k] + sum(n * d[k] for d, n in zip(ds, ns, strict=True)) / sum(ns) for k in GLOBAL}
    for k in GLOBAL:
        step = max(float(np.abs(d[k]).max()) for d in ds) / 127
        np.testing.assert_allclose(arrays[k].numpy(), expected[k], atol=step)
    assert metrics["reward"] == pytest.approx(1.0)
    report = s.reports[1]
    assert report.rejected == [] and report.skipped == []
    assert sorted(report.kept) == [11, 12, 13] and report.train_metrics["reward"] == pytest.approx(1.0)


def test_bad_updates_are_rejected_with_node_and_reason_and_the_round_goes_on():
    s = strategy("fedavg")
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
    reasons = {r.node: r.reason for r in s.reports[1].rejected}
    node = [m.metadata.dst_node_id for m in msgs]  # sampling shuffles the node order
    assert set(reasons) == {node[1], node[2]}
    assert "norm" in reasons[node[1]] and "NaN" in reasons[node[2]]
    assert s.reports[1].kept == [node[0]]
    np.testing.assert_allclose(arrays["w"].numpy(), GLOBAL["w"] + good["w"], atol=0.1 / 127 * 4)


def _norm(d: dict) -> float:
    return math.sqrt(sum(float(np.square(v, dtype=np.float64).sum()) for v in d.values()))


@pytest.mark.parametrize("factor", [10.0, 1e4, 1e30])
def test_an_update_above_the_norm_bound_is_rescaled_to_the_others_median_norm_and_kept(factor):
    """``norm_action="rescale"``: the over-bound update counts in its own direction at the median
    norm of the round's other updates (reported with both norms); the others count as sent. 1e30
    times: its float32 squares overflow, so the norm is taken in float64 (a norm of inf made
    the update zero)."""
    s = strategy("fedavg", norm_action="rescale")
    msgs = send(s)
    node = [m.metadata.dst_node_id for m in msgs]
    good, other, honest = deltas(0), deltas(3, scale=0.2), deltas(2)
    boosted = {k: v * np.float32(factor) for k, v in honest.items()}
    arrays, _ = s.aggregate_train(1, [reply(msgs[0], good, 10), reply(msgs[1], boosted, 10),
                                      reply(msgs[2], other, 10)])
    report = s.reports[1]
    assert report.rejected == [] and sorted(report.kept) == sorted(node)
    median = float(np.median([report.norms[node[0]], report.norms[node[2]]]))
    sent, counted = report.rescaled[node[1]]
    assert sent == pytest.approx(_norm(boosted), rel=0.02) and counted == pytest.approx(median)
    assert set(report.rescaled) == {node[1]}
    scaled = {k: v * (median / _norm(honest)) for k, v in honest.items()}
    for k in GLOBAL:
        expected = GLOBAL[k] + (good[k] + scaled[k] + other[k]) / 3
        np.testing.assert_allclose(arrays[k].numpy(), expected, atol=0.01)


def test_with_a_norm_bound_below_1_an_update_is_rescaled_down_to_the_bound_never_up():
    s = strategy("fedavg", norm_action="rescale", norm_bound=0.5)
    msgs = send(s)
    node = [m.metadata.dst_node_id for m in msgs]
    ds = [deltas(0), deltas(1, scale=0.08), deltas(2)]  # the second is above 0.5 x the others' median
    s.aggregate_train(1, [reply(m, d, 10) for m, d in zip(msgs, ds, strict=True)])
    report = s.reports[1]
    sent, counted = report.rescaled[node[1]]
    others = float(np.median([report.norms[node[0]], report.norms[node[2]]]))
    assert counted == pytest.approx(0.5 * others) and counted < sent < others


@pytest.mark.parametrize(("action", "kept"), [("rescale", 3), ("reject", 2)])
def test_the_norm_action_decides_whether_an_over_bound_update_counts(action, kept):
    s = strategy("fedavg", norm_action=action)
    msgs = send(s)
    huge = {k: v * np.float32(1e4) for k, v in deltas(2).items()}
    s.aggregate_train(1, [reply(msgs[0], deltas(0), 10), reply(msgs[1], huge, 10),
                          reply(msgs[2], deltas(3), 10)])
    report = s.reports[1]
    assert len(report.kept) == kept and len(report.rescaled) == kept - 2 and len(report.rejected) == 3 - kept
    assert set(report.norms) == {m.metadata.dst_node_id for m in msgs}  # every decoded update's norm


class FiveNodes:
    def get_node_ids(self):
        return [11, 12, 13, 14, 15]


def _round_with_claims(name: str, claims: list[float], **kwargs):
    """One round of five members: the first four send the same honest update ``d``, the fifth
    ``2 d`` (the same direction, twice the norm: every check passes it), each with its claimed
    weight. Returns (the report, the nodes in member order, the fifth's share of the aggregate:
    the global moved by ``(1 + share) d``)."""
    s = strategy(name, min_train_nodes=5, min_available_nodes=5, **kwargs)
    arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    msgs = list(s.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), FiveNodes()))
    d = {k: np.full_like(v, 0.5) for k, v in GLOBAL.items()}  # INT8 encodes it exactly
    ds = [d] * 4 + [{k: 2 * v for k, v in d.items()}]
    out, _ = s.aggregate_train(1, [reply(m, u, n) for m, u, n in zip(msgs, ds, claims, strict=True)])
    moved = out["w"].numpy() - GLOBAL["w"] if out is not None else None
    share = float(moved.mean() / 0.5 - 1.0) if moved is not None else None
    return s.reports[1], [int(m.metadata.dst_node_id) for m in msgs], share, moved


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedtrimmedavg", "krum"])
@pytest.mark.parametrize("claim", [math.nan, math.inf, -math.inf, -3.0])
def test_a_weight_that_is_not_a_finite_count_is_rejected(name, claim):
    """Before the check, one member's NaN (or infinite) num-examples made the FedAvg, FedProx and
    Krum aggregates NaN: the global model, and every member's personalised one, for good."""
    report, node, _, moved = _round_with_claims(name, [10, 10, 10, 10, claim], weight_bound=10.0)
    assert [r.node for r in report.rejected] == [node[4]]
    assert "num-examples must be a finite number >= 0" in report.rejected[0].reason
    assert sorted(report.kept) == sorted(node[:4])
    np.testing.assert_allclose(moved, 0.5, atol=1e-6)  # the four honest members' model


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
@pytest.mark.parametrize(("claims", "bound", "want_share", "clipped"), [
    # honest, different sizes: nobody is near 10x the others' median; the plain weighted mean
    ([1000, 1000, 100, 100, 1000], 10.0, 1000 / 3200, False),
    ([100, 100, 100, 100, 1000], 10.0, 1000 / 1400, False),  # exactly at the bound counts as it is
    # a made-up billion counts as 10 median members; without the bound it is the whole model
    ([10, 10, 10, 10, 1e9], 10.0, 100 / 140, True),
    ([10, 10, 10, 10, 1e9], math.inf, 1e9 / (1e9 + 40), False),
    ([10, 10, 10, 10, 1e9], 1.0, 10 / 50, True),  # bound 1: at most one median member
])
def test_a_claimed_weight_counts_at_most_bound_times_the_others_median(name, claims, bound, want_share,
                                                                        clipped):
    report, node, share, _ = _round_with_claims(name, claims, weight_bound=bound)
    assert report.rejected == [] and len(report.kept) == 5
    assert share == pytest.approx(want_share, abs=1e-5)
    if clipped:
        median = float(np.median(claims[:4]))
        assert report.clipped == {node[4]: (claims[4], bound * median)}
    else:
        assert report.clipped == {}


@settings(max_examples=60, deadline=None)
@given(honest=st.lists(st.floats(1, 5000), min_size=4, max_size=4),
       claim=st.floats(0, 1e300, exclude_min=True), bound=st.sampled_from([1.0, 3.0, 10.0]))
def test_one_member_moves_the_aggregate_at_most_as_bound_median_members_would(honest, claim, bound):
    """Whatever one member claims, it counts as at most ``bound`` x the others' median weight
    (every member's claim is bounded alike, the honest ones' too), and its share of the FedAvg
    aggregate is its counted weight over all counted weights."""
    claims = [*honest, claim]
    _, _, share, _ = _round_with_claims("fedavg", claims, weight_bound=bound)
    counted = [min(w, bound * float(np.median(claims[:i] + claims[i + 1:]))) for i, w in enumerate(claims)]
    assert counted[4] <= bound * float(np.median(honest))
    assert share == pytest.approx(counted[4] / sum(counted), abs=1e-4)


def _round_of_five(floor: float | None, flipped: bool = True):
    """Four members whose updates share a direction (plus their own noise) and a fifth that sends
    its own update sign-flipped."""
    kwargs = {} if floor is None else {"cosine_floor": floor}
    s = strategy("fedavg", min_train_nodes=5, min_available_nodes=5, **kwargs)
    arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    msgs = list(s.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), FiveNodes()))
    shared = deltas(100)
    ds = [{k: shared[k] + 0.3 * deltas(i)[k] for k in GLOBAL} for i in range(5)]
    if flipped:
        ds[4] = {k: -v for k, v in ds[4].items()}
    s.aggregate_train(1, [reply(m, d, 10) for m, d in zip(msgs, ds, strict=True)])
    return s.reports[1], [int(m.metadata.dst_node_id) for m in msgs]


@pytest.mark.parametrize(("floor", "rejected"), [(None, False), (-1.0, False), (0.0, True), (0.5, True)])
def test_a_sign_flipped_update_points_away_from_the_others(floor, rejected):
    """Every update's cosine to the median of the round's other updates is reported; below
    ``cosine_floor`` the update is rejected with that reason (the default, -1, rejects none)."""
    report, node = _round_of_five(floor)
    flipper = node[4]
    assert set(report.cosines) == set(node)
    assert report.cosines[flipper] < -0.5 and all(report.cosines[n] > 0.5 for n in node[:4])
    if rejected:
        assert [r.node for r in report.rejected] == [flipper] and "cosine" in report.rejected[0].reason
        assert sorted(report.kept) == sorted(node[:4])
    else:
        assert report.rejected == [] and len(report.kept) == 5
    clean, _ = _round_of_five(0.5, flipped=False)  # honest members with their own noise all pass
    assert clean.rejected == [] and min(clean.cosines.values()) > 0.5


def _round_of_offsets(floor: float):
    """Five personalised members whose updates are their own offsets from the global, which is
    about their mean: two GPU clusters pull one way, three CPU clusters the other (each with its
    own noise), centred, so no update shares a direction with the others' median."""
    s = strategy("fedavg", min_train_nodes=5, min_available_nodes=5, cosine_floor=floor)
    arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    msgs = list(s.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), FiveNodes()))
    pull = deltas(100)
    raw = [{k: (1.0 if i < 2 else -2 / 3) * pull[k] + 0.3 * deltas(200 + i)[k] for k in GLOBAL}
           for i in range(5)]
    mean = {k: np.mean([d[k] for d in raw], axis=0) for k in GLOBAL}
    ds = [{k: (d[k] - mean[k]).astype(np.float32) for k in GLOBAL} for d in raw]
    s.aggregate_train(1, [reply(m, d, 10) for m, d in zip(msgs, ds, strict=True)])
    return s.reports[1]


def test_without_a_shared_direction_no_update_is_rejected_for_its_direction():
    """Centred offsets (what personalised members send from a converged start) point away from
    each other's median: at the default floor every honest one would be rejected. The check
    applies only where the round's updates share a direction, and the report says it did not."""
    report = _round_of_offsets(-0.3)
    assert max(report.cosines.values()) < -0.3  # what the check would have rejected
    assert report.direction_checked is False and report.rejected == [] and len(report.kept) == 5
    shared, _ = _round_of_five(-0.3)  # with a shared direction the flipped update is still caught
    assert shared.direction_checked is True and len(shared.rejected) == 1


def test_with_two_updates_there_is_no_direction_check():
    s = strategy("fedavg", min_train_nodes=2, min_available_nodes=2, cosine_floor=0.9)
    msgs = send(s)[:2]
    d = deltas(0)
    s.aggregate_train(1, [reply(msgs[0], d, 10), reply(msgs[1], {k: -v for k, v in d.items()}, 10)])
    assert s.reports[1].cosines == {} and s.reports[1].rejected == [] and len(s.reports[1].kept) == 2


def test_shape_mismatch_and_zero_example_rounds():
    s = strategy("fedavg")
    msgs = send(s)
    wrong = {"w": np.zeros((3, 2), np.float32), "b": np.zeros(4, np.float32)}
    replies = [reply(msgs[0], wrong, 10), reply(msgs[1], deltas(1), 0), reply(msgs[2], deltas(2), 0)]
    arrays, metrics = s.aggregate_train(1, replies)
    node = [m.metadata.dst_node_id for m in msgs]
    report = s.reports[1]
    assert report.rejected[0].node == node[0] and "shape" in report.rejected[0].reason
    assert sorted(report.skipped) == sorted(node[1:])
    for k in GLOBAL:  # nothing usable: the global model is kept
        np.testing.assert_array_equal(arrays[k].numpy(), GLOBAL[k])
    assert metrics is None and report.train_metrics is None


def test_config_is_copied_rounds_are_offset_and_fedprox_sends_mu():
    shared = ConfigRecord({"lr": 0.1})
    s = strategy("fedprox", proximal_mu=0.05, round_offset=4)
    assert isinstance(s, QuantizedFedProx) and isinstance(s, FedProx)
    msgs = send(s, shared)
    cfg = msgs[0].content["config"]
    assert cfg["server-round"] == 5 and cfg["proximal-mu"] == pytest.approx(0.05)
    assert "server-round" not in shared and "proximal-mu" not in shared
    with pytest.raises(ValueError, match="unknown strategy"):
        strategy("fedsgd")
    with pytest.raises(TypeError):  # FedAvg has no proximal term
        strategy("fedavg", proximal_mu=0.05)
    with pytest.raises(TypeError):  # the run-config-backed arguments have no default in code
        QuantizedFedProx(norm_bound=5.0, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)


def test_error_feedback_uploads_average_correctly_over_rounds():
    s = strategy("fedavg")
    efs = [ErrorFeedback() for _ in range(3)]
    for rnd in range(5):
        msgs = send(s)
        ds = [deltas(10 * rnd + i, scale=0.01) for i in range(3)]
        arrays, _ = s.aggregate_train(1, [reply(m, d, 1.0, codec=ef.encode)
                                          for m, d, ef in zip(msgs, ds, efs, strict=True)])
        for k in GLOBAL:
            moved = arrays[k].numpy() - GLOBAL[k]
            # each round aggregates relative to GLOBAL here; the mean of the sent deltas
            assert np.abs(moved - sum(d[k] for d in ds) / 3).max() < 0.05


def test_each_name_is_an_explicit_subclass_of_flowers_strategy():
    parents = {"fedavg": FedAvg, "fedprox": FedProx, "fedtrimmedavg": FedTrimmedAvg, "krum": Krum}
    assert set(STRATEGIES) == set(parents)
    for name, parent in parents.items():
        cls = STRATEGIES[name]
        assert issubclass(cls, QuantizedUpdates) and issubclass(cls, parent)
        assert cls.__mro__[1] is QuantizedUpdates  # the INT8 layer runs before the parent's code
        assert cls.__name__ == f"Quantized{parent.__name__}"


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("fedavg", {"norm_bound": 0.0}, "norm_bound"),
    ("fedavg", {"norm_bound": math.nan}, "norm_bound"),
    ("fedavg", {"norm_action": "clip"}, "norm_action"),
    ("fedavg", {"round_offset": -1}, "round_offset"),
    ("fedavg", {"cosine_floor": 1.5}, "cosine_floor"),
    ("fedavg", {"cosine_floor": math.nan}, "cosine_floor"),
    ("fedavg", {"weight_bound": 0.0}, "weight_bound"),
    ("fedavg", {"weight_bound": math.nan}, "weight_bound"),
    ("fedavg", {"round_offset": 1.5}, "round_offset"),
    ("fedavg", {"fraction_train": 1.5}, "fraction_train"),
    ("fedavg", {"fraction_evaluate": -0.1}, "fraction_evaluate"),
    ("fedavg", {"min_train_nodes": -1}, "min_train_nodes"),
    ("fedavg", {"min_available_nodes": -2}, "min_available_nodes"),
    ("fedprox", {"proximal_mu": -0.1}, "proximal_mu"),
    ("fedprox", {"proximal_mu": math.inf}, "proximal_mu"),
    ("fedtrimmedavg", {"beta": 0.5}, "beta"),
    ("krum", {"num_malicious_nodes": -1}, "num_malicious_nodes"),
    ("krum", {"fraction_train": math.nan}, "fraction_train"),
])
def test_arguments_are_checked_with_clear_errors(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        strategy(name, **kwargs)


def test_summary_logs_the_validation_settings_and_the_parents(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    cases = [
        (QuantizedFedAvg(**{**SETTINGS, "norm_bound": 3.0}, round_offset=4, cosine_floor=0.0,
                         weight_bound=10.0),
         ["Norm bound: 3.0", "Round offset: 4", "Fraction: train", "Cosine floor: 0.0",
          "Weight bound: 10.0 x the median num-examples"]),
        (QuantizedFedProx(**SETTINGS, proximal_mu=0.05),
         ["Norm bound: 5.0", "Proximal mu: 0.05", "Minimum nodes"]),
        (QuantizedFedTrimmedAvg(**SETTINGS, beta=0.3),
         ["Round offset: 0", "beta: 0.3", "Weighted by: 'num-examples'"]),
        (QuantizedKrum(**SETTINGS, num_malicious_nodes=1),
         ["Norm bound", "Number of malicious nodes: 1", "ArrayRecord key"]),
    ]
    for strategy, expected in cases:
        caplog.clear()
        strategy.summary()
        text = caplog.text
        for line in expected:
            assert line in text, (type(strategy).__name__, line, text)
        assert text.index("Norm bound") < text.index("Fraction: train")  # ours first, then the parent's


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedtrimmedavg", "krum"])
def test_replies_are_not_mutated(name):
    s = strategy(name)
    msgs = send(s)
    replies = [reply(m, deltas(i), 10.0 * (i + 1)) for i, m in enumerate(msgs)]
    before = [{k: v.numpy().copy() for k, v in r.content["arrays"].items()} for r in replies]
    contents = [r.content for r in replies]
    arrays, _ = s.aggregate_train(1, replies)
    assert arrays is not None and set(arrays) == set(GLOBAL)
    for i, (r, content, was) in enumerate(zip(replies, contents, before, strict=True)):
        assert r.content is content
        now = {k: v.numpy() for k, v in r.content["arrays"].items()}
        assert set(now) == set(was) == {"w.q", "w.scale", "b.q", "b.scale"}
        for k in was:
            np.testing.assert_array_equal(now[k], was[k])
        assert dict(r.content["metrics"]) == {"num-examples": 10.0 * (i + 1), "reward": 1.0}


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedtrimmedavg", "krum"])
@pytest.mark.parametrize(
    ("first", "averaged"),
    [
        ({"num-examples": 10.0, "reward": 1.0, "extra": 5.0}, {"reward"}),  # a key the others lack
        ({"num-examples": 10.0}, set()),  # a key missing
        ({"num-examples": 10.0, "reward": math.nan}, set()),
        ({"num-examples": 10.0, "reward": math.inf}, set()),
        ({"num-examples": 10.0, "reward": 3.0, "partition": -math.inf}, {"reward"}),
    ],
)
def test_a_members_odd_metrics_never_end_the_run(name, first, averaged):
    """Flower ends the run (InconsistentMessageReplies) when replies' metric keys differ, and a
    NaN or inf makes the round's average one: one member (an older agent, or a hostile one) ended
    the federation that way. The round goes on, the model is what the same updates give with
    ordinary metrics, and only the keys every reply has with finite values are averaged."""
    s, clean = strategy(name), strategy(name)
    msgs, clean_msgs = send(s), send(clean)

    def by_node(m: Message) -> Message:  # each node its own update: sampling shuffles the messages
        return reply(m, deltas(int(m.metadata.dst_node_id)), 10.0)

    replies = [by_node(m) for m in msgs]
    content = RecordDict({"arrays": replies[0].content["arrays"], "metrics": MetricRecord(first)})
    replies[0] = Message(content, reply_to=msgs[0])
    arrays, metrics = s.aggregate_train(1, replies)
    want, _ = clean.aggregate_train(1, [by_node(m) for m in clean_msgs])
    assert arrays is not None and want is not None
    for k in GLOBAL:
        np.testing.assert_array_equal(arrays[k].numpy(), want[k].numpy())
    assert s.reports[1].rejected == [] and len(s.reports[1].kept) == 3
    assert set(dict(metrics or {})) == averaged
    assert all(math.isfinite(float(v)) for v in dict(metrics or {}).values())


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedtrimmedavg", "krum"])
def test_the_aggregate_does_not_depend_on_the_order_replies_arrive_in(name):
    """Flower hands replies over as they arrive; the aggregate is the same bits in any order.
    Five members with weights whose float32 sums round differently in another order (the old
    code, which summed in arrival order, gave other bits for the reversed order)."""
    msgs = send(strategy(name, min_train_nodes=3, min_available_nodes=3))
    ns = [1.0, 3.0, 7.0, 11.0, 13.0]

    def replies(order: list[int]) -> list[Message]:
        out = []
        for i in order:
            r = reply(msgs[i % len(msgs)], deltas(i, scale=0.37), ns[i])
            r.content["metrics"]["partition"] = i
            out.append(r)
        return out

    results = []
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        s = strategy(name, min_train_nodes=3, min_available_nodes=3)
        send(s)
        arrays, _ = s.aggregate_train(1, replies(order))
        assert arrays is not None
        results.append({k: v.numpy().copy() for k, v in arrays.items()})
    for other in results[1:]:
        for k in GLOBAL:
            np.testing.assert_array_equal(other[k], results[0][k])


class InProcessGrid:
    """Flower's Grid as Strategy.start uses it (node ids, send and receive), delivering each
    message to the real ClientApp in this process with one persistent Context per node, and
    turning an exception into an error reply as Flower's runtime does."""

    def __init__(self, client_app, node_ids: list[int], run_config: dict) -> None:
        self.app = client_app
        self.contexts = {nid: Context(run_id=1, node_id=nid, node_config={"partition-id": i},
                                      state=RecordDict(), run_config=dict(run_config))
                         for i, nid in enumerate(node_ids)}
        self.sent: list[Message] = []

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            self.sent.append(msg)
            try:
                replies.append(self.app(msg, self.contexts[msg.metadata.dst_node_id]))
            except Exception as e:  # the runtime reports any ClientApp failure as an error reply
                replies.append(Message(Error(code=1, reason=str(e)), reply_to=msg))
        return replies


def test_a_resumed_strategy_numbers_rounds_as_the_federation_does(tmp_path):
    """Four rounds done, two more: the members, the reports, evaluate_fn and the Result all see
    rounds 5 and 6 (and evaluate_fn's initial call the checkpoint's round, 4)."""
    from fedsched.agent.federation.client_app import app as client_app

    tiny = {"local-decisions": 20, "scarce-decisions": 10, "local-epochs": 1, "state-dir": str(tmp_path),
            "member-size": "small"}
    grid = InProcessGrid(client_app, [11, 12], tiny)
    s = strategy("fedavg", round_offset=4, fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2)
    initial = ArrayRecord({k: Array(v) for k, v in weights_of(NodeScoringPolicy()).items()})
    evaluated: list[int] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        evaluated.append(server_round)
        return MetricRecord({"tensors": len(arrays)})

    result = s.start(grid, initial, num_rounds=2, train_config=ConfigRecord(), evaluate_fn=evaluate_fn)
    assert evaluated == [4, 5, 6]
    assert sorted({int(m.content["config"]["server-round"]) for m in grid.sent}) == [5, 6]
    assert sorted(s.reports) == [5, 6] and all(len(s.reports[r].kept) == 2 for r in (5, 6))
    assert sorted(result.train_metrics_clientapp) == [5, 6]
    assert sorted(result.evaluate_metrics_serverapp) == [4, 5, 6]
    last = result.train_metrics_clientapp[6]
    assert last["bytes-up"] <= 0.26 * last["bytes-up-fp32"]  # the members' codec mod sent INT8


def test_a_failed_member_does_not_stop_the_round(tmp_path):
    from fedsched.agent.federation.client_app import app as client_app

    grid = InProcessGrid(client_app, [11, 12, 13], {"local-decisions": 20, "scarce-decisions": 10,
                                                    "local-epochs": 1, "state-dir": str(tmp_path),
                                                    "member-size": "small",
                                                    "fail-rate": 0.5})
    s = strategy("fedavg", fraction_evaluate=0.0)
    initial = ArrayRecord({k: Array(v) for k, v in weights_of(NodeScoringPolicy()).items()})
    result = s.start(grid, initial, num_rounds=2, train_config=ConfigRecord())
    for rnd in (1, 2):  # fail-rate is seeded by round and partition (the failure mod's rule)
        alive = [nid for pid, nid in enumerate((11, 12, 13))
                 if np.random.default_rng([rnd, pid, 7]).random() >= 0.5]
        assert sorted(s.reports[rnd].kept) == alive and s.reports[rnd].rejected == []
    assert set(result.arrays) == set(initial)


@pytest.mark.parametrize(("name", "run_config", "expected"), [
    ("fedavg", {}, {}),
    ("fedprox", {"proximal-mu": 0.1}, {"proximal_mu": 0.1}),
    ("fedtrimmedavg", {"byzantine-fraction": 0.2}, {"beta": 0.2}),
    ("krum", {"byzantine-fraction": 0.2, "min-nodes": 5}, {"num_malicious_nodes": 1}),
    ("krum", {"byzantine-fraction": 0.2, "min-nodes": 4}, {"num_malicious_nodes": 0}),
])
def test_each_strategy_gets_its_own_arguments_from_the_run_config(name, run_config, expected):
    from fedsched.common.federation.run_config import with_defaults
    from fedsched.coordinator.server_app import strategy_arguments

    args = strategy_arguments(name, with_defaults(run_config))
    assert args == expected
    make_strategy(name, norm_bound=5.0, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2, **args)
