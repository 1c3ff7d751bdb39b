"""sb3-contrib's MaskablePPO trains on the environment as a reference point (action_masks())."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
from fedsched.common.model.synthetic import generate_cluster

sb3_contrib = pytest.importorskip("sb3_contrib", reason="sb3-contrib is a dev extra")


def test_maskable_ppo_trains_and_only_takes_feasible_actions():
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.maskable.utils import get_action_masks

    nodes, pods = generate_cluster("gpu", seed=4, n_nodes=12, n_pods=80)
    env = SchedulingEnv(nodes, pods, config=EnvConfig(target_load=1.0), seed=0)
    model = MaskablePPO("MultiInputPolicy", env, n_steps=64, batch_size=32, n_epochs=2, seed=0,
                        device="cpu", verbose=0)
    model.learn(total_timesteps=128)
    obs, _ = env.reset(seed=7)
    done, steps = False, 0
    while not done:
        masks = get_action_masks(env)
        action, _ = model.predict(obs, action_masks=masks, deterministic=True)
        assert masks[int(action)], "MaskablePPO chose a masked node"
        obs, _, done, _, info = env.step(int(action))
        steps += 1
        assert not info["invalid_action"]
    assert steps > 0 and np.isfinite(info["episode_metrics"]["alloc_gpu"])
