"""PPO for the node-scoring policy, in the spirit of CleanRL's single-file ``ppo.py``.

Read top to bottom: the hyper-parameters (:class:`PPOConfig`, a docstring line under each
field, as CleanRL's ``Args``), then :meth:`PPOTrainer.train`, one *update* after another.

An **update** is one rollout followed by one optimisation phase: each environment takes
``num_steps`` decisions (stepped in lockstep through Gymnasium's vector API,
``gymnasium.vector.SyncVectorEnv`` with same-step autoreset, so the observation after a
finished episode is the next episode's first and ``dones`` marks the boundary), then
generalised advantage estimation, then ``update_epochs`` passes of minibatch steps with the
clipped surrogate, the clipped value loss, an entropy bonus, advantage normalisation and
gradient clipping (an early stop past ``target_kl``), under a linearly annealed learning
rate. TD3 uses the word for the same unit (one collection step of ``log_every`` decisions with
its gradient steps); ``progress.csv`` has one row per update, and ``eval_every``,
``checkpoint_every`` and ``critic_warmup`` count updates.

Each environment is a member cluster or a slice of one; their observations are padded to one
size (``EnvConfig.max_nodes``), as the vector API needs one observation space. The
categorical over nodes is masked: the policy gives infeasible nodes a logit of -1e9. Logged
per update: losses, entropy, approx_kl, clip fraction, explained variance, steps/s
(TensorBoard tags as CleanRL's, :data:`TB_TAGS`) and the metrics of finished episodes.

Everything is seeded (torch, numpy, environments), so a run is reproducible on a given
machine and torch version.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fedsched.common.federation.codec import proximal_term
from fedsched.common.learning.features import CONTEXT_FEATURES, NODE_FEATURES, POD_FEATURES
from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig


@dataclass
class PPOConfig:
    total_steps: int = 200_000
    """pod decisions to train on, over all environments"""
    num_steps: int = 256
    """decisions per environment per rollout (one rollout per update)"""
    learning_rate: float = 3e-4
    """Adam step size at the start of the run"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the updates"""
    gamma: float = 0.995
    """discount per decision"""
    gae_lambda: float = 0.95
    """lambda of generalised advantage estimation"""
    num_minibatches: int = 8
    """minibatches per epoch of an update"""
    update_epochs: int = 4
    """passes over each rollout in its update"""
    norm_adv: bool = True
    """normalise the advantages per minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient (also clips the value loss)"""
    clip_vloss: bool = True
    """clip the value loss as well, as in the PPO paper's implementation"""
    ent_coef: float = 0.003
    """weight of the entropy bonus"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    max_grad_norm: float = 0.5
    """maximum global norm of the gradient (clipped above it)"""
    target_kl: float | None = 0.05
    """stop an update's epochs early once the approximate KL passes this (none: never)"""
    critic_warmup: int = 0
    """first updates that train only the critic (for a warm-started actor)"""
    proximal_mu: float = 0.0
    """FedProx: weight of mu/2 ||w - w_anchor||^2 (needs an anchor; 0: off)"""
    hidden: int = 64
    """width of the policy's hidden layers"""
    seed: int = 1
    """seeds torch, numpy and the environments"""
    torch_threads: int = 1
    """torch intra-op threads (the environments are the bottleneck)"""

    def batch_size_for(self, n_envs: int) -> int:
        """Decisions per rollout (one update's batch)."""
        return self.num_steps * n_envs


# Stats of an update (progress.csv columns) -> TensorBoard tags, as CleanRL names them.
TB_TAGS = {
    "learning_rate": "charts/learning_rate",
    "value_loss": "losses/value_loss",
    "policy_loss": "losses/policy_loss",
    "entropy": "losses/entropy",
    "old_approx_kl": "losses/old_approx_kl",
    "approx_kl": "losses/approx_kl",
    "clipfrac": "losses/clipfrac",
    "explained_variance": "losses/explained_variance",
    "steps_per_s": "charts/SPS",
    "mean_reward": "charts/mean_reward",
}


def obs_tensors(obs: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    """(nodes [E, N, F], pod [E, P], context [E, C], mask [E, N] bool) of a batched observation."""
    return (torch.from_numpy(np.asarray(obs["nodes"], np.float32)),
            torch.from_numpy(np.asarray(obs["pod"], np.float32)),
            torch.from_numpy(np.asarray(obs["context"], np.float32)),
            torch.from_numpy(np.asarray(obs["mask"]).astype(bool)))


class RolloutObs:
    """Single observations (a list of dicts, possibly of different sizes) padded to ``n_max``
    nodes, as torch tensors [E, N, ...]."""

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


def make_vector_env(envs: Sequence[gym.Env]) -> gym.vector.SyncVectorEnv:
    """The environments stepped in lockstep, each reset as its episode ends (same-step autoreset)."""
    if not envs:
        raise ValueError("PPO needs at least one environment")
    space = envs[0].observation_space
    if any(env.observation_space != space or env.action_space != envs[0].action_space for env in envs):
        raise ValueError("the environments' observation spaces differ: pad them to one size "
                         "(EnvConfig(max_nodes=...)) to step them as one vector environment")
    return gym.vector.SyncVectorEnv([lambda env=env: env for env in envs],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def env_info(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """Environment ``i``'s entries of a vector environment's batched info dict (a ``_key`` mask
    beside each key says which environments have it; nested dicts are batched alike)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or not infos[f"_{key}"][i]:
            continue
        if isinstance(value, dict):
            out[key] = env_info(value, i)
        else:
            out[key] = value[i].item() if isinstance(value[i], np.generic) else value[i]
    return out


def _open_credits(envs: gym.vector.VectorEnv) -> Sequence[Sequence[tuple[int, float]]]:
    """Each environment's credits of still-open decisions (none from an environment without
    node credit, e.g. a test's toy environment)."""
    try:
        return envs.call("open_credits")
    except AttributeError:
        return [()] * envs.num_envs


def _credit_infos(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """Environment ``i``'s step info, from ``final_info`` when its episode ended this step."""
    if "final_info" in infos and infos["_final_info"][i]:
        return env_info(infos["final_info"], i)
    return env_info(infos, i)


class PPOTrainer:
    """Holds the policy, optimiser and vector environment; :meth:`train` runs updates.

    ``envs``: the environments (stepped as one ``SyncVectorEnv``) or a vector environment
    with same-step autoreset.
    """

    def __init__(self, envs: Sequence[gym.Env] | gym.vector.VectorEnv, cfg: PPOConfig,
                 policy: NodeScoringPolicy | None = None,
                 anchor: dict[str, torch.Tensor] | None = None) -> None:
        if not isinstance(envs, gym.vector.VectorEnv):
            envs = make_vector_env(list(envs))
        if envs.metadata.get("autoreset_mode") != gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError("PPOTrainer needs a vector environment with same-step autoreset")
        self.envs, self.cfg = envs, cfg
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.set_num_threads(cfg.torch_threads)
        self.policy = policy or NodeScoringPolicy(PolicyConfig(hidden=cfg.hidden))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate, eps=1e-5)
        # FedProx anchor: the global weights received this federated round.
        self.anchor = {k: v.detach().clone() for k, v in anchor.items()} if anchor else None
        self.n_max = int(envs.single_action_space.n)  # nodes per (padded) observation
        self.global_step = 0
        self.update = 0  # updates done (one rollout + one optimisation phase each)
        self.num_updates = max(1, cfg.total_steps // cfg.batch_size_for(envs.num_envs))
        seeds = [cfg.seed * 1000 + i for i in range(envs.num_envs)]
        self.next_obs = obs_tensors(envs.reset(seed=seeds)[0])
        self.next_done = torch.zeros(envs.num_envs)

    @staticmethod
    def _assign_credits(infos: dict[str, Any], step: int, decision_step: list[dict[int, int]],
                        rewards: torch.Tensor) -> None:
        """Node credit (``RewardConfig.node_horizon_s``): remember which rollout step took each
        decision, and add each matured credit to its own decision's reward when that decision is
        in this rollout (credits of decisions of earlier rollouts are dropped). Environments
        without node credit report no credits: nothing to do then."""
        if "credits" not in infos and "credits" not in infos.get("final_info", {}):
            return
        for i in range(len(decision_step)):
            info = _credit_infos(infos, i)
            if "decision" in info:
                decision_step[i][int(info["decision"])] = step
            for serial, c in info.get("credits", ()):
                t = decision_step[i].get(int(serial))
                if t is not None:
                    rewards[t, i] += float(c)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "global_step": self.global_step,
                "update": self.update, "config": asdict(self.cfg)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(d["optimizer"])
        self.global_step, self.update = int(d["global_step"]), int(d["update"])

    def train(self, on_update: Callable[[dict[str, float]], None] | None = None,
              on_episode: Callable[[dict[str, float]], None] | None = None,
              stop: Callable[[], bool] | None = None) -> None:
        """Run updates until ``num_updates`` (or until ``stop()``, checked before each update).

        ``on_update(stats)`` after each update (the progress.csv row); ``on_episode(metrics)``
        for each finished episode (its ``episode_metrics``, ``episode_return``, ``env`` and
        ``global_step``).
        """
        cfg, envs, policy = self.cfg, self.envs, self.policy
        num_envs, n_max = envs.num_envs, self.n_max
        n_f, n_p, n_c = len(NODE_FEATURES), len(POD_FEATURES), len(CONTEXT_FEATURES)
        # ---- rollout storage ----------------------------------------------------------------
        obs_nodes = torch.zeros((cfg.num_steps, num_envs, n_max, n_f))
        obs_mask = torch.zeros((cfg.num_steps, num_envs, n_max), dtype=torch.bool)
        obs_pod = torch.zeros((cfg.num_steps, num_envs, n_p))
        obs_ctx = torch.zeros((cfg.num_steps, num_envs, n_c))
        actions = torch.zeros((cfg.num_steps, num_envs), dtype=torch.long)
        logprobs = torch.zeros((cfg.num_steps, num_envs))
        rewards = torch.zeros((cfg.num_steps, num_envs))
        dones = torch.zeros((cfg.num_steps, num_envs))
        values = torch.zeros((cfg.num_steps, num_envs))
        next_obs, next_done = self.next_obs, self.next_done
        # Per environment: the rollout step of each decision of this rollout (node credit).
        decision_step: list[dict[int, int]] = [{} for _ in range(num_envs)]
        while self.update < self.num_updates:
            if stop is not None and stop():
                break
            start_time = time.perf_counter()
            if cfg.anneal_lr:
                frac = 1.0 - self.update / self.num_updates
                self.optimizer.param_groups[0]["lr"] = frac * cfg.learning_rate

            # ---- rollout: num_steps decisions in every environment --------------------------
            policy.eval()
            for step in range(cfg.num_steps):
                self.global_step += num_envs
                obs_nodes[step], obs_pod[step], obs_ctx[step], obs_mask[step] = next_obs
                dones[step] = next_done
                with torch.no_grad():
                    logits, value = policy(*next_obs)
                    dist = masked_categorical(logits)
                    action = dist.sample()
                actions[step], logprobs[step], values[step] = action, dist.log_prob(action), value
                obs, reward, terminations, truncations, infos = envs.step(action.numpy())
                rewards[step] = torch.from_numpy(reward).float()
                self._assign_credits(infos, step, decision_step, rewards)
                next_obs = obs_tensors(obs)
                next_done = torch.from_numpy(np.logical_or(terminations, truncations)).float()
                if on_episode is not None and "final_info" in infos:
                    for i in np.flatnonzero(infos["_final_info"]):
                        info = env_info(infos["final_info"], int(i))
                        m = dict(info.get("episode_metrics", {}))
                        m["episode_return"] = info.get("episode_return", float("nan"))
                        m["env"] = int(i)
                        m["global_step"] = self.global_step
                        on_episode(m)
            self.next_obs, self.next_done = next_obs, next_done
            # Decisions whose credit horizon is not over yet get what they have earned so far.
            for i, credits in enumerate(_open_credits(envs)):
                for serial, c in credits:
                    if serial in decision_step[i]:
                        rewards[decision_step[i][serial], i] += c
            decision_step = [{} for _ in range(num_envs)]

            # ---- advantages: generalised advantage estimation -------------------------------
            with torch.no_grad():
                _, next_value = policy(*next_obs)
                advantages = torch.zeros_like(rewards)
                lastgaelam = torch.zeros(num_envs)
                for t in reversed(range(cfg.num_steps)):
                    if t == cfg.num_steps - 1:
                        nextnonterminal, nextvalues = 1.0 - next_done, next_value
                    else:
                        nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                    delta = rewards[t] + cfg.gamma * nextvalues * nextnonterminal - values[t]
                    lastgaelam = delta + cfg.gamma * cfg.gae_lambda * nextnonterminal * lastgaelam
                    advantages[t] = lastgaelam
                returns = advantages + values

            # ---- optimisation: update_epochs passes of minibatch steps ----------------------
            policy.train()
            batch_size = cfg.num_steps * num_envs
            b_nodes, b_mask = obs_nodes.reshape(batch_size, n_max, n_f), obs_mask.reshape(batch_size, n_max)
            b_pod, b_ctx = obs_pod.reshape(batch_size, n_p), obs_ctx.reshape(batch_size, n_c)
            b_actions, b_logprobs = actions.reshape(batch_size), logprobs.reshape(batch_size)
            b_advantages, b_returns = advantages.reshape(batch_size), returns.reshape(batch_size)
            b_values = values.reshape(batch_size)
            minibatch_size = max(1, batch_size // cfg.num_minibatches)
            clipfracs, approx_kl, old_approx_kl = [], 0.0, 0.0
            pg_loss = v_loss = entropy_loss = torch.zeros(())
            for _epoch in range(cfg.update_epochs):
                b_inds = torch.randperm(batch_size)
                for start in range(0, batch_size, minibatch_size):
                    mb_inds = b_inds[start:start + minibatch_size]
                    logits, newvalue = policy(b_nodes[mb_inds], b_pod[mb_inds], b_ctx[mb_inds],
                                              b_mask[mb_inds])
                    dist = masked_categorical(logits)
                    newlogprob = dist.log_prob(b_actions[mb_inds])
                    entropy_loss = dist.entropy().mean()
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()
                    with torch.no_grad():  # http://joschu.net/blog/kl-approx.html
                        old_approx_kl = float((-logratio).mean())
                        approx_kl = float(((ratio - 1) - logratio).mean())
                        clipfracs.append(float(((ratio - 1.0).abs() > cfg.clip_coef).float().mean()))

                    mb_advantages = b_advantages[mb_inds]
                    if cfg.norm_adv and len(mb_inds) > 1:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                    # Policy loss (clipped surrogate)
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                    # Value loss
                    if cfg.clip_vloss:
                        v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                        v_clipped = b_values[mb_inds] + (newvalue - b_values[mb_inds]).clamp(
                            -cfg.clip_coef, cfg.clip_coef)
                        v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                    if self.update < cfg.critic_warmup:  # keep a warm-started actor while V catches up
                        loss = cfg.vf_coef * v_loss
                    else:
                        loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
                    if self.anchor is not None and cfg.proximal_mu > 0:
                        loss = loss + proximal_term(dict(policy.named_parameters()), self.anchor,
                                                    cfg.proximal_mu)

                    self.optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                    self.optimizer.step()
                if cfg.target_kl is not None and approx_kl > cfg.target_kl:
                    break

            self.update += 1
            stats = {
                "update": self.update, "global_step": self.global_step,
                "learning_rate": self.optimizer.param_groups[0]["lr"],
                "value_loss": float(v_loss.detach()), "policy_loss": float(pg_loss.detach()),
                "entropy": float(entropy_loss.detach()),
                "old_approx_kl": old_approx_kl, "approx_kl": approx_kl,
                "clipfrac": float(np.mean(clipfracs)) if clipfracs else 0.0,
                "explained_variance": explained_variance(b_values.numpy(), b_returns.numpy()),
                "mean_reward": float(rewards.mean()),
                "steps_per_s": batch_size / (time.perf_counter() - start_time),
            }
            if on_update is not None:
                on_update(stats)
