"""Hub strategies: Flower's own, made to accept INT8 deltas, validate them and resume.

Members upload the *change* of their weights this round (``W_local_new - W_global``),
INT8-encoded with error feedback (:mod:`fedsched.common.federation.codec`). Flower's FedAvg would
average the int8 values and the scales as if they were weights (reference section 5), so
:class:`QuantizedUpdates` overrides ``aggregate_train`` and, before the parent's aggregation:

1. decodes each reply's arrays into a float32 delta;
2. validates it: the same tensors, shapes and dtypes as the model, no NaN/Inf, and a norm
   within ``norm_bound`` x the median norm of the round's *other* updates; a rejected update is
   logged with its node and reason (``self.rejections``) and does not stop the round;
3. drops replies that report zero examples (a member that skipped its upload this round:
   sparse communication);
4. rewrites each remaining reply's content to the full weights ``W_global + delta`` so the
   parent (FedAvg, FedProx, FedTrimmedAvg, Krum) aggregates real weights, weighted by
   ``num-examples`` (pods scheduled). With no usable reply the global model is kept.

``configure_train`` copies the shared config (``Strategy.start`` reuses one object),
remembers the global arrays it sends, and adds ``round_offset`` to the round number so a
resumed run continues its numbering. ``on_round`` (if set) is called with every round's
aggregate for checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, FedProx, FedTrimmedAvg, Krum

from fedsched.common.federation.codec import decode_int8


class QuantizedUpdates:
    """Mixin for a Flower strategy; see the module docstring."""

    norm_bound: float = 5.0
    round_offset: int = 0
    on_round: Callable[[int, ArrayRecord], None] | None = None

    def _setup(self, norm_bound: float, round_offset: int) -> None:
        self.norm_bound, self.round_offset = norm_bound, round_offset
        self.rejections: dict[int, list[dict[str, Any]]] = {}
        self.skipped: dict[int, list[int]] = {}
        self.member_metrics: dict[int, dict[int, dict[str, float]]] = {}  # round -> node -> metrics
        self._global: dict[str, np.ndarray] = {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._global = {k: v.numpy() for k, v in arrays.items()}
        return super().configure_train(server_round + self.round_offset, arrays, ConfigRecord(dict(config)),
                                       grid)  # type: ignore[misc]

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
        replies = list(replies)
        decoded: list[tuple[Message, dict[str, np.ndarray], float]] = []
        self.rejections[rnd], self.skipped[rnd], self.member_metrics[rnd] = [], [], {}
        for msg in replies:
            if msg.has_error():
                continue
            node = msg.metadata.src_node_id
            try:
                content = msg.content
                metrics = next(iter(content.metric_records.values()))
                n = float(metrics[self.weighted_by_key])  # type: ignore[attr-defined]
                self.member_metrics[rnd][int(node)] = {k: float(v) for k, v in metrics.items()}
                arrays = next(iter(content.array_records.values()))
                delta = decode_int8({k: v.numpy() for k, v in arrays.items()})
            except (StopIteration, KeyError, ValueError, TypeError) as e:
                self._reject(rnd, node, f"malformed reply: {e}")
                continue
            if n <= 0:
                self.skipped[rnd].append(node)
                continue
            reason = self.validate(delta)
            if reason is not None:
                self._reject(rnd, node, reason)
                continue
            decoded.append((msg, delta, n))
        if decoded:
            norms = np.array([np.sqrt(sum(float((d * d).sum()) for d in delta.values()))
                              for _, delta, _ in decoded])
            kept = []
            for i, ((msg, delta, _n), norm) in enumerate(zip(decoded, norms, strict=True)):
                # Leave-one-out median: one huge update cannot raise its own bar (with two
                # members the plain median would be halfway to it).
                others = np.delete(norms, i)
                bound = self.norm_bound * max(float(np.median(others)), 1e-12) if len(others) else np.inf
                if norm > bound:
                    self._reject(rnd, msg.metadata.src_node_id,
                                 f"update norm {norm:.3g} above {self.norm_bound:g} x the round's median")
                    continue
                full = ArrayRecord({k: Array((self._global[k] + delta[k]).astype(np.float32))
                                    for k in self._global})
                msg.content = RecordDict({self.arrayrecord_key: full,  # type: ignore[attr-defined]
                                          "metrics": next(iter(msg.content.metric_records.values()))})
                kept.append(msg)
            decoded_msgs = kept
        else:
            decoded_msgs = []
        log(INFO, "round %s: %s updates kept, %s rejected, %s without upload", rnd, len(decoded_msgs),
            len(self.rejections[rnd]), len(self.skipped[rnd]))
        if not decoded_msgs:
            arrays: ArrayRecord | None = ArrayRecord({k: Array(v) for k, v in self._global.items()})
            metrics = None
        else:
            arrays, metrics = super().aggregate_train(server_round, decoded_msgs)  # type: ignore[misc]
        if self.on_round is not None and arrays is not None:
            self.on_round(rnd, arrays)
        return arrays, metrics

    def _reject(self, rnd: int, node: int, reason: str) -> None:
        log(WARNING, "round %s: rejected the update of node %s: %s", rnd, node, reason)
        self.rejections[rnd].append({"node": int(node), "reason": reason})


# Flower's strategies by run-config name; make_strategy puts the INT8/validation layer on top.
BASES: dict[str, type] = {"fedavg": FedAvg, "fedprox": FedProx, "fedtrimmedavg": FedTrimmedAvg, "krum": Krum}
STRATEGIES = tuple(BASES)


def make_strategy(name: str, *, proximal_mu: float = 0.01, norm_bound: float = 5.0,
                  round_offset: int = 0, **kw: Any) -> QuantizedUpdates:
    """A strategy by name (``STRATEGIES``), with the INT8/validation layer on top."""
    if name not in BASES:
        raise ValueError(f"unknown strategy {name!r}: expected one of {', '.join(STRATEGIES)}")
    base = BASES[name]
    strategy_cls = type(f"Quantized{base.__name__}", (QuantizedUpdates, base), {})
    if name == "fedprox":
        kw["proximal_mu"] = proximal_mu
    strategy = strategy_cls(**kw)
    strategy._setup(norm_bound, round_offset)
    return strategy
