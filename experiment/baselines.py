"""The main job's baselines and per-member evaluation, beside the federated runs.

- :func:`local_only`: the same rounds, decision budget and seeds on one member alone (eta = 1,
  no global model after the shared start), with the member's own round code;
  :func:`load_local_only` reads back what it left.
- :func:`evaluate_member`: every policy on the member's held-out *test* pods (replay at its load,
  ``eval_seeds`` seeds, the same seeds for every policy), mean and 95% CI of the online metrics,
  the trouble score taken seed by seed against kube-default's run with the same seed.
- :class:`MemberEvaluation`: the same for every member, as one queue of replays, with each
  member's best heuristic among them: the load-aware baseline with the lowest trouble score on
  its *validation* pods (model selection never sees test pods).
- :func:`verdicts`: per member, the run's personalised model against local-only and
  kube-default, seed by seed, on the trouble score and failed pods
  (:func:`fedsched.common.sim.paired.paired_difference`, the comparison every verdict uses), and
  the issue's goals.

The replays run in worker processes (``pool``: a ``ProcessPoolExecutor`` started with
:func:`fedsched.common.compute.single_threaded_worker`).

May import: ``fedsched.common``, ``fedsched.agent.federation`` and ``fedsched.experiment.config``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import shutil
from collections.abc import Callable
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.agent.federation.learners import ReplayCreditLearner
from fedsched.agent.federation.round import MemberState, RoundInfo, member_round
from fedsched.common.federation.members import member_cluster
from fedsched.common.sim.paired import one_sided_bounds, paired_difference
from fedsched.experiment.config import FederateConfig

ONLINE_METRICS = ("trouble_score", "hot_cpu_node_s", "throttled_cpu_core_s", "oom_kills_per_1k_starts",
                  "pending_p99_s", "failed_pods")
GPU_METRICS = ("gpu_frag_amount_avg",)
LOCAL_ONLY_SCORES = "val-scores.json"  # local-only's validation score per round, in its state directory
SCARCE_MARGIN = 0.10  # trouble score by which a data-scarce member's personalised model beats local-only
HEURISTICS = ("kube-default", "koordinator-load-aware", "load-variation-risk-balancing",
              "target-load-packing")


def local_only(member_id: int, cfg: FederateConfig, init: dict[str, np.ndarray], out: Path
               ) -> tuple[dict[str, np.ndarray], list[float]]:
    """The same rounds, decision budget and seeds on one member alone: the member's round of the
    federated run (:func:`fedsched.agent.federation.round.member_round` with its online learner)
    at eta = 1 (the global model never enters after the shared start), uploading every round,
    from round 1 also for the late member; returns its final weights and its validation score
    after every round."""
    member_cfg = cfg.member_config(out)  # what a member of this job gets
    alone = dataclasses.replace(member_cfg, eta=1.0, upload_every=1, upload_norm=math.inf)
    member = member_cluster(member_id, size=cfg.member_size)
    learner = dataclasses.replace(ReplayCreditLearner.from_config(member, member_cfg), joins_at=1)
    state = MemberState(out / "local-only" / member.name)
    if state.dir.exists():
        shutil.rmtree(state.dir)
    scores = []
    for rnd in range(1, cfg.rounds + 1):
        info = RoundInfo.for_member(rnd, member_id, training_seed=alone.training_seed)
        r = member_round(learner, state, init, alone, info)
        scores.append(r.val_score)
    weights = state.load("local")
    assert weights is not None
    (state.dir / LOCAL_ONLY_SCORES).write_text(json.dumps(scores))
    return weights, scores


def load_local_only(member_name: str, out: Path) -> tuple[dict[str, np.ndarray], list[float]] | None:
    """What :func:`local_only` left in ``out`` for a member (its final weights and validation
    scores), or None when it did not finish there."""
    state = MemberState(out / "local-only" / member_name)
    weights, scores = state.load("local"), state.dir / LOCAL_ONLY_SCORES
    if weights is None or not scores.exists():
        return None
    return weights, [float(x) for x in json.loads(scores.read_text())]


@functools.cache
def _member(member_id: int, size: str) -> Any:
    """The member's cluster, built once per worker process."""
    return member_cluster(member_id, size=size)


def _replay(args: tuple[int, str, Any, int, str, float]) -> dict[str, float]:
    """One replay of a member's (its partition id, its size) ``split`` pods (test or val) under
    ``spec``: a baseline name, or policy weights scored with the last element, the kube weight."""
    from fedsched.agent.federation.validation import VALIDATION_SEED, replay_metrics
    from fedsched.common.federation.scoring import member_scheduler
    from fedsched.common.schedulers import SchedulerContext
    from fedsched.common.sim.evaluate import make_policy

    member_id, size, spec, seed, split, kube_weight = args
    member = _member(member_id, size)
    if isinstance(spec, str):
        sched = make_policy(spec, SchedulerContext(train_pods=member.train, rng=np.random.default_rng(seed)),
                            "replay")
    else:
        sched = member_scheduler(spec, kube_weight)
    pods = member.test if split == "test" else member.val
    return replay_metrics(member, sched, pods, seed=seed if split == "test" else VALIDATION_SEED)


def _choose(runs: list[dict[str, float]]) -> tuple[str, dict[str, float]]:
    """The heuristic of ``runs`` (the validation replays of :data:`HEURISTICS`, in order) with the
    lowest trouble score against kube-default's (the first), and every heuristic's score."""
    from fedsched.common.model.metrics import trouble_score

    scores = {h: trouble_score(r, runs[0]) for h, r in zip(HEURISTICS, runs, strict=True)}
    return min(scores, key=lambda h: (scores[h], HEURISTICS.index(h))), scores


def evaluate_member(member_id: int, cfg: FederateConfig, policies: dict[str, Any], pool: Any,
                    has_gpus: bool) -> dict[str, dict]:
    """Per policy: mean and 95% CI over ``eval_seeds`` replays of the member's test pods of the
    online metrics (and GPU fragmentation on a GPU cluster), the trouble score taken seed by seed
    against kube-default's run with the same seed; ``runs`` keeps the per-seed values."""
    seeds = _eval_seeds(cfg)
    names = ["kube-default", *[n for n in policies if n != "kube-default"]]
    jobs = [(member_id, cfg.member_size, policies.get(n, n), s, "test", cfg.kube_weight)
            for n in names for s in seeds]
    results = list(pool.map(_replay, jobs))
    per = {n: results[i * len(seeds):(i + 1) * len(seeds)] for i, n in enumerate(names)}
    return _summary(per, has_gpus)


class MemberEvaluation:
    """The main job's evaluation as one queue of replays on ``pool`` (the figures of
    :func:`evaluate_member` for every member, with each member's best heuristic among them), so
    that no worker waits for another member's last replay and the replays that need no trained
    model run while the models train.

    Built: the heuristics' validation replays of every member are queued (for the choice of each
    member's best heuristic: the load-aware baseline with the lowest trouble score on its
    *validation* pods; model selection never sees test pods). :meth:`add` queues test replays of
    more policies (in each call the costliest first: learned policies on the members with the most
    test pods); :meth:`finish` chooses the heuristics, queues their test replays (cheap) last,
    waits for everything and gives per member (best heuristic, every heuristic's validation
    score, the figures of kube-default, the best heuristic and the added policies in the order
    added). ``ids``: the members' partition ids (default their positions)."""

    def __init__(self, members: list[Any], cfg: FederateConfig, pool: Any, ids: list[int] | None = None
                 ) -> None:
        self.members, self.cfg, self.pool = members, cfg, pool
        self.ids = list(range(len(members))) if ids is None else list(ids)
        self.seeds = _eval_seeds(cfg)
        self.names: list[list[str]] = [[] for _ in members]
        self.futures: dict[tuple[int, str, int], Any] = {}
        self._val = [[self._submit(p, h, 0, "val") for h in HEURISTICS] for p in self.ids]

    def _submit(self, partition: int, spec: Any, seed: int, split: str) -> Any:
        cfg = self.cfg
        return self.pool.submit(_replay, (partition, cfg.member_size, spec, seed, split, cfg.kube_weight))

    def add(self, policies: list[dict[str, Any]]) -> None:
        """Queue the test replays of ``policies[i]`` (name -> a baseline's name or weights) for
        member ``i``."""
        def cost(job: tuple[int, str, Any, int]) -> int:  # a learned decision costs about 5 heuristic ones
            i, _, spec, _ = job
            return len(self.members[i].test) * (1 if isinstance(spec, str) else 5)

        jobs = [(i, n, spec, s) for i, ps in enumerate(policies) for n, spec in ps.items()
                for s in self.seeds]
        jobs.sort(key=cost, reverse=True)  # stable: ties keep the members' and policies' order
        for i, ps in enumerate(policies):
            self.names[i] += [n for n in ps if n not in self.names[i]]
        for i, n, spec, s in jobs:
            self.futures[(i, n, s)] = self._submit(self.ids[i], spec, s, "test")

    def finish(self, progress: Callable[[str], None] = lambda _: None
               ) -> list[tuple[str, dict[str, float], dict[str, dict]]]:
        """Wait for the queue (``progress`` hears of every tenth replay done) and summarise it."""
        chosen = []
        for i, val in enumerate(self._val):
            best, scores = _choose([f.result() for f in val])
            chosen.append((best, scores))
            if best != "kube-default":
                for s in self.seeds:
                    key = (i, f"best heuristic ({best})", s)
                    self.futures[key] = self._submit(self.ids[i], best, s, "test")
        total, step = len(self.futures), max(1, len(self.futures) // 10)
        pending = [f for f in self.futures.values() if not f.done()]
        for done, _ in enumerate(as_completed(pending), total - len(pending) + 1):
            if done % step == 0 or done == total:
                progress(f"evaluation: {done} of {total} test replays done")
        out = []
        for i, m in enumerate(self.members):
            best, scores = chosen[i]
            names = ["kube-default", *([f"best heuristic ({best})"] if best != "kube-default" else []),
                     *[n for n in self.names[i] if n != "kube-default"]]
            per = {n: [self.futures[(i, n, s)].result() for s in self.seeds] for n in names}
            out.append((best, scores, _summary(per, m.nodes.total_gpu_milli > 0)))
        return out


def _eval_seeds(cfg: FederateConfig) -> list[int]:
    return list(range(42, 42 + cfg.eval_seeds))


def _summary(per: dict[str, list[dict[str, float]]], has_gpus: bool) -> dict[str, dict]:
    """Mean and 95% CI of every policy's replays (``per``: each policy's runs, seed by seed, with
    kube-default's first), the trouble score seed by seed against kube-default's run."""
    from fedsched.common.model.metrics import mean_ci95, trouble_score

    metrics = ONLINE_METRICS + (GPU_METRICS if has_gpus else ())
    out: dict[str, dict] = {}
    for n, results in per.items():
        runs = [{**r, "trouble_score": trouble_score(r, k)} for r, k in zip(results, per["kube-default"],
                                                                             strict=True)]
        out[n] = {m: dict(zip(("mean", "ci95"), mean_ci95([r[m] for r in runs]), strict=True))
                  for m in metrics}
        out[n]["runs"] = {m: [r[m] for r in runs] for m in metrics}
    return out


def verdicts(report: dict[str, Any], cfg: FederateConfig) -> dict[str, dict[str, Any]]:
    """Per member: the run's personalised model (eta = ``cfg.eta``) against local-only and
    kube-default, seed by seed, on the trouble score and failed pods; ``no_worse`` when neither
    comparison is significantly worse; local-only against the starting model (whether learning
    alone learned anything); for the late member, the rounds after joining its federated
    validation score took to reach local-only's final one; and the goals met or missed."""
    out: dict[str, dict[str, Any]] = {}
    pers = f"personalised eta={cfg.eta:g}"
    for name, pols in report["clusters"].items():
        info = report["members"][name]
        row: dict[str, Any] = {"scarce": info["scarce"], "late": info["late"]}
        for other in ("local-only", "kube-default"):
            for m in ("trouble_score", "failed_pods"):
                row[f"{m} vs {other}"] = paired_difference(pols[pers]["runs"][m], pols[other]["runs"][m])
        row["no_worse"] = all(v["verdict"] != "worse" for k, v in row.items() if " vs " in k)
        start = next((p for p in ("random start", "shipped start") if p in pols), None)
        if start is not None:  # did learning alone learn anything? local-only against the start
            row["local-only against its start"] = paired_difference(
                pols["local-only"]["runs"]["trouble_score"], pols[start]["runs"]["trouble_score"])
        if info["late"]:
            target = info["local_only_val"][-1]
            curve = info["federated_val"]
            join = info["joins_at"]
            reached = [r for r in range(join, cfg.rounds + 1)
                       if math.isfinite(curve[r - 1]) and curve[r - 1] <= target]
            row["rounds_to_local_only"] = (reached[0] - join + 1) if reached else None
            row["rounds_budget"] = max(1, cfg.rounds // 3)
        # The goals, met or missed. Every member: no comparison significantly worse. A data-scarce
        # member: better than local-only by SCARCE_MARGIN, interval clear (the upper end of the
        # 95% interval below -SCARCE_MARGIN). A rich member: not worse than local-only at one-sided
        # 95% (the one-sided lower bound of the difference at or below 0), better than
        # kube-default (interval clear of 0), and its local-only better than the start (the
        # budget lets learning alone learn, so "does federation add to it" means something). The
        # late member: at local-only's final validation quality within a third of the rounds.
        goals = {"no worse than local-only and kube-default": row["no_worse"]}
        vs_local, vs_kube = row["trouble_score vs local-only"], row["trouble_score vs kube-default"]
        if info["scarce"]:
            goals[f"beats local-only by {SCARCE_MARGIN:g} (scarce member)"] = (
                vs_local["n"] >= 2 and vs_local["mean"] + vs_local["ci95"] < -SCARCE_MARGIN)
        else:
            lower = one_sided_bounds(vs_local["values"])[1]
            goals["not worse than local-only, one-sided 95% (rich member)"] = bool(math.isfinite(lower)
                                                                                   and lower <= 0)
            goals["better than kube-default (rich member)"] = vs_kube["verdict"] == "better"
            if "local-only against its start" in row:
                goals["local-only better than its start (rich member)"] = (
                    row["local-only against its start"]["verdict"] == "better")
        if info["late"]:
            reached_in = row["rounds_to_local_only"]
            goals["reaches local-only within a third of the rounds (late member)"] = (
                reached_in is not None and reached_in <= row["rounds_budget"])
        row["goals"] = goals
        out[name] = row
    return out


def fleet_verdicts(report: dict[str, Any], cfg: FederateConfig) -> dict[str, dict[str, Any]]:
    """Across the members: per seed, the mean over members of each one's trouble score, for the
    comparisons every member shares (personalised against local-only and kube-default, local-only
    and personalised against the start, FedProx's global model against FedAvg's), then paired
    over the seeds. Members replay on the same seed
    numbers, so each seed is one draw of the whole fleet; the mean over five members is narrower
    than any one member's, and answers "does the average member gain", not any one member's
    question."""
    pers = f"personalised eta={cfg.eta:g}"
    clusters = report["clusters"]
    pairs = [(pers, "local-only"), (pers, "kube-default"), ("local-only", "kube-default")]
    starts = [p for p in ("random start", "shipped start") if all(p in pols for pols in clusters.values())]
    start = starts[0] if starts else None
    if start is not None:  # did fine-tuning, alone or federated, improve on the start?
        pairs += [("local-only", start), (pers, start)]
    if {"fedavg", "fedprox"} <= set(cfg.strategies):
        pairs.append(("global fedprox", "global fedavg"))
    out: dict[str, dict[str, Any]] = {}
    for a, b in pairs:
        if not all(a in pols and b in pols for pols in clusters.values()):
            continue
        per_member = [(pols[a]["runs"]["trouble_score"], pols[b]["runs"]["trouble_score"])
                      for pols in clusters.values()]
        seeds = min(len(x) for x, _ in per_member)
        mean_a = [float(np.mean([x[s] for x, _ in per_member])) for s in range(seeds)]
        mean_b = [float(np.mean([y[s] for _, y in per_member])) for s in range(seeds)]
        out[f"trouble_score {a} vs {b}"] = paired_difference(mean_a, mean_b)
    return out
