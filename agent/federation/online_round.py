"""A member's federated round in online (replay) mode: learning from its own rewards.

Each round the member

1. starts from its personalised mix ``eta * W_local + (1 - eta) * W_global`` (the global
   weights alone the first time);
2. schedules ``decisions`` pods of its own training workload in its replay twin (its nodes, a
   random contiguous window of its training pods, replayed at its load) under an exploring
   behaviour policy: at each decision one of the load-aware heuristics of
   ``agent/learning/credit.py``'s ``BEHAVIOURS``, its *current* policy (so the data follows
   what it would do), or a random feasible node;
3. pairs every decision with its node credit (the chosen node's hot CPU minutes, throttled
   CPU core-minutes and the placed pod's OOM kills over 30 simulated minutes) and appends them
   to its experience log (the decision-log format, reward columns ``credit`` and ``tie``, kept
   in its state directory: a member's data never leaves it);
4. fits the policy by credit regression (:func:`fedsched.agent.learning.credit.fit_credit`) on
   its whole experience (the newest ``max_experience`` decisions), with FedProx's proximal term
   anchored at ``W_global`` when ``mu > 0``;
5. reports the delta to upload, the pods it scheduled this round (the aggregation weight), their
   mean credit and the validation score of its new personalised model: the mean log ratio of
   its hot CPU node-seconds, throttled CPU, OOM kills and failed pods to kube-default's on the
   member's *validation* pods (``fedsched.common.model.metrics.trouble_score``; below 0 is better
   than kube-default; kube-default's figures are computed once and kept in the state directory).

Why credit regression (a fitted one-step Q) rather than PPO: the regression target is the
member's own measured outcome of each decision, so a member with few decisions still gets a
usable signal, and regressions average well (the federation averages fits of the same function
on different data); the same fit runs on a deployed member's decision log
(:func:`fedsched.agent.federation.task.finetune_on_log`).

May import: ``fedsched.common`` and ``fedsched.agent.learning``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsched.agent.learning.credit import BEHAVIOURS, CreditConfig, Credited, collect_credited, fit_credit
from fedsched.agent.learning.env import EnvConfig, RewardConfig, SchedulingEnv
from fedsched.agent.learning.online import VALIDATION_METRICS
from fedsched.common.federation.members import Member, reference_typical
from fedsched.common.federation.weights import load_weights, weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.cluster import PodTable
from fedsched.common.model.metrics import trouble_score
from fedsched.common.model.traces import fits_somewhere
from fedsched.common.schedulers import SchedulerContext
from fedsched.common.sim.evaluate import make_policy
from fedsched.common.sim.replay import ReplayConfig, run_replay

Weights = dict[str, np.ndarray]
CREDIT_HORIZON_S = 1800.0
VALIDATION_SEED = 2024


@dataclass
class OnlineRoundConfig:
    """One online round's settings (from the run config)."""

    decisions: int = 600
    """pods the member schedules (and learns from) this round"""
    epochs: int = 4
    """passes of the credit regression over the member's experience"""
    learning_rate: float = 1e-3
    """Adam step size of the regression"""
    window: float = 0.6
    """share of the member's training pods in this round's replay window"""
    max_experience: int = 20_000
    """newest decisions of the experience log the fit uses"""
    explore: float = 0.25
    """share of decisions at a random feasible node"""
    warmup: float = 0.3
    """share of the window's pods scheduled before the round's decisions are collected (the
    replay starts from an empty cluster, whose first decisions meet no trouble)"""
    proximal_mu: float = 0.0
    """FedProx: weight of ``mu / 2 * ||w - W_global||^2`` (0: FedAvg's plain local fit)"""


def member_env(member: Member, seed: int, window: float = 0.6) -> SchedulingEnv:
    """The member's replay twin for one round: its nodes and a random contiguous window of its
    training pods (``window`` of them, at least 50), node credit on."""
    n = len(member.train)
    size = min(n, max(50, round(window * n)))
    start = int(np.random.default_rng(seed).integers(0, n - size + 1))
    pods = fits_somewhere(member.train.select(np.arange(start, start + size)), member.nodes)
    replay = {**member.replay, "allow_unreachable_load": True}
    return SchedulingEnv(member.nodes, pods, typical=reference_typical(),
                         config=EnvConfig(mode="replay", replay=replay,
                                          reward=RewardConfig(node_horizon_s=CREDIT_HORIZON_S)),
                         seed=seed)


def policy_of(weights: Weights) -> NodeScoringPolicy:
    policy = NodeScoringPolicy()
    load_weights(policy, weights)
    return policy.eval()


def collect_round(member: Member, weights: Weights, cfg: OnlineRoundConfig, seed: int) -> list[Credited]:
    """``cfg.decisions`` credited decisions of the member's replay twin under the exploring
    behaviour policy that includes the current policy ``weights``."""
    ctx = SchedulerContext(train_pods=member.train, rng=np.random.default_rng(seed))
    behaviours = [make_policy(b, ctx, "replay") for b in BEHAVIOURS]
    behaviours.append(PolicyScheduler(policy_of(weights), reference_typical(), name="current"))
    env = member_env(member, seed, cfg.window)
    warmup = int(cfg.warmup * len(env.pool))
    return collect_credited([env], behaviours, CreditConfig(samples=cfg.decisions, explore=cfg.explore,
                                                            seed=seed, warmup=warmup))


class Experience:
    """The member's experience log (``DIR/experience``, the decision-log format)."""

    def __init__(self, directory: str | Path) -> None:
        from fedsched.agent.serving.decision_log import DecisionLog

        self.log = DecisionLog(Path(directory) / "experience")

    def add(self, data: list[Credited], version: str) -> None:
        for c in data:
            self.log.append(c.decision, c.chosen, version, {"credit": c.credit, "tie": c.tie})
        self.log.flush()

    def newest(self, n: int) -> list[Credited]:
        from fedsched.agent.learning.credit import credited_from_log

        return credited_from_log(self.log.tail_records(n))

    def __len__(self) -> int:
        return len(self.log)


def fit_round(start: Weights, data: list[Credited], cfg: OnlineRoundConfig, seed: int,
              anchor: Weights | None = None) -> tuple[Weights, dict[str, float]]:
    """Credit regression from ``start`` on ``data``; FedProx's term anchored at ``anchor``."""
    if not data:
        raise ValueError("no credited decisions to fit")
    torch.manual_seed(seed)
    policy = policy_of(start)
    ref = ({k: torch.from_numpy(np.asarray(v)) for k, v in anchor.items()}
           if anchor is not None and cfg.proximal_mu > 0 else None)
    credit = CreditConfig(epochs=cfg.epochs, learning_rate=cfg.learning_rate, seed=seed)
    stats = fit_credit(policy, data, credit, anchor=ref, proximal_mu=cfg.proximal_mu)
    return weights_of(policy), stats


def replay_metrics(member: Member, scheduler: Any, pods: PodTable,
                   seed: int = VALIDATION_SEED) -> dict[str, float]:
    """The online metrics of one replay of ``pods`` on the member's nodes at its load."""
    cfg = ReplayConfig(**{**member.replay, "allow_unreachable_load": True})
    res = run_replay(member.nodes, pods, scheduler, config=cfg, seed=seed, typical=reference_typical())
    return {k: float(v) for k, v in res.metrics.items()
            if isinstance(v, int | float | np.floating | np.integer)}


def validation_rows(member: Member, weights: Weights,
                    state_dir: str | Path | None = None) -> dict[str, dict[str, float]]:
    """The policy beside kube-default on the member's validation pods (``VALIDATION_METRICS``;
    empty without validation pods): ``{"policy": {...}, "kube-default": {...}}``. kube-default's
    figures do not depend on the policy: with ``state_dir`` they are computed once and kept there."""
    if member.val is None or not len(member.val):
        return {}
    ref_path = Path(state_dir) / "kube-validation.json" if state_dir is not None else None
    if ref_path is not None and ref_path.exists():
        ref = json.loads(ref_path.read_text())
    else:
        kube = make_policy("kube-default", SchedulerContext(rng=np.random.default_rng(0)), "replay")
        ref = {m: replay_metrics(member, kube, member.val)[m] for m in VALIDATION_METRICS}
        if ref_path is not None:
            ref_path.parent.mkdir(parents=True, exist_ok=True)
            ref_path.write_text(json.dumps(ref))
    got = replay_metrics(member, PolicyScheduler(policy_of(weights), reference_typical()), member.val)
    return {"policy": {m: got[m] for m in VALIDATION_METRICS}, "kube-default": ref}


def validation_score(member: Member, weights: Weights, state_dir: str | Path) -> float:
    """The trouble score (``fedsched.common.model.metrics.trouble_score``) of the policy against
    kube-default on the member's validation pods (lower is better; NaN without them)."""
    rows = validation_rows(member, weights, state_dir)
    return trouble_score(rows["policy"], rows["kube-default"]) if rows else math.nan
