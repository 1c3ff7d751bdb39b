"""TD3 for the weight-scoring agent (Fujimoto et al., 2018), in the spirit of CleanRL's
``td3_continuous_action.py``.

The action is a weight vector on the simplex over ``WEIGHT_TERMS``; the environment's pod
goes to the feasible node with the highest weighted score. Read top to bottom: the
hyper-parameters (:class:`TD3Config`, a docstring line under each field), then
:meth:`TD3Trainer.train`, one *update* after another.

An **update** is, as in PPO, one collection step with its optimisation phase; ``progress.csv``
has one row per update, and ``eval_every`` and ``checkpoint_every`` count updates. The
collection step takes ``log_every`` decisions over all environments (round robin; the update
ends at the first round that reaches a multiple of ``log_every``): act (the actor's logits
plus Gaussian exploration noise, then a softmax, so the action stays on the simplex;
uniformly random points of the simplex for the first ``learning_starts`` decisions), step,
store in the replay buffer. Its optimisation phase is one gradient step per decision from the
``learning_starts``-th on, each taken right after its decision (TD3 learns from every new
transition; deferring them all to the end of the collection step trains on staler data and
measurably learns worse): the twin critics towards ``r + gamma * min(Q1', Q2')(s', w')`` with
target policy smoothing (clipped noise on the target actor's logits), and every
``policy_delay`` gradient steps the actor (maximising ``Q1``) and the target networks (Polyak
averaging). Logged per update: critic and actor losses, mean Q, the mean weights chosen,
steps/s (TensorBoard tags as CleanRL's, :data:`TB_TAGS`) and finished-episode metrics.

A resumed run restores weights, optimisers and the update count; the replay buffer starts empty.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedsched.agent.learning.env import SchedulingEnv
from fedsched.common.learning.nets import (
    N_SUMMARY,
    WEIGHT_TERMS,
    WeightPolicy,
    WeightPolicyConfig,
    gpu_mask,
    weight_inputs,
)


@dataclass
class TD3Config:
    total_steps: int = 50_000
    """decisions to train on, over all environments"""
    learning_starts: int = 1_000
    """decisions taken with random actions (uniform on the simplex), before any gradient step"""
    buffer_size: int = 200_000
    """replay buffer capacity (transitions)"""
    batch_size: int = 256
    """transitions per gradient step"""
    gamma: float = 0.99
    """discount per decision"""
    tau: float = 0.005
    """target smoothing coefficient: target <- tau * online + (1 - tau) * target"""
    policy_delay: int = 2
    """critic gradient steps per actor (and target network) step"""
    exploration_noise: float = 0.5
    """std of Gaussian noise on the actor's logits when acting"""
    policy_noise: float = 0.2
    """std of the target smoothing noise on the target actor's logits"""
    noise_clip: float = 0.5
    """the target smoothing noise is clipped to [-noise_clip, noise_clip]"""
    actor_lr: float = 3e-4
    """Adam step size of the actor"""
    critic_lr: float = 3e-4
    """Adam step size of the critics"""
    hidden: int = 64
    """width of the actor's and critics' hidden layers"""
    log_every: int = 1_000
    """decisions per update, over all environments (one progress.csv row per update)"""
    seed: int = 1
    """seeds torch, numpy and the environments"""
    torch_threads: int = 1
    """torch intra-op threads (small networks: more threads only contend with the simulator)"""


class ReplayBuffer:
    def __init__(self, size: int, rng: np.random.Generator) -> None:
        self.size, self.rng, self.n, self.i = size, rng, 0, 0
        k = len(WEIGHT_TERMS)
        self.s = np.zeros((size, N_SUMMARY), np.float32)
        self.m = np.zeros((size, k), bool)
        self.a = np.zeros((size, k), np.float32)
        self.r = np.zeros(size, np.float32)
        self.s2 = np.zeros((size, N_SUMMARY), np.float32)
        self.m2 = np.zeros((size, k), bool)
        self.d = np.zeros(size, np.float32)

    def add(self, s, m, a, r, s2, m2, d) -> None:
        i = self.i
        self.s[i], self.m[i], self.a[i], self.r[i], self.s2[i], self.m2[i], self.d[i] = s, m, a, r, s2, m2, d
        self.i = (i + 1) % self.size
        self.n = min(self.n + 1, self.size)

    def sample(self, k: int) -> tuple[torch.Tensor, ...]:
        idx = self.rng.integers(self.n, size=k)
        arrays = (self.s, self.m, self.a, self.r, self.s2, self.m2, self.d)
        return tuple(torch.from_numpy(x[idx]) for x in arrays)


def choose_node(env: SchedulingEnv, w: np.ndarray) -> tuple[int, np.ndarray]:
    """The feasible node with the highest weighted score (first among equals)."""
    _, _, nodes, feats = env.decision
    x, _ = weight_inputs(feats)
    return int(nodes[int(np.argmax(x.astype(np.float64) @ w))]), x


def observe(env: SchedulingEnv) -> tuple[np.ndarray, np.ndarray]:
    """(summary, allowed-terms mask) of the pending decision."""
    _, state, _, feats = env.decision
    return weight_inputs(feats)[1], gpu_mask(state.nodes.total_gpu_milli > 0)


# Stats of an update (progress.csv columns) -> TensorBoard tags, as CleanRL names them.
TB_TAGS = {
    "qf1_loss": "losses/qf1_loss",
    "qf2_loss": "losses/qf2_loss",
    "critic_loss": "losses/qf_loss",
    "q_mean": "losses/qf1_values",
    "actor_loss": "losses/actor_loss",
    "steps_per_s": "charts/SPS",
    "mean_reward": "charts/mean_reward",
}


class TD3Trainer:
    """Holds the actor-critic, its target copy, the optimisers and the replay buffer;
    :meth:`train` runs updates."""

    def __init__(self, envs: list[SchedulingEnv], cfg: TD3Config, policy: WeightPolicy | None = None) -> None:
        self.envs, self.cfg = envs, cfg
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.torch_threads)
        self.rng = np.random.default_rng(cfg.seed)
        self.policy = policy or WeightPolicy(WeightPolicyConfig(hidden=cfg.hidden))
        self.target = copy.deepcopy(self.policy)
        self.actor_opt = torch.optim.Adam(self.policy.actor.parameters(), lr=cfg.actor_lr)
        critics = list(self.policy.q1.parameters()) + list(self.policy.q2.parameters())
        self.critic_opt = torch.optim.Adam(critics, lr=cfg.critic_lr)
        self.buffer = ReplayBuffer(cfg.buffer_size, self.rng)
        self.global_step = 0
        self.update = 0  # updates done (one collection step + one optimisation phase each)
        self.gradient_steps = 0  # critic gradient steps over the run (the actor's delay counts them)
        for i, env in enumerate(envs):
            env.reset(seed=cfg.seed * 1000 + i)

    @property
    def num_updates(self) -> int:
        """Updates in the whole run: one per ``log_every`` decisions (the last one partial)."""
        return -(-self.cfg.total_steps // self.cfg.log_every)

    def state_dict(self) -> dict[str, Any]:
        return {"actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "global_step": self.global_step, "update": self.update,
                "gradient_steps": self.gradient_steps, "config": asdict(self.cfg)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.actor_opt.load_state_dict(d["actor_opt"])
        self.critic_opt.load_state_dict(d["critic_opt"])
        self.global_step = int(d["global_step"])
        # Checkpoints before the update count was stored: one update per log_every decisions.
        self.update = int(d.get("update", self.global_step // self.cfg.log_every))
        self.gradient_steps = int(d.get("gradient_steps", d.get("n_updates", 0)))
        self.target = copy.deepcopy(self.policy)

    def act(self, s: np.ndarray, allowed: np.ndarray, explore: bool) -> np.ndarray:
        with torch.no_grad():
            logits = self.policy.actor(torch.from_numpy(s)[None])[0]
            if explore:
                logits = logits + self.cfg.exploration_noise * torch.randn_like(logits)
            w = WeightPolicy.to_simplex(logits, torch.from_numpy(allowed))
        return w.numpy().astype(np.float64)

    def learn(self) -> dict[str, float]:
        """One gradient step: the critics, and every ``policy_delay`` steps the actor and the targets."""
        cfg, p, t = self.cfg, self.policy, self.target
        s, m, a, r, s2, m2, d = self.buffer.sample(cfg.batch_size)
        with torch.no_grad():
            noise = (torch.randn(a.shape) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            a2 = WeightPolicy.to_simplex(t.actor(s2) + noise, m2)
            q1t, q2t = t.q(s2, a2)
            next_q_value = r + cfg.gamma * (1.0 - d) * torch.min(q1t, q2t)
        q1, q2 = p.q(s, a)
        qf1_loss, qf2_loss = F.mse_loss(q1, next_q_value), F.mse_loss(q2, next_q_value)
        critic_loss = qf1_loss + qf2_loss
        self.critic_opt.zero_grad()
        critic_loss.backward()
        self.critic_opt.step()
        stats = {"critic_loss": float(critic_loss.detach()), "qf1_loss": float(qf1_loss.detach()),
                 "qf2_loss": float(qf2_loss.detach()), "q_mean": float(q1.detach().mean())}
        self.gradient_steps += 1
        if self.gradient_steps % cfg.policy_delay == 0:
            actor_loss = -p.q(s, p.weights(s, m))[0].mean()
            self.actor_opt.zero_grad()
            actor_loss.backward()
            self.actor_opt.step()
            stats["actor_loss"] = float(actor_loss.detach())
            with torch.no_grad():  # update the target networks
                for x, tx in zip(p.parameters(), t.parameters(), strict=True):
                    tx.mul_(1 - cfg.tau).add_(cfg.tau * x)
        return stats

    def train(self, on_update: Callable[[dict[str, float]], None] | None = None,
              on_episode: Callable[[dict[str, float]], None] | None = None,
              stop: Callable[[], bool] | None = None) -> None:
        """Run updates until ``total_steps`` decisions (or until ``stop()``, checked before each
        update); the callbacks as :meth:`PPOTrainer.train`'s."""
        cfg = self.cfg
        nan = float("nan")  # fixed log columns from the first row on
        stats: dict[str, float] = {"critic_loss": nan, "qf1_loss": nan, "qf2_loss": nan, "q_mean": nan,
                                   "actor_loss": nan}
        while self.global_step < cfg.total_steps:
            if stop is not None and stop():
                break
            start_time, start_step = time.perf_counter(), self.global_step
            end = min(cfg.total_steps, max((self.update + 1) * cfg.log_every, self.global_step + 1))
            chosen: list[np.ndarray] = []
            rewards: list[float] = []

            # ---- collection step: log_every decisions, round robin over the environments,
            # ---- each followed by its gradient step (from the learning_starts-th decision on)
            while self.global_step < end:
                for i, env in enumerate(self.envs):
                    s, allowed = observe(env)
                    if self.global_step < cfg.learning_starts:  # uniform random point of the allowed simplex
                        w = np.zeros(len(WEIGHT_TERMS))
                        w[allowed] = self.rng.dirichlet(np.ones(int(allowed.sum())))
                    else:
                        w = self.act(s, allowed, explore=True)
                    node, _ = choose_node(env, w)
                    _, r, term, trunc, info = env.step(node)
                    done = term or trunc
                    s2, m2 = (np.zeros(N_SUMMARY, np.float32), allowed) if done else observe(env)
                    self.buffer.add(s, allowed, w, r, s2, m2, float(term))
                    chosen.append(w)
                    rewards.append(r)
                    self.global_step += 1
                    if done:
                        if on_episode is not None:
                            m = dict(info.get("episode_metrics", {}))
                            m.update(episode_return=info.get("episode_return", float("nan")), env=i,
                                     global_step=self.global_step)
                            on_episode(m)
                        env.reset()
                    if self.global_step >= cfg.learning_starts and self.buffer.n >= cfg.batch_size:
                        stats.update(self.learn())

            self.update += 1
            elapsed = max(time.perf_counter() - start_time, 1e-9)
            row = {"update": self.update, "global_step": self.global_step, **stats,
                   "mean_reward": float(np.mean(rewards)) if rewards else 0.0,
                   "steps_per_s": (self.global_step - start_step) / elapsed}
            mean_w = np.mean(chosen, axis=0) if chosen else np.zeros(len(WEIGHT_TERMS))
            row.update({f"w_{k}": float(v) for k, v in zip(WEIGHT_TERMS, mean_w, strict=True)})
            if on_update is not None:
                on_update(row)
