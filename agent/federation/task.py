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

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

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
    member = member_from_node_config(node_config) or member_cluster(
        partition_id(node_config), openb_nodes=int(run_config["openb-nodes"]))
    return member, MemberState(Path(str(run_config["state-dir"])) / member.name)


def ppo_config(run_config: Config, *, mu: float, seed: int) -> PPOConfig:
    """A member round's PPO settings from the run config (see the module docstring)."""
    steps = int(run_config["local-steps"])
    return PPOConfig(total_steps=steps, num_steps=min(int(run_config["ppo-rollout-steps"]), steps),
                     num_minibatches=int(run_config["ppo-num-minibatches"]),
                     update_epochs=int(run_config["ppo-update-epochs"]),
                     learning_rate=float(run_config["ppo-learning-rate"]), proximal_mu=mu, seed=seed)


def finetune_on_log(global_w: dict[str, np.ndarray], start: dict[str, np.ndarray], log_dir: str, window: int,
                    learning_rate: float, epochs: int, seed: int) -> tuple[dict[str, np.ndarray], int]:
    """The deployed member's local update from its own decisions: behaviour cloning on the
    last ``window`` entries of its decision log (the continuous-training path), starting from
    ``start``. Returns the new weights and how many decisions were used."""
    from fedsched.agent.learning.bc import BCConfig, fit
    from fedsched.agent.serving.decision_log import DecisionLog

    decisions = DecisionLog(log_dir).tail(window)
    if not decisions:
        raise ValueError(f"decision log {log_dir} is empty: nothing to learn from this round")
    policy = NodeScoringPolicy()
    load_weights(policy, start)
    torch.manual_seed(seed)
    fit(policy, decisions, BCConfig(epochs=epochs, learning_rate=learning_rate, seed=seed))
    return weights_of(policy), len(decisions)


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
    examples: int  # decisions trained on this round
    mean_reward: float
    upload: bool


def local_round(member: Member, state: MemberState, global_w: Weights, *, eta: float, ppo: PPOConfig,
                upload_every: int, server_round: int, norm_threshold: float) -> RoundResult:
    """One round on a member with PPO settings ``ppo`` (its ``proximal_mu`` > 0: FedProx's term
    anchored at ``global_w``); see the module docstring."""
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
    # Sparse communication: upload every upload_every rounds, or earlier when the change
    # accumulated since the last upload is large.
    pending = state.load("pending") or {k: np.zeros_like(v) for k, v in delta.items()}
    pending = {k: pending[k] + delta[k] for k in delta}
    norm = float(np.sqrt(sum(float((v * v).sum()) for v in pending.values())))
    upload = server_round % max(upload_every, 1) == 0 or norm > norm_threshold
    state.save("pending", {k: np.zeros_like(v) for k, v in pending.items()} if upload else pending)
    return RoundResult(delta if upload else {k: np.zeros_like(v) for k, v in delta.items()},
                       trainer.global_step if upload else 0,
                       float(np.mean(rewards)) if rewards else 0.0, upload)


def finetune_round(state: MemberState, global_w: Weights, *, eta: float, log_dir: str, window: int,
                   learning_rate: float, epochs: int, seed: int, serve_path: str | None,
                   server_round: int) -> RoundResult:
    """A deployed member's round: behaviour cloning on its decision log's last ``window``
    entries from its personalised mix; with ``serve_path`` the new mix is written there for its
    extender (``fedsched serve --policy`` hot-reloads it). Always uploads."""
    local = state.load("local")
    start = personalised_mix(local, global_w, eta) if local is not None else global_w
    new, used = finetune_on_log(global_w, start, log_dir, window, learning_rate, epochs, seed=seed)
    state.save("local", new)
    if serve_path:
        write_serving_checkpoint(serve_path, personalised_mix(new, global_w, eta), server_round)
    return RoundResult({k: (new[k] - global_w[k]).astype(np.float32) for k in global_w}, used, 0.0, True)


def member_round(member: Member, state: MemberState, global_w: Weights, run_config: Config,
                 node_config: Config, *, server_round: int, mu: float) -> RoundResult:
    """The ClientApp's local round: on the member's decision log when its node config names one
    (``decision-log``, with ``window`` overriding the run config's ``finetune-window`` and
    ``serve-policy``), else PPO on its cluster. Seeded by round and partition."""
    eta = float(run_config["eta"])
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"run config eta must be in [0, 1], got {eta}")
    seed = 1000 * server_round + partition_id(node_config)
    log_dir = node_config.get("decision-log")
    if log_dir:  # deployment: learn from the member's own recent decisions
        serve_path = node_config.get("serve-policy")
        return finetune_round(state, global_w, eta=eta, log_dir=str(log_dir),
                              window=int(node_config.get("window", run_config["finetune-window"])),
                              learning_rate=float(run_config["finetune-learning-rate"]),
                              epochs=int(run_config["finetune-epochs"]), seed=seed,
                              serve_path=str(serve_path) if serve_path else None, server_round=server_round)
    return local_round(member, state, global_w, eta=eta, ppo=ppo_config(run_config, mu=mu, seed=seed),
                       upload_every=int(run_config["upload-every"]), server_round=server_round,
                       norm_threshold=float(run_config["upload-norm"]))


def write_serving_checkpoint(path: str | Path, weights: dict[str, np.ndarray], server_round: int,
                             base: str | Path | None = None) -> Path:
    """Write the weights a member's extender should serve (``fedsched serve --policy PATH``
    watches the file and hot-reloads it). Metadata (typical pods, hyper-parameters) comes from
    ``base`` (default: the shipped policy); the write is atomic, so the server never reads half a
    file."""
    from fedsched.common.learning.checkpoint import load_checkpoint, save_checkpoint, typical_from_dict
    from fedsched.common.schedulers import default_policy_path

    base_policy, meta, _ = load_checkpoint(base or default_policy_path())
    load_weights(base_policy, weights)
    return save_checkpoint(path, base_policy, algorithm="federated-personalised",
                           hyperparameters=meta.get("hyperparameters", {}),
                           typical=typical_from_dict(meta.get("typical_pods")),
                           data=meta.get("data_hash", ""), extra={"server_round": int(server_round)})
