"""Decisions of the serving agent and their outcomes, into the bounded decision log.

Every prioritize decision the policy made (in shadow mode too) is held in memory with its
features until its pod is bound; once bound, the decision waits ``horizon_s`` seconds and is
then written to the :class:`~fedsched.common.learning.decision_log.DecisionLog` with the node the pod
really went to as ``chosen`` and the outcome as reward terms:

- ``pending_s``: seconds from the pod's creation to its binding (NaN when unknown);
- ``overload``: 1 if the node went into overload (real CPU above the overload threshold, from
  telemetry) after the binding, else 0; ``oom``: OOM kills seen on the node since;
- ``hot_s``: seconds the node ran hot (measured CPU at or above the online metrics' hot-node
  threshold, 0.85) after the binding, sampled at every tick (NaN without telemetry): with
  ``oom``, the node credit a member's local update learns from
  (``fedsched.agent.learning.credit.credited_from_log``);
- ``cpu_util``: the node's real CPU use at the end of the horizon (NaN without telemetry);
- ``observed_s``: how long the outcome was watched (the horizon, or less at shutdown).

This is what the continuous-training path (``fedsched train --algo bc --log DIR``) and the
deployed Flower ClientApp (``decision-log`` in its node config) learn from. Memory is
bounded (``max_pending`` decisions waiting, each K x 44 float16 node features: about 180 MB at
4,096 decisions of 500 nodes; the oldest are dropped and counted), the log is
pruned to ``max_decisions``, and :meth:`OutcomeRecorder.stop` writes what is still waiting
with the outcome seen so far, so nothing is lost on shutdown.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.agent.cluster.cache import BoundPod
from fedsched.agent.serving.decider import Decider, Decision
from fedsched.common.learning.decision_log import DecisionLog
from fedsched.common.learning.features import HOT_THRESHOLD, Features
from fedsched.common.learning.records import Decision as LogDecision

log = logging.getLogger("fedsched.serve")


@dataclass
class _Waiting:
    features: Features
    nodes: tuple[str, ...]  # feasible candidates, the rows of features.nodes
    version: str
    decided_at: float
    has_gpus: bool
    bound: BoundPod | None = None
    overload0: int = 0
    oom0: int = 0
    hot_s: float = 0.0  # seconds the bound node was seen hot since the binding
    seen_at: float = math.nan  # the last time hot_s was updated
    measured: bool = False  # the node's CPU was measured at least once since the binding


class OutcomeRecorder:
    """See the module doc; hooks itself into the decider and its cache."""

    def __init__(
        self,
        decider: Decider,
        log_dir: str | Path,
        horizon_s: float = 300.0,
        max_decisions: int = 200_000,
        max_pending: int = 4096,
        clock: Any = time.time,
    ) -> None:
        if horizon_s < 0:
            raise ValueError(f"outcome horizon must be >= 0, got {horizon_s}")
        self.decider = decider
        self.cache = decider.cache
        self.log = DecisionLog(log_dir, chunk_size=256)  # small chunks: flushing rewrites the newest
        self.horizon_s = horizon_s
        self.max_decisions = max_decisions
        self.max_pending = max_pending
        self.clock = clock
        self.waiting: OrderedDict[str, _Waiting] = OrderedDict()
        self.dropped = 0
        self.written = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        decider.on_decision.append(self.on_decision)
        self.cache.on_bound.append(self.on_bound)

    def on_decision(self, pod_obj: dict, d: Decision) -> None:
        if d.features is None or d.ranking is None or d.ranking.best < 0:
            return
        uid = str((pod_obj.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        names = self.cache.table.names
        f = d.features  # kept as float16, as the log stores them: half the memory while waiting
        w = _Waiting(
            Features(f.nodes.astype(np.float16), f.pod, f.context),
            tuple(names[i] for i in d.ranking.nodes),
            d.model_version,
            self.clock(),
            bool(self.cache.table.total_gpu_milli > 0),
        )
        with self._lock:
            self.waiting.pop(uid, None)
            self.waiting[uid] = w
            while len(self.waiting) > self.max_pending:
                self.waiting.popitem(last=False)
                self.dropped += 1
                self.decider.metrics.logged.labels(result="dropped").inc()

    def on_bound(self, b: BoundPod) -> None:
        with self._lock:
            w = self.waiting.get(b.uid)
            if w is None or w.bound is not None:
                return
            w.bound = b
            w.seen_at = b.bound_at
            i = self.cache.index.get(b.node)
            if i is not None:
                w.overload0 = int(self.cache.telemetry.overload_count[i])
                w.oom0 = int(self.cache.telemetry.oom_count[i])

    def tick(self, now: float | None = None, final: bool = False) -> int:
        """Write the decisions whose horizon has passed (all bound ones when ``final``)."""
        now = self.clock() if now is None else now
        due: list[tuple[str, _Waiting]] = []
        with self._lock:
            self._sample_hot(now)
            for uid, w in list(self.waiting.items()):
                if w.bound is not None and (final or now - w.bound.bound_at >= self.horizon_s):
                    due.append((uid, w))
                    del self.waiting[uid]
        for _uid, w in due:
            self._write(w, now)
        if due:
            self.log.flush()
            if len(self.log) > self.max_decisions:
                self.log.prune(self.max_decisions)
        return len(due)

    def _sample_hot(self, now: float) -> None:
        """Charge every bound decision the time since its last sample if its node is hot now."""
        ratio = self.cache.cpu_ratio
        for w in self.waiting.values():
            if w.bound is None or not now > w.seen_at:
                continue
            i = self.cache.index.get(w.bound.node)
            if i is not None and math.isfinite(float(ratio[i])):
                w.measured = True
                if float(ratio[i]) >= HOT_THRESHOLD:
                    w.hot_s += now - w.seen_at
            w.seen_at = now

    def _write(self, w: _Waiting, now: float) -> None:
        b = w.bound
        assert b is not None
        if b.node not in w.nodes:  # bound to a node the policy did not see: not a usable sample
            self.decider.metrics.logged.labels(result="bound-elsewhere").inc()
            return
        i = self.cache.index.get(b.node)
        tel = self.cache.telemetry
        overload = oom = math.nan
        cpu_util = math.nan
        if i is not None:
            overload = float(int(tel.overload_count[i]) > w.overload0)
            oom = float(int(tel.oom_count[i]) - w.oom0)
            cpu_util = float(self.cache.cpu_ratio[i])
        reward = {
            "pending_s": b.bound_at - b.created if math.isfinite(b.created) else math.nan,
            "overload": overload,
            "oom": oom,
            "cpu_util": cpu_util,
            "observed_s": max(0.0, now - b.bound_at),
            "hot_s": w.hot_s if w.measured else math.nan,
        }
        f = w.features
        self.log.append(
            LogDecision(f.nodes, f.pod, f.context, np.zeros(0, np.int64), has_gpus=w.has_gpus),
            w.nodes.index(b.node),
            w.version,
            reward,
        )
        self.written += 1
        self.decider.metrics.logged.labels(result="written").inc()

    def start(self, interval_s: float | None = None) -> None:
        interval = interval_s if interval_s is not None else min(max(self.horizon_s / 10, 0.5), 5.0)

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.tick()
                except Exception:
                    log.exception("writing decision outcomes failed")

        self._thread = threading.Thread(target=loop, name="fedsched-outcomes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.tick(final=True)
        self.log.flush()
