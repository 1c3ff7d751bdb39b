"""PPO on a toy problem with a known optimum, reproducibility, logged stats, masked sampling."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from fedsched.agent.learning.ppo import PPOConfig, PPOTrainer, RolloutObs
from fedsched.common.learning.features import CONTEXT_FEATURES, NODE_FEATURES, POD_FEATURES

K = 5


class ArgmaxEnv(gym.Env):
    """Each step shows K nodes with random features, one of them infeasible; reward 1 iff
    the chosen node has the largest feature 0 among the feasible ones. 20 steps an episode.

    The same spaces as :class:`SchedulingEnv` (a padded ``Dict`` with a mask) on K nodes.
    """

    max_nodes = K
    metadata = {"render_modes": []}  # noqa: RUF012  (gymnasium's class attribute)
    observation_space = spaces.Dict({
        "nodes": spaces.Box(-np.inf, np.inf, (K, len(NODE_FEATURES)), np.float32),
        "pod": spaces.Box(-np.inf, np.inf, (len(POD_FEATURES),), np.float32),
        "context": spaces.Box(-np.inf, np.inf, (len(CONTEXT_FEATURES),), np.float32),
        "mask": spaces.MultiBinary(K),
    })
    action_space = spaces.Discrete(K)

    def __init__(self, episode_len: int = 20) -> None:
        self.episode_len = episode_len
        self.rng = np.random.default_rng(0)
        self.t = 0
        self.obs: dict[str, np.ndarray] = {}

    def _draw(self) -> dict[str, np.ndarray]:
        mask = np.ones(K, dtype=np.int8)
        mask[self.rng.integers(K)] = 0
        self.obs = {
            "nodes": self.rng.uniform(0, 1, (K, len(NODE_FEATURES))).astype(np.float32),
            "pod": self.rng.uniform(0, 1, len(POD_FEATURES)).astype(np.float32),
            "context": self.rng.uniform(0, 1, len(CONTEXT_FEATURES)).astype(np.float32),
            "mask": mask,
        }
        return self.obs

    def best(self) -> int:
        col = np.where(self.obs["mask"].astype(bool), self.obs["nodes"][:, 0], -np.inf)
        return int(np.argmax(col))

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action: int):
        reward = float(int(action) == self.best())
        self.t += 1
        terminated = self.t >= self.episode_len
        info = {"episode_return": 0.0, "episode_metrics": {"toy": 1.0}} if terminated else {}
        return self._draw(), reward, terminated, False, info


class MaskCheckingEnv(ArgmaxEnv):
    """Fails the rollout if the trainer ever picks a masked node."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0

    def step(self, action: int):
        assert 0 <= int(action) < K
        assert self.obs["mask"][int(action)] == 1, f"masked action {action} sampled"
        self.checked += 1
        return super().step(action)


def greedy_accuracy(policy, n: int = 1000, seed: int = 12345) -> float:
    """Share of fresh steps on which the greedy (argmax-logit) choice is the optimum."""
    env = ArgmaxEnv()
    env.reset(seed=seed)
    hits = 0
    policy.eval()
    for _ in range(n):
        ob = RolloutObs([env.obs], K)
        with torch.no_grad():
            logits, _ = policy(ob.nodes, ob.pod, ob.ctx, ob.mask)
        action = int(logits[0].argmax())
        hits += action == env.best()
        env.step(action)
    return hits / n


# Rewards are independent of the future, so gamma = 0 makes this a contextual bandit.
TOY = dict(num_steps=64, learning_rate=1e-3, gamma=0.0, ent_coef=0.0, hidden=64)


def test_ppo_learns_the_known_optimum():
    trainer = PPOTrainer([ArgmaxEnv(), ArgmaxEnv()], PPOConfig(total_steps=8192, seed=1, **TOY))
    untrained = greedy_accuracy(trainer.policy)
    assert untrained < 0.5  # chance among 4 feasible nodes is 0.25
    log: list[dict[str, float]] = []
    trainer.train(on_update=log.append)
    assert trainer.update == trainer.num_updates == 8192 // 128
    assert trainer.global_step == 8192
    assert len(log) == trainer.num_updates
    trained = greedy_accuracy(trainer.policy)
    assert trained >= 0.9, f"greedy accuracy {trained:.3f} (untrained {untrained:.3f})"
    # The rollout reward follows the learning.
    assert np.mean([s["mean_reward"] for s in log[-5:]]) > np.mean([s["mean_reward"] for s in log[:5]]) + 0.3


def one_update(seed: int) -> tuple[PPOTrainer, list[dict[str, float]]]:
    trainer = PPOTrainer([ArgmaxEnv(), ArgmaxEnv()], PPOConfig(total_steps=128, seed=seed, **TOY))
    log: list[dict[str, float]] = []
    trainer.train(on_update=log.append)
    return trainer, log


def test_same_seed_same_weights_after_one_update():
    a, log_a = one_update(5)
    b, log_b = one_update(5)
    assert a.update == b.update == 1
    sd_a, sd_b = a.policy.state_dict(), b.policy.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), k
    drop = {"steps_per_s"}  # wall-clock dependent
    assert {k: v for k, v in log_a[0].items() if k not in drop} == \
        {k: v for k, v in log_b[0].items() if k not in drop}
    c, _ = one_update(6)
    assert any(not torch.equal(sd_a[k], v) for k, v in c.policy.state_dict().items())


def test_update_changes_the_weights():
    trainer, _ = one_update(5)
    fresh = PPOTrainer([ArgmaxEnv()], PPOConfig(total_steps=128, seed=5, **TOY)).policy.state_dict()
    assert any(not torch.equal(fresh[k], v) for k, v in trainer.policy.state_dict().items())


def test_update_stats_are_logged():
    _, log = one_update(2)
    (stats,) = log
    for key in ("approx_kl", "clipfrac", "explained_variance", "steps_per_s", "entropy",
                "value_loss", "policy_loss", "learning_rate", "update", "global_step"):
        assert key in stats, key
    assert stats["update"] == 1 and stats["global_step"] == 128
    assert 0.0 <= stats["clipfrac"] <= 1.0
    assert stats["steps_per_s"] > 0
    # Entropy of a categorical over at most 4 feasible nodes.
    assert 0.0 < stats["entropy"] <= math.log(4) + 1e-4
    assert math.isfinite(stats["approx_kl"]) and stats["approx_kl"] >= -1e-6
    assert math.isfinite(stats["explained_variance"]) or math.isnan(stats["explained_variance"])


def test_masked_actions_are_never_sampled():
    envs = [MaskCheckingEnv(), MaskCheckingEnv()]
    episodes: list[dict[str, float]] = []
    trainer = PPOTrainer(envs, PPOConfig(total_steps=3 * 128, seed=3, **TOY))
    trainer.train(on_episode=episodes.append)
    assert sum(e.checked for e in envs) == 3 * 128
    # 64 steps per env and rollout, 20-step episodes: finished episodes are reported.
    assert len(episodes) == 2 * (3 * 64 // 20)
    assert {e["env"] for e in episodes} == {0, 1}
    assert all(e["toy"] == 1.0 for e in episodes)


@pytest.mark.parametrize("stop_after", [1, 2])
def test_stop_callback_ends_training(stop_after):
    trainer = PPOTrainer([ArgmaxEnv()], PPOConfig(total_steps=10 * 64, seed=1, **TOY))
    trainer.train(stop=lambda: trainer.update >= stop_after)
    assert trainer.update == stop_after


def test_the_environments_step_as_one_gymnasium_vector_env():
    envs = [ArgmaxEnv(), ArgmaxEnv()]
    trainer = PPOTrainer(envs, PPOConfig(total_steps=128, seed=1, **TOY))
    assert isinstance(trainer.envs, gym.vector.SyncVectorEnv)
    assert trainer.envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    assert trainer.envs.envs == envs and trainer.n_max == K
    # A prebuilt vector env works too, if it resets in the same step.
    vec = gym.vector.SyncVectorEnv([ArgmaxEnv, ArgmaxEnv], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert PPOTrainer(vec, PPOConfig(total_steps=128, seed=1, **TOY)).envs is vec
    with pytest.raises(ValueError, match="same-step autoreset"):
        PPOTrainer(gym.vector.SyncVectorEnv([ArgmaxEnv]), PPOConfig(seed=1, **TOY))


def test_environments_of_different_sizes_are_refused():
    class Wider(ArgmaxEnv):
        observation_space = spaces.Dict({**ArgmaxEnv.observation_space.spaces,
                                         "mask": spaces.MultiBinary(K + 1)})

    with pytest.raises(ValueError, match="max_nodes"):
        PPOTrainer([ArgmaxEnv(), Wider()], PPOConfig(seed=1, **TOY))


def test_episode_infos_are_read_per_environment():
    from fedsched.agent.learning.ppo import env_info

    vec = gym.vector.SyncVectorEnv([ArgmaxEnv, lambda: ArgmaxEnv(episode_len=3)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    vec.reset(seed=[0, 1])
    for _ in range(2):
        *_, infos = vec.step(np.zeros(2, dtype=np.int64))
        assert "final_info" not in infos
    *_, infos = vec.step(np.zeros(2, dtype=np.int64))
    assert list(np.flatnonzero(infos["_final_info"])) == [1]
    assert env_info(infos["final_info"], 1) == {"episode_return": 0.0, "episode_metrics": {"toy": 1.0}}
