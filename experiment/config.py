"""What the main job runs: :class:`FederateConfig`.

Its run-config fields default to the Flower run config's (pyproject's ``[tool.flwr.app.config]``,
via :mod:`fedsched.common.federation.run_config`; the member's through the typed
:class:`fedsched.agent.federation.round.MemberRunConfig`), never a second copy; a run passes the
values it sets with ``flwr run --run-config`` (:meth:`FederateConfig.run_config`), and the
local-only baseline trains with the same member settings (:meth:`FederateConfig.member_config`).

May import: ``fedsched.common`` and ``fedsched.agent.federation.round``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fedsched.agent.federation.round import MemberRunConfig
from fedsched.common.federation.run_config import Value, app_defaults

# The Flower app's run-config defaults: FederateConfig's defaults, never a second copy.
HUB = app_defaults()  # the hub's keys (rounds, members, FedProx's mu, the start and a random start's seed)
MEMBER = MemberRunConfig.defaults()  # the members' keys, typed


@dataclass
class FederateConfig:
    """What the main job runs (``--quick``: :meth:`quick`). The run-config fields default to
    pyproject's ``[tool.flwr.app.config]``."""

    clusters: int = int(HUB["min-nodes"])  # member clusters (non-IID profiles, cycled)
    member_size: str = MEMBER.member_size  # full: realistic 40-100-node members | small: smoke variants
    rounds: int = int(HUB["num-server-rounds"])  # federated rounds per strategy
    local_decisions: int = MEMBER.local_decisions  # pods a member learns from per round
    scarce_decisions: int = MEMBER.scarce_decisions  # the same for the data-scarce members
    late_round: int = MEMBER.late_round  # the round the late member joins
    local_epochs: int = MEMBER.local_epochs  # passes of each round's credit regression
    local_learning_rate: float = MEMBER.local_learning_rate
    kube_weight: float = MEMBER.kube_weight  # kube-default's score beside the logits, wherever a model scores
    eta: float = MEMBER.eta  # personalisation: eta * W_local + (1 - eta) * W_global
    proximal_mu: float = float(HUB["proximal-mu"])  # FedProx
    # The starting model of every member, federated or alone: the run config's, the shipped online
    # policy, as a fleet starts ("random": a seeded random model, to measure learning from nothing).
    init: str = str(HUB["init"])
    seed: int = int(HUB["seed"])  # seed of a random starting model
    # seeds the members' rounds, federated and alone: another value is another training run of the
    # same configuration (its verdicts hold the training's variation only when pooled over several)
    training_seed: int = MEMBER.training_seed
    eval_seeds: int = 5  # replay seeds of the per-member evaluation (not a run-config setting)
    # the personalisation sweep of the evaluation (eta 0 is the global model, always in; so is the
    # run's eta). Each eta is another learned policy to replay on every member's test pods.
    etas: tuple[float, ...] = (0.0,)
    strategies: tuple[str, ...] = ("fedavg", "fedprox")
    workers: int = field(default_factory=lambda: max(1, min(2, os.cpu_count() or 1)))  # local processes
    # Run local-only and the replays that need no federated model in the worker pool beside the
    # Flower runs instead of after them, at the lowest CPU priority (SCHED_IDLE; Ray's actors at
    # nice 0): they take what the runs leave idle (the runtime's start-up, a round's last member).
    # They still slow the runs (fedavg 220 s against 154 s; probably the shared cache and memory,
    # which no CPU priority covers) but fill more than that: the default job 594 s against
    # 617 s after them, the same report, one run each on a 2-core AMD EPYC. At normal priority it
    # was the other way round (1,430 s against 1,305 s).
    beside_flower: bool = True

    @classmethod
    def quick(cls) -> FederateConfig:
        """A smoke test of the whole job in under 2 minutes: the small 6-10-node members, 3 rounds,
        small budgets, 2 seeds, FedAvg only (its verdicts are not a result)."""
        return cls(member_size="small", rounds=3, local_decisions=200, scarce_decisions=20, late_round=2,
                   eval_seeds=2, etas=(0.0, 0.2, 1.0), strategies=("fedavg",))

    def run_config(self, strategy: str, run_dir: Path) -> dict[str, Value]:
        """The run-config values this job sets for one run of ``strategy`` into ``run_dir``. Only
        the first strategy's members report validation scores: the report reads that run's
        (the per-round plot, the late member's rounds to local-only's quality) and no other's."""
        return {"num-server-rounds": self.rounds, "strategy": strategy, "proximal-mu": self.proximal_mu,
                "validate": int(strategy == self.strategies[0]),
                "min-nodes": self.clusters, "member-size": self.member_size, "eta": self.eta,
                "mode": "online",
                "local-decisions": self.local_decisions, "scarce-decisions": self.scarce_decisions,
                "late-round": self.late_round, "local-epochs": self.local_epochs,
                "local-learning-rate": self.local_learning_rate, "kube-weight": self.kube_weight,
                "init": self.init,
                "seed": self.seed, "training-seed": self.training_seed,
                "out-dir": str(run_dir / "hub"), "state-dir": str(run_dir / "state")}

    def member_config(self, run_dir: Path) -> MemberRunConfig:
        """The settings every member of a run of this job into ``run_dir`` reads (the first
        strategy's run; the members' settings do not depend on the strategy)."""
        return MemberRunConfig.from_run_config(self.run_config(self.strategies[0], run_dir))
