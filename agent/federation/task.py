"""The member's task, independent of Flower's message plumbing (it takes the run config and the node
config as plain mappings).

- :func:`load_member`: which cluster this member is (its node config's own data when deployed,
  else the simulated cluster of its ``partition-id``) and its :class:`MemberState`.
- :class:`MemberState`: what outlives a run in the member's state directory: its local
  weights ``W_local`` and the change accumulated since its last upload (``.npz``, written
  atomically). The INT8 error-feedback residual belongs to the wire codec
  (:func:`fedsched.agent.federation.mods.codec_mod`, in the run's ``context.state``).
- :func:`ppo_config`: a member round's PPO settings from the run config (``local-steps``,
  ``ppo-rollout-steps``, ``ppo-learning-rate``, ``ppo-update-epochs``, ``ppo-num-minibatches``);
  every other field keeps :class:`fedsched.agent.learning.ppo.PPOConfig`'s default.
- :func:`member_round`: the ClientApp's one local round: fine-tuning on the member's decision
  log when its node config names one, else :func:`local_round`.
- :func:`local_round`: one federated round on the member: start from the personalised mix
  ``eta * W_local + (1 - eta) * W_global`` (the global weights alone the first time),
  train PPO on the member's cluster (with FedProx's proximal term anchored at ``W_global``
  when ``mu > 0``), keep the result as ``W_local``, and return the delta to upload
  (``W_local_new - W_global``) with the number of decisions trained on; ``upload=False``
  when the member skips this round (sparse communication).
- :func:`finetune_round` / :func:`finetune_on_log`: a deployed member's local update from its
  own decision log (behaviour cloning), and the personalised mix written for its extender.
- :func:`write_serving_checkpoint`: the personalised mix as the extender's checkpoint.

May import: ``fedsched.common``, ``fedsched.agent.learning`` and ``fedsched.agent.serving``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsched.agent.federation.online_round import (
    Experience,
    OnlineRoundConfig,
    collect_round,
    fit_round,
    validation_score,
)
from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
from fedsched.agent.learning.ppo import PPOConfig, PPOTrainer
from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import Member, member_cluster, member_from_node_config
from fedsched.common.federation.run_config import Value
from fedsched.common.federation.weights import load_npz, load_weights, save_npz, weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.model.fragmentation import TypicalPods

Weights = dict[str, np.ndarray]
Config = Mapping[str, Value]


def partition_id(node_config: Config) -> int:
    """The member's partition id (simulation numbers its nodes; a deployed member may set one)."""
    return int(node_config.get("partition-id", 0))


def load_member(node_config: Config, run_config: Config) -> tuple[Member, MemberState]:
    """The member's cluster and its state directory (``state-dir``/its name)."""
    member = member_from_node_config(node_config) or member_cluster(partition_id(node_config))
    return member, MemberState(Path(str(run_config["state-dir"])) / member.name)


def ppo_config(run_config: Config, *, mu: float, seed: int) -> PPOConfig:
    """A member round's PPO settings from the run config (see the module docstring)."""
    steps = int(run_config["local-steps"])
    return PPOConfig(total_steps=steps, num_steps=min(int(run_config["ppo-rollout-steps"]), steps),
                     num_minibatches=int(run_config["ppo-num-minibatches"]),
                     update_epochs=int(run_config["ppo-update-epochs"]),
                     learning_rate=float(run_config["ppo-learning-rate"]), proximal_mu=mu, seed=seed)


def finetune_on_log(global_w: Weights, start: Weights, log_dir: str, window: int, learning_rate: float,
                    epochs: int, seed: int, mu: float = 0.0) -> tuple[Weights, int]:
    """The deployed member's local update from its own rewards: credit regression
    (:func:`fedsched.agent.learning.credit.fit_credit`) on the last ``window`` decisions of
    its decision log whose outcome is known (the node credit from each record's reward terms:
    hot seconds and OOM kills of the chosen node after the bind,
    :func:`fedsched.agent.learning.credit.credited_from_log`), starting from ``start``, with
    FedProx's term anchored at ``global_w`` when ``mu > 0``. A node that the log shows going
    hot after the member's choices gets a lower score. Returns the new weights and how many
    decisions were used."""
    from fedsched.agent.learning.credit import credited_from_log
    from fedsched.agent.serving.decision_log import DecisionLog

    data = credited_from_log(DecisionLog(log_dir).tail_records(window))
    if not data:
        raise ValueError(f"decision log {log_dir} has no decision with a known outcome: nothing to "
                         "learn from this round (is the extender's outcome recorder on?)")
    cfg = OnlineRoundConfig(epochs=epochs, learning_rate=learning_rate, proximal_mu=mu)
    new, _ = fit_round(start, data, cfg, seed, anchor=global_w)
    return new, len(data)


class MemberState:
    """A member's persistent state in ``directory`` (survives restarts and runs)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def load(self, name: str) -> dict[str, np.ndarray] | None:
        return load_npz(self.dir / f"{name}.npz")

    def save(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        save_npz(self.dir / f"{name}.npz", arrays)


@dataclass
class RoundResult:
    delta: dict[str, np.ndarray]  # W_local_new - W_global
    examples: int  # decisions trained on this round (the aggregation weight)
    mean_reward: float
    upload: bool
    val_score: float = math.nan  # the personalised model's validation score (online mode)
    joined: bool = True  # False: a late member before its join round (nothing trained, nothing sent)


def _sparse(state: MemberState, delta: Weights, *, server_round: int, upload_every: int,
            norm_threshold: float) -> bool:
    """Sparse communication: upload every ``upload_every`` rounds, or earlier when the change
    accumulated since the last upload passes ``norm_threshold``; keeps the accumulated change."""
    pending = state.load("pending") or {k: np.zeros_like(v) for k, v in delta.items()}
    pending = {k: pending[k] + delta[k] for k in delta}
    norm = float(np.sqrt(sum(float((v * v).sum()) for v in pending.values())))
    upload = server_round % max(upload_every, 1) == 0 or norm > norm_threshold
    state.save("pending", {k: np.zeros_like(v) for k, v in pending.items()} if upload else pending)
    return upload


def local_round(member: Member, state: MemberState, global_w: Weights, *, eta: float, ppo: PPOConfig,
                upload_every: int, server_round: int, norm_threshold: float) -> RoundResult:
    """Packing mode: one round of PPO with settings ``ppo`` (its ``proximal_mu`` > 0: FedProx's
    term anchored at ``global_w``); see the module docstring."""
    local = state.load("local")
    start = personalised_mix(local, global_w, eta) if local is not None else global_w
    policy = NodeScoringPolicy()
    load_weights(policy, start)
    anchor = {k: torch.from_numpy(np.asarray(v)) for k, v in global_w.items()
              if k in dict(policy.named_parameters())}
    typical = TypicalPods.from_pods(member.train)
    env = SchedulingEnv(member.nodes, member.train, typical=typical,
                        config=EnvConfig(mode="packing", target_load=1.1), seed=ppo.seed)
    trainer = PPOTrainer([env], ppo, policy, anchor=anchor if ppo.proximal_mu > 0 else None)
    rewards: list[float] = []
    trainer.train(on_update=lambda s: rewards.append(s["mean_reward"]))
    new = weights_of(trainer.policy)
    state.save("local", new)
    delta = {k: (new[k] - global_w[k]).astype(np.float32) for k in global_w}
    upload = _sparse(state, delta, server_round=server_round, upload_every=upload_every,
                     norm_threshold=norm_threshold)
    return RoundResult(delta if upload else {k: np.zeros_like(v) for k, v in delta.items()},
                       trainer.global_step if upload else 0,
                       float(np.mean(rewards)) if rewards else 0.0, upload)


def online_config(run_config: Config, member: Member, *, mu: float) -> OnlineRoundConfig:
    """A member's online round settings from the run config: ``scarce-decisions`` for a
    data-scarce member, else ``local-decisions``; ``local-epochs``, ``local-learning-rate``."""
    scarce = member.spec is not None and member.spec.scarce
    return OnlineRoundConfig(decisions=int(run_config["scarce-decisions" if scarce else "local-decisions"]),
                             epochs=int(run_config["local-epochs"]),
                             learning_rate=float(run_config["local-learning-rate"]), proximal_mu=mu)


def joins_at(member: Member, run_config: Config) -> int:
    """The first round a member takes part in: ``late-round`` for the late member, else 1."""
    return max(int(run_config["late-round"]), 1) if member.spec is not None and member.spec.late else 1


def online_round(member: Member, state: MemberState, global_w: Weights, *, eta: float, cfg: OnlineRoundConfig,
                 seed: int, server_round: int, upload_every: int = 1,
                 norm_threshold: float = math.inf) -> RoundResult:
    """Online mode: one round of learning from the member's own rewards in its replay twin
    (:mod:`fedsched.agent.federation.online_round`), from the personalised mix."""
    local = state.load("local")
    start = personalised_mix(local, global_w, eta) if local is not None else global_w
    data = collect_round(member, start, cfg, seed)
    experience = Experience(state.dir)
    experience.add(data, f"round-{server_round}")
    new, _ = fit_round(start, experience.newest(cfg.max_experience), cfg, seed, anchor=global_w)
    state.save("local", new)
    delta = {k: (new[k] - global_w[k]).astype(np.float32) for k in global_w}
    upload = _sparse(state, delta, server_round=server_round, upload_every=upload_every,
                     norm_threshold=norm_threshold)
    score = validation_score(member, personalised_mix(new, global_w, eta), state.dir)
    return RoundResult(delta if upload else {k: np.zeros_like(v) for k, v in delta.items()},
                       len(data) if upload else 0, float(np.mean([c.credit for c in data])), upload, score)


def finetune_round(state: MemberState, global_w: Weights, *, eta: float, log_dir: str, window: int,
                   learning_rate: float, epochs: int, seed: int, serve_path: str | None,
                   server_round: int, mu: float = 0.0, member: Member | None = None) -> RoundResult:
    """A deployed member's round: credit regression on its decision log's last ``window``
    outcomes from its personalised mix (:func:`finetune_on_log`); with ``serve_path`` the new mix
    is written there for its extender (``fedsched serve --policy`` hot-reloads it) with its
    validation on ``member``'s own validation pods, which the extender's roll-out gate reads
    (active only where the mix beats kube-default there). Always uploads."""
    local = state.load("local")
    start = personalised_mix(local, global_w, eta) if local is not None else global_w
    new, used = finetune_on_log(global_w, start, log_dir, window, learning_rate, epochs, seed=seed, mu=mu)
    state.save("local", new)
    if serve_path:
        mix = personalised_mix(new, global_w, eta)
        validation = member_validation(member, mix) if member is not None else None
        write_serving_checkpoint(serve_path, mix, server_round, validation=validation)
    return RoundResult({k: (new[k] - global_w[k]).astype(np.float32) for k in global_w}, used, 0.0, True)


def member_round(member: Member, state: MemberState, global_w: Weights, run_config: Config,
                 node_config: Config, *, server_round: int, mu: float) -> RoundResult:
    """The ClientApp's local round: on the member's decision log when its node config names one
    (``decision-log``, with ``window`` overriding the run config's ``finetune-window`` and
    ``serve-policy``), else in simulation: the run config's ``mode`` (``online``: credit
    regression in the member's replay twin; ``packing``: PPO in packing mode). A late member
    before its join round trains nothing and sends nothing. Seeded by round and partition."""
    eta = float(run_config["eta"])
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"run config eta must be in [0, 1], got {eta}")
    seed = 1000 * server_round + partition_id(node_config)
    log_dir = node_config.get("decision-log")
    if log_dir:  # deployment: learn from the member's own recent decisions and their outcomes
        serve_path = node_config.get("serve-policy")
        return finetune_round(state, global_w, eta=eta, log_dir=str(log_dir),
                              window=int(node_config.get("window", run_config["finetune-window"])),
                              learning_rate=float(run_config["finetune-learning-rate"]),
                              epochs=int(run_config["finetune-epochs"]), seed=seed, mu=mu, member=member,
                              serve_path=str(serve_path) if serve_path else None, server_round=server_round)
    mode = str(run_config["mode"])
    if mode == "online":
        if server_round < joins_at(member, run_config):
            return RoundResult({k: np.zeros_like(v, dtype=np.float32) for k, v in global_w.items()}, 0, 0.0,
                               False, joined=False)
        return online_round(member, state, global_w, eta=eta, cfg=online_config(run_config, member, mu=mu),
                            seed=seed, server_round=server_round,
                            upload_every=int(run_config["upload-every"]),
                            norm_threshold=float(run_config["upload-norm"]))
    if mode != "packing":
        raise ValueError(f"run config mode must be online or packing, got {mode!r}")
    return local_round(member, state, global_w, eta=eta, ppo=ppo_config(run_config, mu=mu, seed=seed),
                       upload_every=int(run_config["upload-every"]), server_round=server_round,
                       norm_threshold=float(run_config["upload-norm"]))


def member_validation(member: Member, weights: Weights) -> dict[str, dict[str, dict[str, float]]]:
    """The personalised model beside kube-default on the member's own validation pods
    (:func:`fedsched.agent.federation.online_round.validation_rows`), keyed as the roll-out gate
    reads validation figures: ``{"<profile>-own": {"policy": {...}, "kube-default": {...}}}``
    (empty without validation pods)."""
    from fedsched.agent.federation.online_round import validation_rows
    from fedsched.agent.serving.rollout_gate import cluster_profile

    rows = validation_rows(member, weights)
    return {f"{cluster_profile(member.nodes)}-own": rows} if rows else {}


def write_serving_checkpoint(path: str | Path, weights: dict[str, np.ndarray], server_round: int,
                             base: str | Path | None = None,
                             validation: dict[str, Any] | None = None) -> Path:
    """Write the weights a member's extender should serve (``fedsched serve --policy PATH``
    watches the file and hot-reloads it). Metadata (typical pods, hyper-parameters) comes from
    ``base`` (default: the shipped online policy, whose kind of model the members train); with
    ``validation`` (:func:`member_validation`) the checkpoint is an online policy that the
    roll-out gate of ``fedsched serve`` judges on those figures: active only where it beats
    kube-default on the member's own validation pods, else shadow. The write is atomic, so the
    server never reads half a file."""
    from fedsched.common.learning.checkpoint import load_checkpoint, save_checkpoint, typical_from_dict
    from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path

    base_policy, meta, _ = load_checkpoint(base or default_policy_path(LEARNED_ONLINE))
    load_weights(base_policy, weights)
    extra: dict[str, Any] = {"server_round": int(server_round)}
    if validation is not None:
        extra |= {"operating_mode": "online", "validation": validation}
    return save_checkpoint(path, base_policy, algorithm="federated-personalised",
                           hyperparameters=meta.get("hyperparameters", {}),
                           typical=typical_from_dict(meta.get("typical_pods")),
                           data=meta.get("data_hash", ""), extra=extra)
