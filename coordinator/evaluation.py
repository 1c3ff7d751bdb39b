"""The hub's central evaluation and per-round record, given to Flower as ``strategy.start(evaluate_fn=...)``.

- :func:`online_central_evaluator` (online mode): the global model's trouble score
  (:func:`fedsched.common.model.metrics.trouble_score`: the mean log ratio of its hot CPU
  node-seconds, throttled CPU and OOM kills to kube-default's; below 0 is better) on the
  validation pods of held-out clusters of every member profile (other generator seeds than any
  member's) at the members' size (run config ``member-size``), replayed at 85% load, the model
  scored as the members score it (run config ``kube-weight``); in worker
  processes for full-size clusters (run config ``central-workers``, :class:`OnlineCentralEvaluator`).
- :func:`central_evaluator` (packing mode): the global model's GPU allocation on a held-out
  openb slice (test pods, packing mode).
- :class:`HubRecorder`: the ``evaluate_fn``. Flower calls it after every round with the
  aggregated arrays (and once before the first round with the initial ones); for each new
  round it evaluates the model, appends the round's entry to ``rounds.json`` (central
  metrics, the members' metrics by partition, rejected and skipped updates, each update's
  norm and cosine to the others' median, the weights the hub clipped and the updates it rescaled
  (by partition: :func:`member_keys`),
  the aggregated
  train metrics with bytes up/down, wall time) and then checkpoints the model
  (``global.npz`` with its round number, written atomically). On a resumed hub it keeps the
  entries of the rounds the checkpoint holds and drops any later one (a hub killed between the
  two writes re-runs that round), so no round is lost or repeated. :meth:`HubRecorder.finish`
  writes ``final.json``.

May import: ``fedsched.common``, Flower's record types and :mod:`fedsched.coordinator.strategies`.
"""

from __future__ import annotations

import functools
import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord

from fedsched.common.compute import single_threaded_worker
from fedsched.common.federation.weights import load_npz, load_weights, save_npz
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.traces import (
    builtin_trace,
    fits_somewhere,
    load_nodes,
    load_pods,
    slice_cluster,
    split_by_hash,
)
from fedsched.common.sim.packing import run_packing
from fedsched.coordinator.strategies import QuantizedUpdates, RoundReport

Weights = dict[str, np.ndarray]
ROUND_KEY = "__round__"  # the checkpoint's round number, beside the weights in global.npz


def central_evaluator(n_nodes: int, seed: int = 7) -> Callable[[Weights], dict[str, float]]:
    """policy weights -> GPU allocation % on a held-out openb slice of ``n_nodes`` (test pods, packing)."""
    nodes = slice_cluster(load_nodes(builtin_trace("openb_node_list_gpu_node.csv")), n_nodes, 99_000 + seed)
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    train, test = split_by_hash(fits_somewhere(pods, nodes), 0.3)
    typical = TypicalPods.from_pods(train)

    def evaluate(weights: Weights) -> dict[str, float]:
        policy = NodeScoringPolicy()
        load_weights(policy, weights)
        m = run_packing(nodes, test, PolicyScheduler(policy, typical), target_load=1.3, seed=seed,
                        typical=typical).metrics
        return {"alloc_gpu": float(m["alloc_gpu"]), "gpu_frag_amount": float(m["gpu_frag_amount"])}

    return evaluate


CENTRAL_PROFILES = 4  # held-out clusters of the online central evaluation: one per member profile
CENTRAL_SEED = 99_000  # their generator seeds (CENTRAL_SEED + i) and replay seed: no member's


@functools.cache
def _central_cluster(i: int, seed: int, size: str) -> Any:
    """Held-out cluster ``i`` of the online central evaluation, built once per process."""
    from fedsched.common.federation.members import member_cluster

    return member_cluster(i, seed=seed + i, size=size)


def _central_replay(args: tuple[int, int, str, Weights | None, float]) -> dict[str, float]:
    """The trouble score's metrics of one replay of held-out cluster ``i``'s validation pods at
    its load: kube-default's when ``weights`` is None, else the policy's, scored with the last
    element, the kube weight (as the members score)."""
    from fedsched.common.federation.members import reference_typical
    from fedsched.common.federation.scoring import member_scheduler
    from fedsched.common.model.metrics import TROUBLE_SMOOTHING
    from fedsched.common.schedulers import SchedulerContext
    from fedsched.common.sim.evaluate import make_policy
    from fedsched.common.sim.replay import ReplayConfig, run_replay

    i, seed, size, weights, kube_weight = args
    member = _central_cluster(i, seed, size)
    typical = reference_typical()
    if weights is None:
        sched: Any = make_policy("kube-default", SchedulerContext(rng=np.random.default_rng(0)), "replay")
    else:
        sched = member_scheduler(weights, kube_weight, typical)
    cfg = ReplayConfig(**{**member.replay, "allow_unreachable_load": True})
    res = run_replay(member.nodes, member.val, sched, config=cfg, seed=seed, typical=typical)
    return {k: float(res.metrics[k]) for k in TROUBLE_SMOOTHING}


def central_worker_count(workers: int | str, size: str) -> int:
    """The processes of an online central evaluation: ``workers``, or for ``"auto"`` 2 (at most
    the CPU count) for full-size clusters, whose replays take seconds each, and 1 for the small
    ones, which would spend more starting processes than they save."""
    if workers == "auto":
        return min(2, os.cpu_count() or 1) if size == "full" else 1
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"central evaluation workers must be a positive integer or 'auto', got {workers!r}")
    return workers


class OnlineCentralEvaluator:
    """policy weights -> trouble score vs kube-default per held-out cluster and their mean (see
    the module docstring); kube-default's figures are computed once, at construction.

    ``workers`` > 1 replays the clusters in that many worker processes (spawned, so safe beside
    the simulation runtime's threads), the largest first: the hub evaluates while the members
    wait, so this is time every round pays on the critical path (``"auto"``:
    :func:`central_worker_count`). :meth:`close` (or leaving a ``with`` block) stops the workers."""

    def __init__(self, profiles: int = CENTRAL_PROFILES, seed: int = CENTRAL_SEED, size: str = "full",
                 workers: int | str = "auto", kube_weight: float = 0.0) -> None:
        workers = central_worker_count(workers, size)
        self.seed, self.size, self.kube_weight = seed, size, float(kube_weight)
        self.clusters = [_central_cluster(i, seed, size) for i in range(profiles)]
        self.names = [m.spec.name if m.spec else m.name for m in self.clusters]
        # The largest first, so that the last to start is a short one.
        self.order = sorted(range(profiles), key=lambda i: -len(self.clusters[i].val))
        self._pool: ProcessPoolExecutor | None = None
        if workers > 1:
            self._pool = ProcessPoolExecutor(min(workers, profiles), initializer=single_threaded_worker,
                                             mp_context=multiprocessing.get_context("spawn"))
        try:
            self.refs = self._replays(None)
        except BaseException:
            self.close()
            raise

    def _replays(self, weights: Weights | None) -> list[dict[str, float]]:
        jobs = [(i, self.seed, self.size, weights, self.kube_weight) for i in self.order]
        runs = list(self._pool.map(_central_replay, jobs)) if self._pool is not None else \
            [_central_replay(j) for j in jobs]
        by_cluster = dict(zip(self.order, runs, strict=True))
        return [by_cluster[i] for i in range(len(self.clusters))]

    def __call__(self, weights: Weights) -> dict[str, float]:
        from fedsched.common.model.metrics import trouble_score

        scores = {name: trouble_score(got, ref)
                  for name, got, ref in zip(self.names, self._replays(weights), self.refs, strict=True)}
        return {"trouble_score": float(np.mean(list(scores.values()))),
                **{f"trouble_score_{k}": v for k, v in scores.items()}}

    def __enter__(self) -> OnlineCentralEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def online_central_evaluator(profiles: int = CENTRAL_PROFILES, seed: int = CENTRAL_SEED, size: str = "full",
                             workers: int | str = "auto", kube_weight: float = 0.0) -> OnlineCentralEvaluator:
    """The online central evaluation (:class:`OnlineCentralEvaluator`)."""
    return OnlineCentralEvaluator(profiles, seed, size, workers, kube_weight)


def load_checkpoint(out: Path) -> tuple[int, Weights | None]:
    """(rounds done, their global weights) from ``out/global.npz``; (0, None) without one."""
    saved = load_npz(out / "global.npz")
    if saved is None:
        return 0, None
    return int(saved.pop(ROUND_KEY)), saved


def member_keys(report: RoundReport) -> dict[int, str]:
    """The key of each node of the round in ``rounds.json``: the partition it reports, or its node
    id where the partition is missing, not a whole number (the member's own report: a NaN there
    must not stop the hub) or already another node's (one member cannot hide another's row)."""
    nodes = (set(report.members) | set(report.norms) | set(report.cosines) | set(report.clipped)
             | set(report.rescaled))
    keys: dict[int, str] = {}
    for node in sorted(nodes):
        part = report.members.get(node, {}).get("partition")
        key = str(node)
        whole = part is not None and math.isfinite(part) and part == int(part)
        if whole and str(int(part)) not in keys.values():
            key = str(int(part))
        keys[node] = key
    return keys


class HubRecorder:
    """Flower's ``evaluate_fn`` for the hub: central evaluation, ``rounds.json``, the checkpoint."""

    def __init__(self, out: Path, strategy: QuantizedUpdates, evaluate: Callable[[Weights], dict[str, float]],
                 resumed_from: int) -> None:
        self.out, self.strategy, self.evaluate, self.resumed_from = out, strategy, evaluate, resumed_from
        self.history_path = out / "rounds.json"
        resumed = resumed_from > 0 and self.history_path.exists()
        previous = json.loads(self.history_path.read_text()) if resumed else []
        self.history: list[dict[str, Any]] = [h for h in previous if h["round"] <= resumed_from]
        self.t0 = time.time()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round <= self.resumed_from:  # the initial arrays: already evaluated and recorded
            return None
        weights = {k: v.numpy() for k, v in arrays.items()}
        central = self.evaluate(weights)
        report = self.strategy.reports.get(server_round)
        entry: dict[str, Any] = {"round": server_round, "central": central, "rejected": [], "skipped": [],
                                 "members": {}}
        if report is not None:
            entry["rejected"] = [asdict(r) for r in report.rejected]
            entry["skipped"] = list(report.skipped)
            key = member_keys(report)
            entry["norms"] = {key[node]: n for node, n in report.norms.items()}
            entry["cosines"] = {key[node]: c for node, c in report.cosines.items()}
            entry["direction_checked"] = report.direction_checked
            entry["members"] = {key[node]: m for node, m in report.members.items()}
            entry["clipped"] = {key[node]: {"claimed": claimed, "counted": counted}
                                for node, (claimed, counted) in report.clipped.items()}
            entry["rescaled"] = {key[node]: {"norm": norm, "counted": counted}
                                 for node, (norm, counted) in report.rescaled.items()}
            if report.train_metrics is not None:
                entry["train"] = report.train_metrics
        entry["wall_s"] = round(time.time() - self.t0, 1)
        self.history.append(entry)
        # History first, checkpoint second: a hub killed in between re-runs this round on restart.
        self.history_path.write_text(json.dumps(self.history, indent=2))
        save_npz(self.out / "global.npz", {**weights, ROUND_KEY: np.array(server_round)})
        return MetricRecord(central)

    def finish(self, rounds: int) -> None:
        """``final.json``: the target number of rounds, the round resumed from, the whole history."""
        (self.out / "final.json").write_text(json.dumps({"rounds": rounds, "resumed_from": self.resumed_from,
                                                         "history": self.history}, indent=2))
