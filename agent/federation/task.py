"""The member's task, independent of Flower's message plumbing.

- :class:`MemberState`: what outlives a run in the member's state directory: its local
  weights ``W_local``, the INT8 error-feedback residual, and the change accumulated since
  its last upload (all ``.npz``, written atomically).
- :func:`local_round`: one federated round on the member: start from the personalised mix
  ``eta * W_local + (1 - eta) * W_global`` (the global weights alone the first time),
  train ``steps`` PPO decisions on the member's cluster (with FedProx's proximal term
  anchored at ``W_global`` when ``mu > 0``), keep the result as ``W_local``, and return the
  delta to upload (``W_local_new - W_global``) with the number of decisions trained on;
  ``upload=False`` when the member skips this round (sparse communication).
- :func:`finetune_on_log`: a deployed member's local update from its own decision log.
- :func:`write_serving_checkpoint`: the personalised mix as the extender's checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
from fedsched.agent.learning.ppo import PPOConfig, PPOTrainer
from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import Member
from fedsched.common.federation.weights import load_npz, load_weights, save_npz, weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.model.fragmentation import TypicalPods


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


def local_round(member: Member, state: MemberState, global_w: dict[str, np.ndarray], *, eta: float,
                steps: int, mu: float, seed: int, upload_every: int = 1, server_round: int = 1,
                norm_threshold: float = float("inf")) -> RoundResult:
    """One round on a member; see the module docstring."""
    local = state.load("local")
    start = personalised_mix(local, global_w, eta) if local is not None else global_w
    policy = NodeScoringPolicy()
    load_weights(policy, start)
    anchor = {k: torch.from_numpy(np.asarray(v)) for k, v in global_w.items()
              if k in dict(policy.named_parameters())}
    typical = TypicalPods.from_pods(member.train)
    env = SchedulingEnv(member.nodes, member.train, typical=typical,
                        config=EnvConfig(mode="packing", target_load=1.1), seed=seed)
    cfg = PPOConfig(total_steps=steps, num_steps=min(128, steps), num_minibatches=4, update_epochs=2,
                    learning_rate=3e-4, proximal_mu=mu, seed=seed)
    trainer = PPOTrainer([env], cfg, policy, anchor=anchor if mu > 0 else None)
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
