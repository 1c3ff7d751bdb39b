"""Hub strategies: Flower's own FedAvg, FedProx, FedTrimmedAvg and Krum, made to accept INT8 deltas,
validate them and resume.

Members upload what they learned since their last upload (``W_local_new - start``, their round's start),
INT8-encoded with error feedback (:mod:`fedsched.common.federation.codec`). Flower's FedAvg would
average the int8 values and the scales as if they were weights (meaningless: each upload has its
own scales), so :class:`QuantizedUpdates` overrides ``aggregate_train`` and, before the parent's
aggregation:

1. decodes each reply's arrays into a float32 delta;
2. validates it: the same tensors, shapes and dtypes as the model, no NaN/Inf, a norm within
   ``norm_bound`` x the median norm of the round's *other* updates (``norm_action``: an update
   above it is ``"rescale"``-d to that median norm and kept, or ``"reject"``-ed; see
   :meth:`QuantizedUpdates._over_norm_bound`) and, with three or more
   valid updates that share a direction (the median of their cosines above 0), a direction: its
   cosine similarity to the coordinate-wise median of the round's other updates must be at
   least ``cosine_floor`` (a sign-flipped update points away from the others; ``-1`` turns the
   check off; every cosine, and whether the check applied, is kept in the round's report); a
   rejected update is logged with its node and reason and does not stop the round;
   the aggregation weight (``num-examples``, the member's own report of the pods it scheduled)
   must be a finite number >= 0 (a NaN or infinite weight would make the weighted mean NaN,
   and one member's made-up billions would make the global its own model) and counts at most
   ``weight_bound`` x the median weight of the round's other updates (clipped, logged and kept
   in the round's report: a large cluster may honestly schedule more, so its update still
   counts, as at most that many median members);
3. drops replies that report zero examples (a member that skipped its upload this round:
   sparse communication);
4. builds, for each remaining reply, a *new* message holding the full weights
   ``W_global + delta`` (the member's message is left as it came), so the parent aggregates
   real weights, weighted by ``num-examples`` (pods scheduled). With no usable reply the global
   model is kept. The new messages carry only the metrics every kept reply has with a finite
   value (Flower ends the whole run when replies' metric keys differ: one member with a key
   more or less, an older agent or a hostile one, ended the federation).

What each round's aggregation did (kept, rejected and skipped nodes, each member's metrics, the
aggregated metrics) is in :attr:`QuantizedUpdates.reports`, by round, for the ServerApp's
per-round history; Flower's ``Result`` keeps only the aggregated metrics.

Downloads (``download_codec``, the run config's ``download-codec``): ``"fp32"`` sends Flower's
message as it is, the float32 global to every member. ``"int8-delta"`` rewrites each member's
message in ``configure_train``: the hub keeps, per node, the digest of the reconstruction that
member holds (members that received every round share one) and sends the INT8 delta from it
to the global (:func:`fedsched.common.federation.codec.encode_download`; encoded once per
distinct base), with the config keys ``download-kind`` (``delta``, or ``full`` for a node it
holds nothing for: the first round, a late joiner, a member that missed a round, a restarted
hub; a full copy is the float32 global, an exact start, or with ``"int8"`` an INT8 copy too),
``download-base`` and ``download-digest`` (the member checks both:
:func:`fedsched.agent.federation.mods.download_mod`). A node's reconstruction counts as held
only once its reply says it applied the download (``download-applied`` = 1); a node that
failed, refused or did not reply gets a full copy next time. The members' deltas are added to
the true global, not to their reconstructions, so the download's bounded error never enters
the global model.

Round numbering: a resumed hub (``round_offset`` rounds already done) runs Flower's loop for
the remaining rounds, which numbers them from 1 again. The strategy adds ``round_offset``
wherever a number leaves Flower's loop: the number passed to the parent's ``configure_train``
(so the members' ``server-round``) and ``aggregate_train``, the keys of :attr:`reports`, the
round given to ``start``'s ``evaluate_fn`` and the keys of the returned ``Result``. Everything
outside the loop sees one numbering, the federation's.

``configure_train`` copies the shared config (``Strategy.start`` reuses one object and the
parents write into it). :func:`make_strategy` picks a class by its run-config name.

Constructors: every strategy takes the arguments of :class:`StrategyArgs` (typed once there,
with their defaults and checks in :meth:`QuantizedUpdates.__init__`) plus its Flower parent's
own argument (``proximal_mu``, ``beta``, ``num_malicious_nodes``), which it checks itself.

May import: ``fedsched.common`` and Flower's ServerApp API.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, Required, TypedDict, Unpack

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, FedProx, FedTrimmedAvg, Krum, Result

from fedsched.common.federation.codec import decode_int8, encode_download, nbytes
from fedsched.common.federation.codec import digest as weights_digest

MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
DOWNLOAD_CODECS = ("fp32", "int8-delta", "int8")
NORM_ACTIONS = ("rescale", "reject")


@dataclass(frozen=True)
class Rejection:
    """An update that did not count: the member's node and why."""

    node: int
    reason: str


@dataclass
class RoundReport:
    """What one round's aggregation did."""

    server_round: int  # the federation's round number (resumes included)
    kept: list[int] = field(default_factory=list)  # nodes whose updates were aggregated
    rejected: list[Rejection] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # nodes that reported zero examples
    norms: dict[int, float] = field(default_factory=dict)  # node -> its decoded update's L2 norm
    cosines: dict[int, float] = field(default_factory=dict)  # node -> cosine to the others' median update
    # whether the direction check applied: the round's updates shared a direction (None: no check,
    # fewer than three updates or cosine_floor -1)
    direction_checked: bool | None = None
    clipped: dict[int, tuple[float, float]] = field(default_factory=dict)  # node -> (weight claimed, counted)
    rescaled: dict[int, tuple[float, float]] = field(default_factory=dict)  # node -> (norm sent, counted)
    members: dict[int, dict[str, float]] = field(default_factory=dict)  # node -> its reply's metrics
    train_metrics: dict[str, float] | None = None  # the parent's aggregate (None: nothing aggregated)


class StrategyArgs(TypedDict, total=False):
    """The keyword arguments every strategy class takes besides its parent's own (the four
    without a default here have a run-config key; their one default is pyproject's). Defaults
    and checks: :meth:`QuantizedUpdates.__init__`."""

    norm_bound: Required[float]  # a multiple of the round's median norm; inf turns the check off
    norm_action: str  # above norm_bound: "rescale" to the others' median norm | "reject" (class default)
    cosine_floor: float  # least cosine to the others' median update; -1 (this class's default) turns it off
    weight_bound: float  # most a weight counts, x the others' median; inf (this class's default): no bound
    fraction_train: Required[float]
    min_train_nodes: Required[int]
    min_available_nodes: Required[int]
    round_offset: int  # rounds already done (a resumed hub)
    download_codec: str  # "fp32" (Flower's plain message, this class's default) | "int8-delta" | "int8"
    fraction_evaluate: float
    min_evaluate_nodes: int
    weighted_by_key: str
    arrayrecord_key: str
    configrecord_key: str
    train_metrics_aggr_fn: MetricsAggregation | None
    evaluate_metrics_aggr_fn: MetricsAggregation | None


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def _check_count(name: str, value: int, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _shared_metric_keys(metrics: list[dict[str, float]], rnd: int) -> list[str]:
    """The metric keys the parent averages: those every kept reply has, with a finite value in
    each. Flower ends the whole run (InconsistentMessageReplies) when the replies' keys differ, so
    one member adding or missing a key (an older agent in a rolling upgrade, or a hostile one) ended
    the federation; a NaN or inf made the round's average one. The weight key always passes
    (validated and bounded before)."""
    if not metrics:
        return []
    keys = set(metrics[0]).intersection(*metrics[1:])
    shared = sorted(k for k in keys if all(math.isfinite(m[k]) for m in metrics))
    dropped = sorted(set().union(*metrics) - set(shared))
    if dropped:
        log(WARNING, "round %s: metrics %s not averaged (missing from a reply or not finite)", rnd, dropped)
    return shared


def _reply_order(msg: Message) -> tuple[float, int]:
    """A reply's place in the fixed order: the member's partition (its own report; the node ids
    of a simulation are drawn anew in every run), then its node id. A partition that is not a
    finite number counts as -1 (NaN compares false with everything: the order would be the
    arrival order again)."""
    part = -1.0
    if not msg.has_error():
        with contextlib.suppress(StopIteration, KeyError, TypeError, ValueError):
            part = float(next(iter(msg.content.metric_records.values()))["partition"])  # type: ignore[arg-type]
    return (part if math.isfinite(part) else -1.0, int(msg.metadata.src_node_id))


class QuantizedUpdates(FedAvg):
    """INT8 deltas, validation and round numbering on top of a Flower strategy (see the module
    docstring). A mixin: use it before a Flower strategy, as the classes below do."""

    def __init__(self, *, norm_bound: float, fraction_train: float, min_train_nodes: int,
                 min_available_nodes: int, round_offset: int = 0, download_codec: str = "fp32",
                 norm_action: str = "reject",
                 cosine_floor: float = -1.0, weight_bound: float = math.inf,
                 fraction_evaluate: float = 1.0,
                 min_evaluate_nodes: int = 2, weighted_by_key: str = "num-examples",
                 arrayrecord_key: str = "arrays", configrecord_key: str = "config",
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None, **own: Any) -> None:
        """The :class:`StrategyArgs`, checked; ``own``: the Flower parent's own arguments (checked
        by the subclass), passed on with them."""
        if not norm_bound > 0:  # also rejects NaN; inf turns the norm check off
            raise ValueError(f"norm_bound must be > 0 (a multiple of the round's median norm), "
                             f"got {norm_bound}")
        if norm_action not in NORM_ACTIONS:
            raise ValueError(f"unknown norm_action {norm_action!r}: expected {', '.join(NORM_ACTIONS)}")
        _check_count("round_offset", round_offset)
        if not weight_bound > 0:  # also rejects NaN; inf turns the bound off
            raise ValueError(f"weight_bound must be > 0 (a multiple of the round's median weight), "
                             f"got {weight_bound}")
        if not -1.0 <= cosine_floor <= 1.0:  # also rejects NaN
            raise ValueError(f"cosine_floor must be in [-1, 1] (-1: no direction check), got {cosine_floor}")
        if download_codec not in DOWNLOAD_CODECS:
            raise ValueError(f"unknown download codec {download_codec!r}: "
                             f"expected {', '.join(DOWNLOAD_CODECS)}")
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=min_train_nodes, min_evaluate_nodes=min_evaluate_nodes,
                         min_available_nodes=min_available_nodes, weighted_by_key=weighted_by_key,
                         arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key,
                         train_metrics_aggr_fn=train_metrics_aggr_fn,
                         evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn, **own)
        _check_fraction("fraction_train", self.fraction_train)
        _check_fraction("fraction_evaluate", self.fraction_evaluate)
        _check_count("min_train_nodes", self.min_train_nodes)
        _check_count("min_evaluate_nodes", self.min_evaluate_nodes)
        _check_count("min_available_nodes", self.min_available_nodes)
        self.norm_bound = float(norm_bound)
        self.norm_action = norm_action
        self.cosine_floor = float(cosine_floor)
        self.weight_bound = float(weight_bound)
        self.round_offset = round_offset
        self.reports: dict[int, RoundReport] = {}
        self._global: dict[str, np.ndarray] = {}
        self.download_codec = download_codec
        self.held: dict[int, str] = {}  # node -> digest of the reconstruction it acknowledged
        self._sent: dict[int, str] = {}  # node -> digest it holds if it applies this round's download
        self._rebuilt: dict[str, dict[str, np.ndarray]] = {}  # digest -> reconstruction
        self._encoded_cache: dict[str, tuple[ArrayRecord, str]] = {}  # this round's, by base

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> Quantized updates (INT8 deltas, validated before aggregation):")
        log(INFO, "\t│\t├── Norm bound: %s x the median norm of the round's other updates (above: %s)",
            self.norm_bound, self.norm_action)
        log(INFO, "\t│\t├── Cosine floor: %s to the median of the round's other updates (-1: off)",
            self.cosine_floor)
        log(INFO, "\t│\t├── Weight bound: %s x the median %s of the round's other updates (inf: off)",
            self.weight_bound, self.weighted_by_key)
        log(INFO, "\t│\t├── Download codec: %s", self.download_codec)
        log(INFO, "\t│\t└── Round offset: %d (rounds already done; numbering continues from %d)",
            self.round_offset, self.round_offset + 1)
        super().summary()

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: EvaluateFn | None = None) -> Result:
        """Flower's ``start``, with the federation's round numbers given to ``evaluate_fn`` (the
        initial call gets ``round_offset``: the round the initial arrays come from) and used as
        the keys of the returned ``Result``."""
        offset = self.round_offset

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            assert evaluate_fn is not None
            return evaluate_fn(server_round + offset, arrays)

        result = super().start(grid, initial_arrays, num_rounds=num_rounds, timeout=timeout,
                               train_config=train_config, evaluate_config=evaluate_config,
                               evaluate_fn=evaluate if evaluate_fn is not None else None)
        return Result(arrays=result.arrays,
                      train_metrics_clientapp={r + offset: m
                                               for r, m in result.train_metrics_clientapp.items()},
                      evaluate_metrics_clientapp={r + offset: m
                                                  for r, m in result.evaluate_metrics_clientapp.items()},
                      evaluate_metrics_serverapp={r + offset: m
                                                  for r, m in result.evaluate_metrics_serverapp.items()})

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._global = {k: v.numpy() for k, v in arrays.items()}
        if self._sent or self._encoded_cache:  # a round that was never aggregated: nothing acknowledged
            self._acknowledge([])
        rnd = server_round + self.round_offset
        messages = list(super().configure_train(rnd, arrays, ConfigRecord(dict(config)), grid))
        if self.download_codec == "fp32":
            return messages
        return [self._compressed(msg) for msg in messages]

    def _compressed(self, msg: Message) -> Message:
        """``msg`` with the INT8 download for its node (see the module docstring)."""
        node = int(msg.metadata.dst_node_id)
        base = self.held.get(node, "")
        if base not in self._rebuilt:
            base = ""
        encoded, digest = self._encoded(base)
        self._sent[node] = digest
        config = ConfigRecord({**msg.content[self.configrecord_key], "download-base": base,
                               "download-kind": "delta" if base else "full", "download-digest": digest})
        content = RecordDict({self.arrayrecord_key: encoded, self.configrecord_key: config})
        return Message(content=content, message_type=msg.metadata.message_type, dst_node_id=node)

    def _encoded(self, base: str) -> tuple[ArrayRecord, str]:
        """The download against reconstruction ``base`` ("": a full copy), once per round and base."""
        if base not in self._encoded_cache:
            full = "int8" if self.download_codec == "int8" else "fp32"
            encoded, rebuilt = encode_download(self._global, self._rebuilt[base] if base else None, full)
            digest = weights_digest(rebuilt)
            error = max(float(np.abs(rebuilt[k] - g).max()) for k, g in self._global.items())
            scale = max(float(np.abs(g).max()) for g in self._global.values())
            log(INFO, "download %s: max |reconstruction - global| = %.3g (%.2g of max |weight|), "
                "%d bytes (%.3fx fp32)", f"delta from {base[:8]}" if base else "full copy", error,
                error / max(scale, 1e-30), nbytes(encoded), nbytes(encoded) / max(nbytes(self._global), 1))
            self._rebuilt[digest] = rebuilt
            self._encoded_cache[base] = (ArrayRecord({k: Array(v) for k, v in encoded.items()}), digest)
        return self._encoded_cache[base]

    def _acknowledge(self, replies: list[Message]) -> None:
        """Which reconstruction each node now holds: this round's, if its reply says it applied
        it; none otherwise (it gets a full copy next time)."""
        applied = set()
        for msg in replies:
            if msg.has_error():
                continue
            try:
                metrics = next(iter(msg.content.metric_records.values()))
                # Compared as a float: int() of the member's inf raised OverflowError out of the round.
                if float(metrics.get("download-applied", 0)) == 1.0:  # type: ignore[arg-type]
                    applied.add(int(msg.metadata.src_node_id))
            except (StopIteration, TypeError, ValueError, OverflowError):
                continue
        for node, digest in self._sent.items():
            if node in applied:
                self.held[node] = digest
            else:
                self.held.pop(node, None)
        self._sent.clear()
        self._encoded_cache.clear()
        keep = set(self.held.values())
        self._rebuilt = {d: w for d, w in self._rebuilt.items() if d in keep}

    def validate(self, delta: dict[str, np.ndarray]) -> str | None:
        """Why ``delta`` cannot count (None if it can), before the norm check."""
        if set(delta) != set(self._global):
            missing, extra = set(self._global) - set(delta), set(delta) - set(self._global)
            return f"tensors differ from the model (missing {sorted(missing)}, unexpected {sorted(extra)})"
        for name, g in self._global.items():
            d = delta[name]
            if d.shape != g.shape:
                return f"{name}: shape {d.shape}, model has {g.shape}"
            if not np.issubdtype(d.dtype, np.floating):
                return f"{name}: dtype {d.dtype} is not floating point"
            if not np.isfinite(d).all():
                return f"{name}: NaN or Inf"
        return None

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        rnd = server_round + self.round_offset
        report = RoundReport(rnd)
        self.reports[rnd] = report
        # Flower hands the replies over in the order they arrived, which timing decides; the
        # float sums of the aggregation (and the parent's) depend on their order, so they are
        # taken in a fixed one: two runs of one federation then give the same bits (the FedProx
        # global of the main job differed between two runs of one configuration on one machine).
        replies = sorted(replies, key=_reply_order)
        self._acknowledge(replies)
        decoded: list[tuple[Message, dict[str, np.ndarray], MetricRecord]] = []
        for msg in replies:
            if msg.has_error():
                continue
            node = int(msg.metadata.src_node_id)
            try:
                metrics = next(iter(msg.content.metric_records.values()))
                n = float(metrics[self.weighted_by_key])
                report.members[node] = {k: float(v) for k, v in metrics.items()}  # type: ignore[arg-type]
                arrays = next(iter(msg.content.array_records.values()))
                delta = decode_int8({k: v.numpy() for k, v in arrays.items()})
            except (StopIteration, KeyError, ValueError, TypeError) as e:
                self._reject(report, node, f"malformed reply: {e}")
                continue
            if not math.isfinite(n) or n < 0:
                self._reject(report, node, f"malformed reply: {self.weighted_by_key} must be a finite "
                             f"number >= 0, got {n!r}")
                continue
            if n == 0:
                report.skipped.append(node)
                continue
            reason = self.validate(delta)
            if reason is not None:
                self._reject(report, node, reason)
                continue
            decoded.append((msg, delta, metrics))
        # float64: a float32 square of a value above ~1.8e19 is inf (a rescaled update is divided by its norm)
        norms = np.array([math.sqrt(sum(float(np.square(d, dtype=np.float64).sum()) for d in delta.values()))
                          for _, delta, _ in decoded])
        report.norms = {int(msg.metadata.src_node_id): float(n)
                        for (msg, _, _), n in zip(decoded, norms, strict=True)}
        weights = np.array([float(metrics[self.weighted_by_key]) for _, _, metrics in decoded])
        cosines = self._cosines([delta for _, delta, _ in decoded])
        report.cosines = {int(msg.metadata.src_node_id): c
                          for (msg, _, _), c in zip(decoded, cosines, strict=True) if c is not None}
        check_direction = self._shared_direction(report, cosines)
        passed: list[tuple[Message, ArrayRecord, dict[str, float]]] = []
        for i, (msg, delta, _) in enumerate(decoded):
            # Leave-one-out median: one huge update cannot raise its own bar (with two
            # members the plain median would be halfway to it).
            others = np.delete(norms, i)
            median = float(np.median(others)) if len(others) else math.inf
            bound = self.norm_bound * max(median, 1e-12)
            if norms[i] > bound:
                # never above the bound: with norm_bound < 1 the median is above it (the update would grow)
                delta = self._over_norm_bound(report, int(msg.metadata.src_node_id), delta, float(norms[i]),
                                              min(median, bound))
                if delta is None:
                    continue
            if check_direction and cosines[i] is not None and cosines[i] < self.cosine_floor:
                self._reject(report, int(msg.metadata.src_node_id),
                             f"update direction: cosine {cosines[i]:.3g} to the median of the round's other "
                             f"updates, below {self.cosine_floor:g}")
                continue
            clipped = self._clipped_weight(report, int(msg.metadata.src_node_id), weights, i)
            full = ArrayRecord({k: Array((self._global[k] + delta[k]).astype(np.float32))
                                for k in self._global})
            counted = report.members[int(msg.metadata.src_node_id)]
            if clipped is not None:
                counted = {**counted, self.weighted_by_key: clipped}
            passed.append((msg, full, counted))
            report.kept.append(int(msg.metadata.src_node_id))
        shared = _shared_metric_keys([m for _, _, m in passed], rnd)
        # A new message with a copy of the member's metadata (its node id for the parent's logs);
        # the parent may consume it (FedTrimmedAvg pops its arrays).
        kept = [Message(content=RecordDict({self.arrayrecord_key: full, "metrics": MetricRecord(
                    {k: counted[k] for k in shared})}), metadata=copy.copy(msg.metadata))
                for msg, full, counted in passed]
        log(INFO, "round %s: %s updates kept, %s rejected, %s without upload", rnd, len(kept),
            len(report.rejected), len(report.skipped))
        if not kept:
            return ArrayRecord({k: Array(v) for k, v in self._global.items()}), None
        arrays_out, metrics_out = super().aggregate_train(rnd, kept)
        if metrics_out is not None:
            report.train_metrics = {k: float(v) for k, v in metrics_out.items()}  # type: ignore[arg-type]
        return arrays_out, metrics_out

    def _over_norm_bound(self, report: RoundReport, node: int, delta: dict[str, np.ndarray], norm: float,
                         target: float) -> dict[str, np.ndarray] | None:
        """What counts of an update whose norm is above the bound: with ``"reject"`` nothing (logged
        and reported); with ``"rescale"`` the update scaled down to norm ``target``, the median norm
        of the round's other updates (the bound itself where ``norm_bound`` < 1 puts it below that
        median), logged and reported in :attr:`RoundReport.rescaled`.

        Why rescale: a norm far above the others' carries no trustworthy magnitude, but the
        direction may be a member's honest learning sent with a scale bug, a wrong step size, or
        boosted by an attacker. Kept at a typical member's norm it moves the global no further than
        any update the bound lets through unchanged (up to ``norm_bound`` x that median, in any
        direction), so an attacker gains nothing over staying under the bound, while an honest
        member's round still counts (rejecting it drops that member's data from the round)."""
        if self.norm_action == "reject":
            self._reject(report, node,
                         f"update norm {norm:.3g} above {self.norm_bound:g} x the round's median")
            return None
        scale = np.float32(target / norm)
        log(WARNING, "round %s: the update of node %s counts with norm %.3g, not the %.3g it sent "
            "(above %g x the round's median: rescaled to the median of the round's other updates)",
            report.server_round, node, target, norm, self.norm_bound)
        report.rescaled[node] = (norm, target)
        return {k: (v * scale).astype(np.float32) for k, v in delta.items()}

    def _clipped_weight(self, report: RoundReport, node: int, weights: np.ndarray, i: int) -> float | None:
        """The weight update ``i`` counts with when its claim is above ``weight_bound`` x the median
        of the round's other valid updates' claims (leave-one-out, like the norm check: a made-up
        weight cannot raise its own bar), logged and reported; None when the claim counts as it is."""
        claimed = float(weights[i])
        others = np.delete(weights, i)
        if not len(others) or math.isinf(self.weight_bound):
            return None
        bound = self.weight_bound * float(np.median(others))
        if claimed <= bound:
            return None
        log(WARNING, "round %s: the update of node %s counts with %s %.6g, not the %.6g it claims "
            "(%g x the median of the round's other updates)", report.server_round, node,
            self.weighted_by_key, bound, claimed, self.weight_bound)
        report.clipped[node] = (claimed, bound)
        return bound

    def _shared_direction(self, report: RoundReport, cosines: list[float | None]) -> bool:
        """Whether this round's direction check applies: only where the updates share a direction
        (the median of their cosines above 0). Non-IID members learn different things: in the
        main job from the shipped start the honest cosines sit around 0 (-0.15 to +0.24; they
        were -0.02 to -0.33, below the default floor twice in 8 rounds, while members uploaded
        their offset from the global). There a flipped update cannot be told from an honest one
        by its direction; the check stays off and the round's report says so. The median is an
        honest member's cosine while fewer than half the members attack, but each cosine is taken
        to the others' median update, which attackers move: 3 flipped updates among 16 turned a
        median of +0.158 into -0.072 and the check off (``bench/results/attempts/flip_peers.txt``,
        one run)."""
        known = [c for c in cosines if c is not None]
        if self.cosine_floor <= -1.0 or len(known) < 3:
            return False
        median = float(np.median(known))
        report.direction_checked = median > 0
        if not report.direction_checked:
            log(INFO, "round %s: no direction check: the updates share no direction (median cosine %.3g "
                "to the others' median)", report.server_round, median)
        return report.direction_checked

    @staticmethod
    def _cosines(deltas: list[dict[str, np.ndarray]]) -> list[float | None]:
        """Each update's cosine similarity to the coordinate-wise median of the *other* updates
        (leave-one-out, like the norm check: an update cannot pull its own reference); None for
        every update when fewer than three (with two, each is the other's reference, and neither
        can be told from an attacker) or for a zero update."""
        if len(deltas) < 3:
            return [None] * len(deltas)
        names = sorted(deltas[0])
        flat = np.stack([np.concatenate([d[k].ravel().astype(np.float64) for k in names]) for d in deltas])
        out: list[float | None] = []
        for i in range(len(flat)):
            ref = np.median(np.delete(flat, i, axis=0), axis=0)
            den = float(np.linalg.norm(flat[i]) * np.linalg.norm(ref))
            out.append(float(flat[i] @ ref) / den if den > 0 else None)
        return out

    def _reject(self, report: RoundReport, node: int, reason: str) -> None:
        log(WARNING, "round %s: rejected the update of node %s: %s", report.server_round, node, reason)
        report.rejected.append(Rejection(int(node), reason))


class QuantizedFedAvg(QuantizedUpdates, FedAvg):
    """Flower's FedAvg on INT8 deltas, with update validation and resumable round numbering."""

    def __init__(self, **args: Unpack[StrategyArgs]) -> None:
        super().__init__(**args)


class QuantizedFedProx(QuantizedUpdates, FedProx):
    """Flower's FedProx on INT8 deltas: sends ``proximal-mu``; members add the proximal term."""

    def __init__(self, *, proximal_mu: float, **args: Unpack[StrategyArgs]) -> None:
        if not 0.0 <= proximal_mu < math.inf:  # also rejects NaN
            raise ValueError(f"proximal_mu must be finite and >= 0, got {proximal_mu}")
        super().__init__(proximal_mu=proximal_mu, **args)


class QuantizedFedTrimmedAvg(QuantizedUpdates, FedTrimmedAvg):
    """Flower's FedTrimmedAvg (coordinate-wise trimmed mean) on validated INT8 deltas."""

    def __init__(self, *, beta: float = 0.2, **args: Unpack[StrategyArgs]) -> None:
        if not 0.0 <= beta < 0.5:  # also rejects NaN
            raise ValueError(f"beta (the fraction trimmed off each tail) must be in [0, 0.5), got {beta}")
        super().__init__(beta=beta, **args)


class QuantizedKrum(QuantizedUpdates, Krum):
    """Flower's Krum (the one update closest to its neighbours) on validated INT8 deltas."""

    def __init__(self, *, num_malicious_nodes: int = 0, **args: Unpack[StrategyArgs]) -> None:
        _check_count("num_malicious_nodes", num_malicious_nodes)
        super().__init__(num_malicious_nodes=num_malicious_nodes, **args)


# The strategies by run-config name (``strategy = "..."``). The arguments that have a run-config key
# (norm-bound, fraction-train, min-nodes, proximal-mu) have no default here: their one default is
# pyproject's; the others keep Flower's.
STRATEGIES: dict[str, type[QuantizedUpdates]] = {
    "fedavg": QuantizedFedAvg, "fedprox": QuantizedFedProx,
    "fedtrimmedavg": QuantizedFedTrimmedAvg, "krum": QuantizedKrum,
}


def make_strategy(name: str, **kwargs: Any) -> QuantizedUpdates:
    """The strategy called ``name`` in the run config, built with ``kwargs`` (its ``__init__``'s
    arguments; a strategy-specific one such as ``proximal_mu`` only for its strategy)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}: expected one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name](**kwargs)
