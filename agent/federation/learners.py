"""How a member learns in its round: the learning step of the round's skeleton
(:func:`fedsched.agent.federation.round.member_round`), one :class:`Learner` per way of learning,
and :func:`learner_for`, which picks the member's.

- :class:`ReplayCreditLearner` (simulation, ``mode = "online"``): learning from the member's own
  rewards in its replay twin. It schedules ``decisions`` pods of its own training workload (its
  nodes, a random contiguous window of its training pods, replayed at its load; the first
  ``warmup`` share of the window's pods scheduled before any decision is collected, as the
  replay starts from an empty cluster) under an exploring behaviour policy: at each decision
  one of the load-aware heuristics of ``agent/learning/credit.py``'s ``BEHAVIOURS``, its
  *current* policy (the personalised start, so the data follows what it would do), or a random
  feasible node. Every decision is paired with its node credit (the chosen node's hot CPU
  minutes, throttled CPU core-minutes and the placed pod's OOM kills over 30 simulated minutes)
  and appended to its experience log (:class:`Experience`: the decision-log format, reward
  columns ``credit`` and ``tie``, kept in its state directory: a member's data never leaves
  it). The policy is then fitted by credit regression
  (:func:`fedsched.agent.learning.credit.fit_credit`) on its whole experience (the newest
  ``max_experience`` decisions). It reports the pods it scheduled (the aggregation weight), their
  mean credit, and the validation score of its new personalised model
  (:func:`fedsched.agent.federation.validation.validation_score`). A late member joins at
  ``late-round``.
- :class:`PPOPackingLearner` (simulation, ``mode = "packing"``): PPO in packing mode on the
  member's training pods, ``local-steps`` decisions with the ``ppo-*`` settings
  (:func:`ppo_config`).
- :class:`LogFinetuneLearner` (a deployed member whose node config names a ``decision-log``):
  the same credit regression on the outcomes of its own recent decisions (the last ``window``
  records of its decision log with a known outcome: the node credit from each record's reward
  terms, :func:`fedsched.agent.learning.credit.credited_from_log`); a node the log shows going hot
  after the member's choices gets a lower score. With ``serve_path`` it writes its new personalised
  mix there (:func:`write_serving_checkpoint`) for the member's extender (``fedsched serve --policy``
  hot-reloads it), with the roll-out gate's evidence from the member's own validation pods
  (paired replays beside kube-default on several seeds), which the extender's gate reads. It
  always uploads.

Why credit regression (a fitted one-step Q) rather than PPO for a member's own rewards: the
regression target is the member's own measured outcome of each decision, so a member with few
decisions still gets a usable signal, and regressions average well (the federation averages
fits of the same function on different data); the same fit runs on a deployed member's log.

Every learner takes FedProx's proximal term anchored at ``W_global`` when the round's ``mu`` > 0
and is seeded by the round's seed.

May import: ``fedsched.common`` and ``fedsched.agent.learning``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedsched.agent.federation.round import Learned, Learner, MemberRunConfig, MemberState, RoundInfo
from fedsched.agent.federation.validation import member_evidence, validation_score
from fedsched.agent.learning.credit import (
    BEHAVIOURS,
    CreditConfig,
    Credited,
    collect_credited,
    credited_from_log,
    fit_credit,
)
from fedsched.agent.learning.env import EnvConfig, RewardConfig, SchedulingEnv
from fedsched.agent.learning.ppo import PPOConfig, PPOTrainer
from fedsched.common.federation.members import Member, reference_typical
from fedsched.common.federation.run_config import Value
from fedsched.common.federation.scoring import member_scheduler, policy_of
from fedsched.common.federation.weights import load_weights, weights_of
from fedsched.common.learning.checkpoint import (
    load_checkpoint,
    save_checkpoint,
    typical_from_dict,
    update_metadata,
)
from fedsched.common.learning.decision_log import DecisionLog
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.learning.scorers import SCORING_KEY, scoring_metadata
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.traces import fits_somewhere
from fedsched.common.schedulers import LEARNED_ONLINE, SchedulerContext, default_policy_path
from fedsched.common.sim.evaluate import make_policy

Weights = dict[str, np.ndarray]
CREDIT_HORIZON_S = 1800.0  # the node credit's horizon after each bind (30 simulated minutes)


def fit_credit_round(start: Weights, data: list[Credited], *, epochs: int, learning_rate: float, seed: int,
                     mu: float = 0.0, anchor: Weights | None = None) -> Weights:
    """Credit regression from ``start`` on ``data``; FedProx's term (``mu`` > 0) anchored at ``anchor``."""
    if not data:
        raise ValueError("no credited decisions to fit")
    torch.manual_seed(seed)
    policy = policy_of(start)
    ref = ({k: torch.from_numpy(np.asarray(v)) for k, v in anchor.items()}
           if anchor is not None and mu > 0 else None)
    credit = CreditConfig(epochs=epochs, learning_rate=learning_rate, seed=seed)
    fit_credit(policy, data, credit, anchor=ref, proximal_mu=mu)
    return weights_of(policy)


# ---- online mode: credit regression on the member's own rewards in its replay twin ----------------
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


class Experience:
    """The member's experience log (``DIR/experience``, the decision-log format)."""

    def __init__(self, directory: str | Path) -> None:
        self.log = DecisionLog(Path(directory) / "experience")

    def add(self, data: list[Credited], version: str) -> None:
        for c in data:
            self.log.append(c.decision, c.chosen, version, {"credit": c.credit, "tie": c.tie})
        self.log.flush()

    def newest(self, n: int) -> list[Credited]:
        return credited_from_log(self.log.tail_records(n))

    def __len__(self) -> int:
        return len(self.log)


@dataclass
class ReplayCreditLearner(Learner):
    """Online mode: credit regression on the member's own rewards in its replay twin (module docstring)."""

    member: Member
    decisions: int = 600
    """pods the member schedules (and learns from) this round"""
    epochs: int = 4
    """passes of the credit regression over the member's experience"""
    learning_rate: float = 1e-3
    """Adam step size of the regression"""
    joins_at: int = 1
    """the first round the member takes part in"""
    window: float = 0.6
    """share of the member's training pods in this round's replay window"""
    max_experience: int = 20_000
    """newest decisions of the experience log the fit uses"""
    explore: float = 0.25
    """share of decisions at a random feasible node"""
    warmup: float = 0.3
    """share of the window's pods scheduled before the round's decisions are collected (the
    replay starts from an empty cluster, whose first decisions meet no trouble)"""
    kube_weight: float = 0.0
    """kube-default's score / 100 times this beside the logits where the member's own policy
    schedules (the behaviour policy's ``current`` and validation)"""
    validate: bool = True
    """report the personalised model's validation score after each round (False: NaN, no replay)"""

    @classmethod
    def from_config(cls, member: Member, cfg: MemberRunConfig) -> ReplayCreditLearner:
        """The member's settings: ``scarce_decisions`` for a data-scarce member, else
        ``local_decisions``; ``local_epochs``, ``local_learning_rate``, ``kube_weight``, ``validate``; a late
        member joins at ``late_round``."""
        spec = member.spec
        return cls(member, decisions=cfg.scarce_decisions if spec is not None and spec.scarce
                   else cfg.local_decisions,
                   epochs=cfg.local_epochs, learning_rate=cfg.local_learning_rate,
                   joins_at=max(cfg.late_round, 1) if spec is not None and spec.late else 1,
                   kube_weight=cfg.kube_weight, validate=_validate(cfg.validate))

    def collect(self, weights: Weights, seed: int) -> list[Credited]:
        """``decisions`` credited decisions of the member's replay twin under the exploring
        behaviour policy that includes the current policy ``weights``."""
        ctx = SchedulerContext(train_pods=self.member.train, rng=np.random.default_rng(seed))
        behaviours = [make_policy(b, ctx, "replay") for b in BEHAVIOURS]
        behaviours.append(member_scheduler(weights, self.kube_weight, name="current"))
        env = member_env(self.member, seed, self.window)
        warmup = int(self.warmup * len(env.pool))
        return collect_credited([env], behaviours, CreditConfig(samples=self.decisions, explore=self.explore,
                                                                seed=seed, warmup=warmup))

    def learn(self, start: Weights, global_w: Weights, state: MemberState, info: RoundInfo) -> Learned:
        data = self.collect(start, info.seed)
        experience = Experience(state.dir)
        experience.add(data, f"round-{info.server_round}")
        new = fit_credit_round(start, experience.newest(self.max_experience), epochs=self.epochs,
                               learning_rate=self.learning_rate, seed=info.seed, mu=info.mu, anchor=global_w)
        return Learned(new, len(data), float(np.mean([c.credit for c in data])))

    def after_round(self, personalised: Weights, state: MemberState, info: RoundInfo) -> float:
        if not self.validate:
            return math.nan
        return validation_score(self.member, personalised, state.dir, self.kube_weight)


def _validate(value: int) -> bool:
    """Run config ``validate``: 1 or 0, anything else refused."""
    if value not in (0, 1):
        raise ValueError(f"run config validate must be 1 or 0, got {value!r}")
    return bool(value)


# ---- packing mode: PPO ------------------------------------------------------------------------------
def ppo_config(cfg: MemberRunConfig, info: RoundInfo) -> PPOConfig:
    """A packing round's PPO settings: ``local_steps`` decisions, ``ppo_rollout_steps`` per rollout
    (at most ``local_steps``), the ``ppo_*`` settings, the round's ``mu`` and seed; every other
    field keeps :class:`fedsched.agent.learning.ppo.PPOConfig`'s default."""
    steps = cfg.local_steps
    return PPOConfig(total_steps=steps, num_steps=min(cfg.ppo_rollout_steps, steps),
                     num_minibatches=cfg.ppo_num_minibatches, update_epochs=cfg.ppo_update_epochs,
                     learning_rate=cfg.ppo_learning_rate, proximal_mu=info.mu, seed=info.seed)


@dataclass
class PPOPackingLearner(Learner):
    """Packing mode: PPO on the member's training pods (:func:`ppo_config`'s settings)."""

    member: Member
    cfg: MemberRunConfig

    def learn(self, start: Weights, global_w: Weights, state: MemberState, info: RoundInfo) -> Learned:
        ppo = ppo_config(self.cfg, info)
        policy = NodeScoringPolicy()
        load_weights(policy, start)
        anchor = {k: torch.from_numpy(np.asarray(v)) for k, v in global_w.items()
                  if k in dict(policy.named_parameters())}
        typical = TypicalPods.from_pods(self.member.train)
        env = SchedulingEnv(self.member.nodes, self.member.train, typical=typical,
                            config=EnvConfig(mode="packing", target_load=1.1), seed=ppo.seed)
        trainer = PPOTrainer([env], ppo, policy, anchor=anchor if ppo.proximal_mu > 0 else None)
        rewards: list[float] = []
        trainer.train(on_update=lambda s: rewards.append(s["mean_reward"]))
        return Learned(weights_of(trainer.policy), trainer.global_step,
                       float(np.mean(rewards)) if rewards else 0.0)


# ---- a deployed member: its decision log ------------------------------------------------------------
@dataclass
class LogFinetuneLearner(Learner):
    """A deployed member: credit regression on its decision log's outcomes (module docstring)."""

    always_uploads: ClassVar[bool] = True

    log_dir: str
    """the member's decision log (written by its extender's outcome recorder)"""
    window: int
    """the newest decisions of the log with a known outcome it learns from"""
    epochs: int
    """passes of the regression"""
    learning_rate: float
    """Adam step size of the regression"""
    member: Member | None = None
    """the member's cluster: its validation pods judge the checkpoint written to ``serve_path``"""
    serve_path: str | None = None
    """where the member's extender reads its policy (None: nothing is written)"""
    kube_weight: float = 0.0
    """the served checkpoint's scoring option: kube-default's score / 100 times this beside the logits"""

    def learn(self, start: Weights, global_w: Weights, state: MemberState, info: RoundInfo) -> Learned:
        data = credited_from_log(DecisionLog(self.log_dir).tail_records(self.window))
        if not data:
            raise ValueError(f"decision log {self.log_dir} has no decision with a known outcome: nothing to "
                             "learn from this round (is the extender's outcome recorder on?)")
        new = fit_credit_round(start, data, epochs=self.epochs, learning_rate=self.learning_rate,
                               seed=info.seed, mu=info.mu, anchor=global_w)
        return Learned(new, len(data), 0.0)

    def after_round(self, personalised: Weights, state: MemberState, info: RoundInfo) -> float:
        if self.serve_path:
            write_serving_checkpoint(self.serve_path, personalised, info.server_round, member=self.member,
                                     kube_weight=self.kube_weight)
        return math.nan


def write_serving_checkpoint(path: str | Path, weights: Weights, server_round: int,
                             base: str | Path | None = None, member: Member | None = None,
                             kube_weight: float = 0.0) -> Path:
    """Write the weights a member's extender should serve (``fedsched serve --policy PATH``
    watches the file and hot-reloads it), scored with ``kube_weight`` (its scoring options: the
    run's, not ``base``'s, as the member learned and validated with them). Metadata (typical
    pods, hyper-parameters) comes from ``base`` (default: the shipped online policy, whose kind
    of model the members train); with
    ``member`` the checkpoint carries the roll-out gate's evidence from the member's own
    validation pods (:func:`fedsched.agent.federation.validation.member_evidence`): served
    actively only where that proves it better than kube-default with no guardrail worse, else
    in shadow. The file is written and judged beside ``path`` and moved into place in one
    rename, so the server never reads half a file, nor a file without its evidence."""
    path = Path(path)
    base_policy, meta, _ = load_checkpoint(base or default_policy_path(LEARNED_ONLINE))
    load_weights(base_policy, weights)
    staged = path.with_name(f".{path.name}.staged.pt")
    save_checkpoint(staged, base_policy, algorithm="federated-personalised",
                    hyperparameters=meta.get("hyperparameters", {}),
                    typical=typical_from_dict(meta.get("typical_pods")),
                    data=meta.get("data_hash", ""),
                    extra={"server_round": int(server_round),
                           SCORING_KEY: scoring_metadata(kube_weight)})
    try:
        evidence = member_evidence(member, staged) if member is not None else {}
        if evidence:
            update_metadata(staged, {"operating_mode": "online", "evidence": evidence})
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)
    return path


def learner_for(member: Member, cfg: MemberRunConfig, node_config: Mapping[str, Value]) -> Learner:
    """The member's way of learning: on its decision log when its node config names one
    (``decision-log``, with ``window`` overriding ``finetune_window``, and ``serve-policy``),
    else in simulation by ``mode`` (``online``: credit regression in the member's replay twin;
    ``packing``: PPO in packing mode)."""
    log_dir = node_config.get("decision-log")
    if log_dir:  # deployment: learn from the member's own recent decisions and their outcomes
        serve_path = node_config.get("serve-policy")
        return LogFinetuneLearner(str(log_dir), window=int(node_config.get("window", cfg.finetune_window)),
                                  epochs=cfg.finetune_epochs, learning_rate=cfg.finetune_learning_rate,
                                  member=member, serve_path=str(serve_path) if serve_path else None,
                                  kube_weight=cfg.kube_weight)
    if cfg.mode == "online":
        return ReplayCreditLearner.from_config(member, cfg)
    if cfg.mode != "packing":
        raise ValueError(f"run config mode must be online or packing, got {cfg.mode!r}")
    return PPOPackingLearner(member, cfg)
