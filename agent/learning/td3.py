"""TD3 for the weight-scoring agent (Fujimoto et al., 2018), CleanRL-style.

The action is a weight vector on the simplex over ``WEIGHT_TERMS``; the environment's pod
goes to the feasible node with the highest weighted score. Read top to bottom:
hyper-parameters (:class:`TD3Config`), then the loop: act (actor logits + Gaussian
exploration noise, then a softmax, so the action always stays on the simplex), step,
store, and after ``learning_starts`` decisions update the twin critics every step towards
``r + gamma * min(Q1', Q2')(s', w')`` with target policy smoothing (clipped noise on the
target actor's logits), the actor every ``policy_delay`` steps by maximising ``Q1``, and
the target networks by Polyak averaging. Logged: critic and actor losses, mean Q, the
mean weights chosen, steps/s and finished-episode metrics.

A resumed run restores weights and optimisers; the replay buffer starts empty.
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
    total_steps: int = 50_000  # decisions to train on, over all environments
    learning_starts: int = 1_000  # decisions taken with exploration only, before any update
    buffer_size: int = 200_000  # replay buffer capacity (transitions)
    batch_size: int = 256  # transitions per update
    gamma: float = 0.99  # discount per decision
    tau: float = 0.005  # Polyak averaging of the target networks
    policy_delay: int = 2  # critic updates per actor update
    exploration_noise: float = 0.5  # std of Gaussian noise on the actor's logits when acting
    policy_noise: float = 0.2  # std of the target smoothing noise on the target actor's logits
    noise_clip: float = 0.5  # clip of the target smoothing noise
    actor_lr: float = 3e-4  # Adam step size of the actor
    critic_lr: float = 3e-4  # Adam step size of the critics
    hidden: int = 64  # width of the hidden layers
    log_every: int = 1_000  # decisions between log rows
    seed: int = 1  # seeds torch, numpy and the environments


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


class TD3Trainer:
    def __init__(self, envs: list[SchedulingEnv], cfg: TD3Config, policy: WeightPolicy | None = None) -> None:
        self.envs, self.cfg = envs, cfg
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.policy = policy or WeightPolicy(WeightPolicyConfig(hidden=cfg.hidden))
        self.target = copy.deepcopy(self.policy)
        self.actor_opt = torch.optim.Adam(self.policy.actor.parameters(), lr=cfg.actor_lr)
        critics = list(self.policy.q1.parameters()) + list(self.policy.q2.parameters())
        self.critic_opt = torch.optim.Adam(critics, lr=cfg.critic_lr)
        self.buffer = ReplayBuffer(cfg.buffer_size, self.rng)
        self.global_step = 0
        self.n_updates = 0
        for i, env in enumerate(envs):
            env.reset(seed=cfg.seed * 1000 + i)

    @property
    def update(self) -> int:
        """Log rows so far (one every ``log_every`` decisions): the run's progress unit."""
        return self.global_step // self.cfg.log_every

    @property
    def num_updates(self) -> int:
        return -(-self.cfg.total_steps // self.cfg.log_every)

    def state_dict(self) -> dict[str, Any]:
        return {"actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "global_step": self.global_step, "n_updates": self.n_updates, "config": asdict(self.cfg)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.actor_opt.load_state_dict(d["actor_opt"])
        self.critic_opt.load_state_dict(d["critic_opt"])
        self.global_step, self.n_updates = int(d["global_step"]), int(d["n_updates"])
        self.target = copy.deepcopy(self.policy)

    def act(self, s: np.ndarray, allowed: np.ndarray, explore: bool) -> np.ndarray:
        with torch.no_grad():
            logits = self.policy.actor(torch.from_numpy(s)[None])[0]
            if explore:
                logits = logits + self.cfg.exploration_noise * torch.randn_like(logits)
            w = WeightPolicy.to_simplex(logits, torch.from_numpy(allowed))
        return w.numpy().astype(np.float64)

    def learn(self) -> dict[str, float]:
        """One critic update (and, every ``policy_delay``, one actor and target update)."""
        cfg, p, t = self.cfg, self.policy, self.target
        s, m, a, r, s2, m2, d = self.buffer.sample(cfg.batch_size)
        with torch.no_grad():
            noise = (torch.randn(a.shape) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            a2 = WeightPolicy.to_simplex(t.actor(s2) + noise, m2)
            q1t, q2t = t.q(s2, a2)
            y = r + cfg.gamma * (1.0 - d) * torch.min(q1t, q2t)
        q1, q2 = p.q(s, a)
        critic_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        self.critic_opt.zero_grad()
        critic_loss.backward()
        self.critic_opt.step()
        stats = {"critic_loss": float(critic_loss.detach()), "q_mean": float(q1.detach().mean())}
        self.n_updates += 1
        if self.n_updates % cfg.policy_delay == 0:
            actor_loss = -p.q(s, p.weights(s, m))[0].mean()
            self.actor_opt.zero_grad()
            actor_loss.backward()
            self.actor_opt.step()
            stats["actor_loss"] = float(actor_loss.detach())
            with torch.no_grad():
                for net, tnet in ((p, t),):
                    for x, tx in zip(net.parameters(), tnet.parameters(), strict=True):
                        tx.mul_(1 - cfg.tau).add_(cfg.tau * x)
        return stats

    def train(self, on_update: Callable[[dict[str, float]], None] | None = None,
              on_episode: Callable[[dict[str, float]], None] | None = None,
              stop: Callable[[], bool] | None = None) -> None:
        cfg = self.cfg
        t0, last_log = time.perf_counter(), self.global_step
        nan = float("nan")  # fixed log columns from the first row on
        stats: dict[str, float] = {"critic_loss": nan, "q_mean": nan, "actor_loss": nan}
        chosen: list[np.ndarray] = []
        rewards: list[float] = []
        while self.global_step < cfg.total_steps:
            if stop is not None and stop():
                break
            for i, env in enumerate(self.envs):
                s, allowed = observe(env)
                explore_only = self.global_step < cfg.learning_starts
                if explore_only:  # uniform random point of the allowed simplex
                    w = self.rng.dirichlet(np.ones(int(allowed.sum())))
                    w_full = np.zeros(len(WEIGHT_TERMS))
                    w_full[allowed] = w
                    w = w_full
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
            if self.global_step - last_log >= cfg.log_every or self.global_step >= cfg.total_steps:
                dt = time.perf_counter() - t0
                row = {"update": self.global_step // cfg.log_every, "global_step": self.global_step,
                       **stats, "mean_reward": float(np.mean(rewards)) if rewards else 0.0,
                       "steps_per_s": (self.global_step - last_log) / max(dt, 1e-9)}
                mean_w = np.mean(chosen, axis=0) if chosen else np.zeros(len(WEIGHT_TERMS))
                row.update({f"w_{k}": float(v) for k, v in zip(WEIGHT_TERMS, mean_w, strict=True)})
                if on_update is not None:
                    on_update(row)
                t0, last_log, chosen, rewards = time.perf_counter(), self.global_step, [], []
