"""Node credit (RewardConfig.node_horizon_s): each replay decision is charged its own chosen
node's outcome over a horizon, and PPO adds that credit to the decision that earned it."""

from __future__ import annotations

import numpy as np
import torch

from fedsched.agent.learning.env import EnvConfig, RewardConfig, SchedulingEnv
from fedsched.agent.learning.ppo import PPOTrainer
from fedsched.common.model.synthetic import generate_cluster

HORIZON = 1800.0


def _env(seed: int = 3) -> SchedulingEnv:
    nodes, pods = generate_cluster("web", 5, n_nodes=6, n_pods=600, trace_hours=12.0,
                                   cpu_median_milli=1500.0, cpu_max_milli=8000)
    cfg = EnvConfig(mode="replay", replay={"target_load": 0.9},
                    reward=RewardConfig(node_horizon_s=HORIZON))
    return SchedulingEnv(nodes, pods, config=cfg, seed=seed)


def _run(env: SchedulingEnv, pick) -> tuple[list[int], dict[int, float], dict[int, int]]:
    """One episode; (decision serials in order, credit per serial, chosen node per serial)."""
    env.reset()
    serials: list[int] = []
    credits: dict[int, float] = {}
    chosen: dict[int, int] = {}
    done = False
    while not done:
        _, state, cand, _ = env.decision
        node = int(pick(state, cand))
        _, _, done, _, info = env.step(node)
        serials.append(info["decision"])
        chosen[info["decision"]] = node
        for s, c in info["credits"]:
            assert s not in credits, "a decision was credited twice"
            credits[s] = c
    return serials, credits, chosen


def _pile(state, cand):  # the busiest feasible node
    return cand[int(np.argmax(state.cpu_used[cand] / state.nodes.cpu[cand]))]


def test_every_decision_gets_exactly_one_credit_by_the_end_of_its_episode():
    env = _env()
    serials, credits, _ = _run(env, lambda state, cand: cand[0])
    assert len(serials) > 100
    assert set(credits) == set(serials)
    assert all(c <= 0 for c in credits.values())
    assert env.open_credits() == []


def test_piling_onto_busy_nodes_earns_worse_credit_than_spreading_by_measured_use():
    def spread(state, cand):  # the least busy feasible node
        return cand[int(np.argmin(state.cpu_used[cand] / state.nodes.cpu[cand]))]

    _, piled, _ = _run(_env(), _pile)  # the same episode (fresh environments, one seed)
    _, spread_c, _ = _run(_env(), spread)
    assert sum(piled.values()) < sum(spread_c.values()) - 10.0


def test_credit_is_the_chosen_nodes_own_outcome():
    """A decision's credit comes from its node's counters (and its pod's OOM kills) only: a
    decision on a node that never runs hot earns 0 while other nodes run hot meanwhile."""
    env = _env()
    serials, credits, chosen = _run(env, _pile)
    lm = env.sim.load_metrics
    assert (lm.node_hot_s > 0).any() and (lm.node_hot_s == 0).any()
    cool = {n for n in range(len(lm.node_hot_s)) if lm.node_hot_s[n] == 0 and lm.node_throttled[n] == 0}
    assert env.sim.counters["oom_events"] == 0  # so only the node counters can charge a decision
    on_cool = [s for s in serials if chosen[s] in cool]
    on_hot = [s for s in serials if chosen[s] not in cool]
    assert on_cool and on_hot
    assert all(credits[s] == 0.0 for s in on_cool)
    assert min(credits[s] for s in on_hot) < 0


def test_ppo_adds_a_credit_to_the_step_that_took_the_decision_and_drops_older_ones():
    rewards = torch.zeros((4, 2))
    decision_step = [{}, {}]
    infos = {"decision": np.array([10, 20]), "_decision": np.array([True, True]),
             "credits": np.array([[], []] , dtype=object), "_credits": np.array([True, True])}
    PPOTrainer._assign_credits(infos, 1, decision_step, rewards)
    assert decision_step == [{10: 1}, {20: 1}]
    later = {"decision": np.array([11, 21]), "_decision": np.array([True, True]),
             "credits": np.empty(2, dtype=object), "_credits": np.array([True, True])}
    later["credits"][0] = [(10, -1.5), (3, -9.0)]  # 3: a decision of an earlier rollout
    later["credits"][1] = []
    PPOTrainer._assign_credits(later, 3, decision_step, rewards)
    assert rewards[1, 0] == -1.5 and rewards.sum() == -1.5
