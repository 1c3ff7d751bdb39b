"""The Gymnasium environment's contract: spaces, masks, padding, seeding, fallback, rewards."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.agent.learning.env import EnvConfig, RewardConfig, SchedulingEnv
from fedsched.common.learning.features import CONTEXT_FEATURES, NODE_FEATURES, POD_FEATURES
from fedsched.common.model.metrics import METRICS
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers.kube_default import KubeDefault

REPLAY = EnvConfig(mode="replay", replay={"max_pods": 200})
REPLAY_SHORT = EnvConfig(mode="replay", replay={"max_pods": 30})  # for tests that run several episodes


@pytest.fixture(scope="module")
def cluster():
    """A small GPU cluster (12 nodes, one of them CPU-only) and its pod list."""
    nodes, pods = generate_cluster("gpu", 1, n_nodes=12, n_pods=60)
    assert (nodes.gpu == 0).any() and (nodes.gpu > 0).any()
    return nodes, pods


def first_feasible(obs) -> int:
    return int(np.flatnonzero(obs["mask"])[0])


def run_episode(env: SchedulingEnv, seed: int, rule=first_feasible, check=None, max_steps: int = 10_000):
    """Play one episode with ``rule(obs)``; returns (observations, rewards, reset info, last info)."""
    obs, info0 = env.reset(seed=seed)
    observations, rewards, info = [obs], [], {}
    for _ in range(max_steps):
        if check is not None:
            check(env, obs)
        obs, r, terminated, truncated, info = env.step(rule(obs))
        assert not truncated
        observations.append(obs)
        rewards.append(r)
        if terminated:
            return observations, rewards, info0, info
    raise AssertionError("episode did not terminate")


# ---- spaces -------------------------------------------------------------------------------

def test_check_env_packing(cluster):
    check_env(SchedulingEnv(*cluster, seed=0), skip_render_check=True)


def test_check_env_packing_padded(cluster):
    nodes, pods = cluster
    check_env(SchedulingEnv(nodes, pods, config=EnvConfig(max_nodes=len(nodes) + 5), seed=0),
              skip_render_check=True)


def test_check_env_replay(cluster):
    check_env(SchedulingEnv(*cluster, config=REPLAY, seed=0), skip_render_check=True)


def test_observation_shapes(cluster):
    nodes, pods = cluster
    env = SchedulingEnv(nodes, pods, config=EnvConfig(max_nodes=20), seed=0)
    obs, _ = env.reset(seed=0)
    assert obs["nodes"].shape == (20, len(NODE_FEATURES)) and obs["nodes"].dtype == np.float32
    assert obs["pod"].shape == (len(POD_FEATURES),)
    assert obs["context"].shape == (len(CONTEXT_FEATURES),)
    assert obs["mask"].shape == (20,) and obs["mask"].dtype == np.int8
    assert env.action_space.n == 20
    assert obs in env.observation_space


# ---- masks and padding ----------------------------------------------------------------------

def mask_checker(n_real: int, seen: list):
    def check(env: SchedulingEnv, obs) -> None:
        pod, state, _, _ = env.decision
        feasible = state.feasible(pod)
        mask = obs["mask"].astype(bool)
        np.testing.assert_array_equal(mask, env.action_masks())
        np.testing.assert_array_equal(mask[:n_real], feasible)
        assert not mask[n_real:].any()
        assert mask.any()
        # Rows past the cluster are zero padding.
        assert not obs["nodes"][n_real:].any()
        seen.append(int((~feasible).sum()))
    return check


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**20), pad=st.integers(0, 9), choice_seed=st.integers(0, 2**20))
def test_mask_matches_feasible_nodes_packing(cluster, seed, pad, choice_seed):
    nodes, pods = cluster
    env = SchedulingEnv(nodes, pods, config=EnvConfig(max_nodes=len(nodes) + pad))
    rng = np.random.default_rng(choice_seed)
    seen: list[int] = []
    run_episode(env, seed, rule=lambda o: int(rng.choice(np.flatnonzero(o["mask"]))),
                check=mask_checker(len(nodes), seen))
    assert seen


def test_mask_matches_feasible_nodes_replay(cluster):
    nodes, pods = cluster
    cfg = EnvConfig(mode="replay", replay={"max_pods": 200}, max_nodes=len(nodes) + 4)
    env = SchedulingEnv(nodes, pods, config=cfg)
    seen: list[int] = []
    run_episode(env, 3, check=mask_checker(len(nodes), seen))
    assert seen
    assert any(seen), "some decision should have had an infeasible node"


def test_terminal_observation_and_step_after_end(cluster):
    env = SchedulingEnv(*cluster, seed=0)
    observations, _, _, _ = run_episode(env, 0)
    last = observations[-1]
    assert last in env.observation_space
    assert not last["mask"].any() and not env.action_masks().any()
    with pytest.raises(RuntimeError):
        env.step(0)


def test_step_before_reset_raises(cluster):
    with pytest.raises(RuntimeError):
        SchedulingEnv(*cluster).step(0)


# ---- seeding --------------------------------------------------------------------------------

def trajectory(cluster, seed: int, mode_cfg: EnvConfig | None = None):
    env = SchedulingEnv(*cluster, config=mode_cfg)
    # A fixed, state-dependent action rule: the feasible node with the largest first feature.
    def rule(obs):
        return int(np.argmax(np.where(obs["mask"].astype(bool), obs["nodes"][:, 0], -np.inf)))
    observations, rewards, _, _ = run_episode(env, seed, rule=rule)
    return observations, rewards


def same_trajectory(a, b) -> bool:
    (obs_a, r_a), (obs_b, r_b) = a, b
    if len(obs_a) != len(obs_b) or r_a != r_b:
        return False
    return all(np.array_equal(x[k], y[k]) for x, y in zip(obs_a, obs_b, strict=True) for k in x)


def test_same_seed_same_trajectory_packing(cluster):
    assert same_trajectory(trajectory(cluster, 7), trajectory(cluster, 7))
    assert not same_trajectory(trajectory(cluster, 7), trajectory(cluster, 8))


def test_same_seed_same_trajectory_replay(cluster):
    a = trajectory(cluster, 7, REPLAY_SHORT)
    assert same_trajectory(a, trajectory(cluster, 7, REPLAY_SHORT))
    assert not same_trajectory(a, trajectory(cluster, 8, REPLAY_SHORT))


def test_reset_with_seed_restarts_the_sequence(cluster):
    env = SchedulingEnv(*cluster)
    first = run_episode(env, 11)[:2]
    run_episode(env, 12)
    again = run_episode(env, 11)[:2]
    assert same_trajectory(first, again)


# ---- invalid actions --------------------------------------------------------------------------

def advance_to_masked_decision(env: SchedulingEnv, seed: int):
    """Step with valid actions until the current pod has an infeasible real node."""
    obs, _ = env.reset(seed=seed)
    n = len(env.cluster_nodes)
    actions = []
    while obs["mask"][:n].all():
        a = first_feasible(obs)
        actions.append(a)
        obs, _, terminated, _, _ = env.step(a)
        assert not terminated, "no decision with an infeasible node in this episode"
    return obs, actions


@pytest.mark.parametrize("mode_cfg", [None, REPLAY], ids=["packing", "replay"])
def test_invalid_action_penalised_and_falls_back_to_kube_default(cluster, mode_cfg):
    nodes, pods = cluster
    env = SchedulingEnv(nodes, pods, config=mode_cfg)
    obs, actions = advance_to_masked_decision(env, 5)
    bad = int(np.flatnonzero(obs["mask"][: len(nodes)] == 0)[0])
    pod, state, _, _ = env.decision
    feasible = np.flatnonzero(state.feasible(pod))
    expected = int(feasible[np.argmax(KubeDefault().score(state, pod, feasible))])
    cpu_before = int(state.cpu_req[expected])
    binds_before = env.sim.k if mode_cfg is None else env.sim.counters["binds"]

    obs_bad, r_bad, _, _, info = env.step(bad)
    assert info["invalid_action"] is True
    assert info["node"] == expected
    binds_after = env.sim.k if mode_cfg is None else env.sim.counters["binds"]
    assert binds_after == binds_before + 1
    assert env.sim.state.cpu_req[expected] == cpu_before + pod.cpu

    # The same decision made validly by a twin environment: same outcome, no penalty.
    twin = SchedulingEnv(nodes, pods, config=mode_cfg)
    twin.reset(seed=5)
    for a in actions:
        twin.step(a)
    obs_ok, r_ok, _, _, info_ok = twin.step(expected)
    assert info_ok["invalid_action"] is False
    penalty = (mode_cfg or EnvConfig()).reward.invalid_action
    assert r_bad == pytest.approx(r_ok - penalty, abs=1e-9)
    for k in obs_ok:
        np.testing.assert_array_equal(obs_bad[k], obs_ok[k])


@pytest.mark.parametrize("bad", ["padding", "out_of_range", "negative"])
def test_invalid_action_outside_the_cluster(cluster, bad):
    nodes, pods = cluster
    cfg = EnvConfig(max_nodes=len(nodes) + 3,
                    reward=RewardConfig(alloc_gain=0, frag_removed=0, failed=0, invalid_action=2.5))
    env = SchedulingEnv(nodes, pods, config=cfg)
    env.reset(seed=0)
    action = {"padding": len(nodes) + 1, "out_of_range": len(nodes) + 50, "negative": -1}[bad]
    _, r, _, _, info = env.step(action)
    assert info["invalid_action"] is True
    assert 0 <= info["node"] < len(nodes)
    assert r == -2.5
    assert env.sim.k == 1


# ---- episode end and reward bookkeeping ----------------------------------------------------------

@pytest.mark.parametrize("mode_cfg", [None, REPLAY], ids=["packing", "replay"])
def test_episode_metrics_at_termination(cluster, mode_cfg):
    env = SchedulingEnv(*cluster, config=mode_cfg)
    _, rewards, info0, info = run_episode(env, 2)
    assert set(info["episode_metrics"]) == set(METRICS)
    assert info["episode_return"] == pytest.approx(info0["skipped_reward"] + sum(rewards))
    assert info["invalid_action"] is False


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**20), choice_seed=st.integers(0, 2**20),
       target_load=st.sampled_from([0.8, 1.3, 2.0]))
def test_packing_return_equals_final_allocation(cluster, seed, choice_seed, target_load):
    cfg = EnvConfig(target_load=target_load, reward=RewardConfig(alloc_gain=1, frag_removed=0, failed=0))
    env = SchedulingEnv(*cluster, config=cfg)
    rng = np.random.default_rng(choice_seed)
    _, rewards, info0, info = run_episode(env, seed,
                                          rule=lambda o: int(rng.choice(np.flatnonzero(o["mask"]))))
    total = info0["skipped_reward"] + sum(rewards)
    assert total == pytest.approx(env.sim.allocated_pct, abs=1e-6)
    assert info["episode_return"] == pytest.approx(env.sim.allocated_pct, abs=1e-6)
    assert env.sim.done


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**20), w_alloc=st.floats(0, 2), w_frag=st.floats(0, 2),
       w_failed=st.floats(0, 2))
def test_packing_return_telescopes(cluster, seed, w_alloc, w_frag, w_failed):
    """Every term is a difference of snapshots, so the return is a function of the end state."""
    cfg = EnvConfig(target_load=2.0, reward=RewardConfig(alloc_gain=w_alloc, frag_removed=w_frag,
                                                         failed=w_failed))
    env = SchedulingEnv(*cluster, config=cfg)
    obs, info0 = env.reset(seed=seed)
    frag0 = env.sim.frag_pct
    total, done = info0["skipped_reward"], False
    while not done:
        obs, r, done, _, _ = env.step(first_feasible(obs))
        total += r
    sim = env.sim
    failed_pct = sim.arrived_pct - sim.allocated_pct
    expected = w_alloc * sim.allocated_pct + w_frag * (frag0 - sim.frag_pct) - w_failed * failed_pct
    assert total == pytest.approx(expected, abs=1e-6)


# ---- configuration errors ------------------------------------------------------------------------

def test_invalid_mode_raises(cluster):
    with pytest.raises(ValueError, match="mode"):
        SchedulingEnv(*cluster, config=EnvConfig(mode="batch"))


def test_max_nodes_smaller_than_cluster_raises(cluster):
    nodes, pods = cluster
    with pytest.raises(ValueError, match="max_nodes"):
        SchedulingEnv(nodes, pods, config=EnvConfig(max_nodes=len(nodes) - 1))
