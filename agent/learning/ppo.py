"""PPO for the node-scoring policy, in the spirit of CleanRL's single-file algorithms.

Read top to bottom: hyper-parameters (:class:`PPOConfig`, one line of doc each), rollout
collection over several environments stepped in lockstep (each env is a member cluster or
a slice of one; observations are padded to the largest), generalised advantage
estimation, then ``update_epochs`` passes of minibatch updates with the clipped surrogate,
clipped value loss, entropy bonus, advantage normalisation and gradient clipping, with a
linearly annealed learning rate. The categorical over nodes is masked: infeasible nodes
get a logit of -1e9. Logged per update: losses, entropy, approx_kl, clip fraction,
explained variance, steps/s and the metrics of finished episodes; periodically a greedy
evaluation on a held-out cluster.

Everything is seeded (torch, numpy, environments), so a run is reproducible on a given
machine and torch version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsched.agent.learning.env import SchedulingEnv
from fedsched.common.federation.codec import proximal_term
from fedsched.common.learning.features import CONTEXT_FEATURES, NODE_FEATURES, POD_FEATURES
from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig


@dataclass
class PPOConfig:
    total_steps: int = 200_000  # pod decisions to train on, over all environments
    num_steps: int = 256  # decisions per environment per rollout
    learning_rate: float = 3e-4  # Adam step size at the start (annealed linearly to 0)
    anneal_lr: bool = True  # anneal the learning rate over the run
    gamma: float = 0.995  # discount per decision
    gae_lambda: float = 0.95  # GAE lambda
    num_minibatches: int = 8  # minibatches per epoch
    update_epochs: int = 4  # passes over each rollout
    norm_adv: bool = True  # normalise advantages per minibatch
    clip_coef: float = 0.2  # surrogate clipping
    clip_vloss: bool = True  # clip the value loss as well
    ent_coef: float = 0.003  # entropy bonus
    vf_coef: float = 0.5  # value-loss weight
    max_grad_norm: float = 0.5  # global gradient-norm clip
    target_kl: float | None = 0.05  # stop an update's epochs early past this KL (None: never)
    critic_warmup: int = 0  # first updates train only the critic (for a warm-started actor)
    proximal_mu: float = 0.0  # FedProx: weight of mu/2 ||w - w_anchor||^2 (needs an anchor)
    hidden: int = 64  # width of the policy's hidden layers
    seed: int = 1  # seeds torch, numpy and the environments
    torch_threads: int = 1  # intra-op threads (the envs are the bottleneck)

    def batch_size_for(self, n_envs: int) -> int:
        return self.num_steps * n_envs


class RolloutObs:
    """Padded observation batch [E, N, ...] as torch tensors."""

    def __init__(self, obs: list[dict[str, np.ndarray]], n_max: int) -> None:
        e = len(obs)
        nodes = np.zeros((e, n_max, len(NODE_FEATURES)), np.float32)
        mask = np.zeros((e, n_max), bool)
        for i, o in enumerate(obs):
            k = o["nodes"].shape[0]
            nodes[i, :k] = o["nodes"]
            mask[i, :k] = o["mask"].astype(bool)
        self.nodes = torch.from_numpy(nodes)
        self.mask = torch.from_numpy(mask)
        self.pod = torch.from_numpy(np.stack([o["pod"] for o in obs]))
        self.ctx = torch.from_numpy(np.stack([o["context"] for o in obs]))


def masked_categorical(logits: torch.Tensor) -> torch.distributions.Categorical:
    return torch.distributions.Categorical(logits=logits)


def explained_variance(pred: np.ndarray, target: np.ndarray) -> float:
    var = np.var(target)
    return float("nan") if var == 0 else float(1 - np.var(target - pred) / var)


class PPOTrainer:
    """Holds the policy, optimiser and environments; :meth:`train` runs updates."""

    def __init__(self, envs: list[SchedulingEnv], cfg: PPOConfig,
                 policy: NodeScoringPolicy | None = None,
                 anchor: dict[str, torch.Tensor] | None = None) -> None:
        self.envs, self.cfg = envs, cfg
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.set_num_threads(cfg.torch_threads)
        self.policy = policy or NodeScoringPolicy(PolicyConfig(hidden=cfg.hidden))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate, eps=1e-5)
        # FedProx anchor: the global weights received this federated round.
        self.anchor = {k: v.detach().clone() for k, v in anchor.items()} if anchor else None
        self.n_max = max(env.max_nodes for env in envs)
        self.global_step = 0
        self.update = 0
        self.num_updates = max(1, cfg.total_steps // cfg.batch_size_for(len(envs)))
        self._obs = [env.reset(seed=cfg.seed * 1000 + i)[0] for i, env in enumerate(envs)]

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "global_step": self.global_step,
                "update": self.update, "config": asdict(self.cfg)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(d["optimizer"])
        self.global_step, self.update = int(d["global_step"]), int(d["update"])

    def train(self, on_update: Callable[[dict[str, float]], None] | None = None,
              on_episode: Callable[[dict[str, float]], None] | None = None,
              stop: Callable[[], bool] | None = None) -> None:
        cfg, envs, policy = self.cfg, self.envs, self.policy
        e, t_len, n_max = len(envs), cfg.num_steps, self.n_max
        n_f, n_p, n_c = len(NODE_FEATURES), len(POD_FEATURES), len(CONTEXT_FEATURES)
        buf_nodes = torch.zeros((t_len, e, n_max, n_f))
        buf_mask = torch.zeros((t_len, e, n_max), dtype=torch.bool)
        buf_pod = torch.zeros((t_len, e, n_p))
        buf_ctx = torch.zeros((t_len, e, n_c))
        actions = torch.zeros((t_len, e), dtype=torch.long)
        logprobs = torch.zeros((t_len, e))
        rewards = torch.zeros((t_len, e))
        dones = torch.zeros((t_len, e))
        values = torch.zeros((t_len, e))
        next_done = torch.zeros(e)
        while self.update < self.num_updates:
            if stop is not None and stop():
                break
            t0 = time.perf_counter()
            if cfg.anneal_lr:
                frac = 1.0 - self.update / self.num_updates
                self.optimizer.param_groups[0]["lr"] = frac * cfg.learning_rate
            # ---- rollout ----------------------------------------------------------------
            policy.eval()
            for step in range(t_len):
                ob = RolloutObs(self._obs, n_max)
                buf_nodes[step], buf_mask[step], buf_pod[step], buf_ctx[step] = (
                    ob.nodes, ob.mask, ob.pod, ob.ctx)
                dones[step] = next_done
                with torch.no_grad():
                    logits, value = policy(ob.nodes, ob.pod, ob.ctx, ob.mask)
                    dist = masked_categorical(logits)
                    action = dist.sample()
                actions[step], logprobs[step], values[step] = action, dist.log_prob(action), value
                for i, env in enumerate(envs):
                    obs, r, term, trunc, info = env.step(int(action[i]))
                    rewards[step, i] = r
                    next_done[i] = float(term or trunc)
                    if term or trunc:
                        if on_episode is not None:
                            m = dict(info.get("episode_metrics", {}))
                            m["episode_return"] = info.get("episode_return", float("nan"))
                            m["env"] = i
                            m["global_step"] = self.global_step + (step + 1) * e
                            on_episode(m)
                        obs, _ = env.reset()
                    self._obs[i] = obs
            self.global_step += t_len * e
            # ---- advantages (GAE) -------------------------------------------------------
            with torch.no_grad():
                ob = RolloutObs(self._obs, n_max)
                _, next_value = policy(ob.nodes, ob.pod, ob.ctx, ob.mask)
                advantages = torch.zeros_like(rewards)
                last = torch.zeros(e)
                for t in reversed(range(t_len)):
                    if t == t_len - 1:
                        nonterminal, nv = 1.0 - next_done, next_value
                    else:
                        nonterminal, nv = 1.0 - dones[t + 1], values[t + 1]
                    delta = rewards[t] + cfg.gamma * nv * nonterminal - values[t]
                    last = delta + cfg.gamma * cfg.gae_lambda * nonterminal * last
                    advantages[t] = last
                returns = advantages + values
            # ---- update -----------------------------------------------------------------
            policy.train()
            b = t_len * e
            b_nodes, b_mask = buf_nodes.reshape(b, n_max, n_f), buf_mask.reshape(b, n_max)
            b_pod, b_ctx = buf_pod.reshape(b, n_p), buf_ctx.reshape(b, n_c)
            b_act, b_logp = actions.reshape(b), logprobs.reshape(b)
            b_adv, b_ret, b_val = advantages.reshape(b), returns.reshape(b), values.reshape(b)
            mb = max(1, b // cfg.num_minibatches)
            clipfracs, approx_kl, old_kl = [], 0.0, 0.0
            pg_loss = v_loss = entropy = torch.zeros(())
            for _epoch in range(cfg.update_epochs):
                perm = torch.randperm(b)
                for start in range(0, b, mb):
                    idx = perm[start:start + mb]
                    logits, new_value = policy(b_nodes[idx], b_pod[idx], b_ctx[idx], b_mask[idx])
                    dist = masked_categorical(logits)
                    new_logp = dist.log_prob(b_act[idx])
                    entropy = dist.entropy().mean()
                    logratio = new_logp - b_logp[idx]
                    ratio = logratio.exp()
                    with torch.no_grad():
                        old_kl = float((-logratio).mean())
                        approx_kl = float(((ratio - 1) - logratio).mean())
                        clipfracs.append(float(((ratio - 1.0).abs() > cfg.clip_coef).float().mean()))
                    adv = b_adv[idx]
                    if cfg.norm_adv and len(idx) > 1:
                        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                    pg_loss = torch.max(-adv * ratio,
                                        -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                    if cfg.clip_vloss:
                        v_unclipped = (new_value - b_ret[idx]) ** 2
                        v_clipped = b_val[idx] + (new_value - b_val[idx]).clamp(-cfg.clip_coef, cfg.clip_coef)
                        v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_ret[idx]) ** 2).mean()
                    else:
                        v_loss = 0.5 * ((new_value - b_ret[idx]) ** 2).mean()
                    if self.update < cfg.critic_warmup:  # keep a warm-started actor while V catches up
                        loss = cfg.vf_coef * v_loss
                    else:
                        loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
                    if self.anchor is not None and cfg.proximal_mu > 0:
                        params = dict(policy.named_parameters())
                        loss = loss + proximal_term(params, self.anchor, cfg.proximal_mu)
                    self.optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                    self.optimizer.step()
                if cfg.target_kl is not None and approx_kl > cfg.target_kl:
                    break
            self.update += 1
            dt = time.perf_counter() - t0
            stats = {
                "update": self.update, "global_step": self.global_step,
                "learning_rate": self.optimizer.param_groups[0]["lr"],
                "value_loss": float(v_loss.detach()), "policy_loss": float(pg_loss.detach()),
                "entropy": float(entropy.detach()),
                "old_approx_kl": old_kl, "approx_kl": approx_kl,
                "clipfrac": float(np.mean(clipfracs)) if clipfracs else 0.0,
                "explained_variance": explained_variance(b_val.numpy(), b_ret.numpy()),
                "mean_reward": float(rewards.mean()), "steps_per_s": b / dt,
            }
            if on_update is not None:
                on_update(stats)
