"""Node credit (RewardConfig.node_horizon_s): each replay decision is charged its own chosen
node's outcome over a horizon (the node's throttling, or with throttle_credit="pod" the placed
pod's own), and PPO adds that credit to the decision that earned it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsched.agent.learning.env import EnvConfig, RewardConfig, SchedulingEnv
from fedsched.agent.learning.ppo import PPOTrainer
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers.base import Placement

HORIZON = 1800.0


def _cluster():
    """The small web cluster every environment here replays (6 nodes, 600 pods, 12 hours)."""
    return generate_cluster("web", 5, n_nodes=6, n_pods=600, trace_hours=12.0,
                            cpu_median_milli=1500.0, cpu_max_milli=8000)


def _env(seed: int = 3) -> SchedulingEnv:
    nodes, pods = _cluster()
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


# ---- RewardConfig.throttle_credit: the node's throttling or the placed pod's own ----------------


def _throttle_env(credit: str, horizon: float = HORIZON, **reward) -> SchedulingEnv:
    nodes, pods = _cluster()
    cfg = EnvConfig(mode="replay", replay={"target_load": 0.9, "failure_rate_per_node_hour": 0.05,
                                           "usage_cpu_median": 0.8},  # throttled nodes, evictions
                    reward=RewardConfig(node_horizon_s=horizon, throttle_credit=credit, **reward))
    return SchedulingEnv(nodes, pods, config=cfg, seed=3)


def test_pod_throttle_credit_charges_each_run_of_a_pod_to_the_bind_that_started_it():
    """Throttling alone (weight 60: one unit per core-second) and a horizon past the episode's
    end: every run of every pod is charged to exactly one decision, the one that bound it, up to
    the run's end (an evicted pod's next run is its next bind's), so the decisions' charges add
    up to the run's throttled CPU; the node's throttling would count each core-second once per
    decision on the node."""
    env = _throttle_env("pod", horizon=1e9, node_hot=0.0, node_oom=0.0, node_throttled=60.0)
    serials, credits, _ = _run(env, _pile)
    assert set(credits) == set(serials) and all(c <= 0 for c in credits.values())
    sim = env.sim
    assert sim.counters["evictions"] > 0  # pods ran more than once
    total = sim.load_metrics.result()["throttled_cpu_core_s"]
    assert total > 100.0
    assert -sum(credits.values()) == pytest.approx(total, rel=1e-9)
    node_env = _throttle_env("node", horizon=1e9, node_hot=0.0, node_oom=0.0, node_throttled=60.0)
    _, node_credits, _ = _run(node_env, _pile)
    assert -sum(node_credits.values()) > 3 * total


def test_pod_throttle_credit_keeps_the_hot_and_oom_terms_and_differs_only_in_throttling():
    _, pod_c, chosen = _run(_throttle_env("pod"), _pile)
    _, node_c, chosen_n = _run(_throttle_env("node"), _pile)
    assert chosen == chosen_n  # the same episode, decision for decision
    no_thr = {"node_throttled": 0.0}
    _, pod_0, _ = _run(_throttle_env("pod", **no_thr), _pile)
    _, node_0, _ = _run(_throttle_env("node", **no_thr), _pile)
    assert pod_0 == node_0  # hot minutes and OOM kills as before
    assert pod_c != node_c
    pod_term = {s: pod_c[s] - pod_0[s] for s in pod_c}
    node_term = {s: node_c[s] - node_0[s] for s in node_c}
    assert all(t <= 1e-12 for t in pod_term.values()) and any(t < 0 for t in pod_term.values())
    assert sum(t < 0 for t in pod_term.values()) < sum(t < 0 for t in node_term.values())


def _mem_env(horizon: float = HORIZON, **reward) -> SchedulingEnv:
    """Pods that use most of the memory they request: nodes run memory-hot."""
    nodes, pods = _cluster()
    cfg = EnvConfig(mode="replay", replay={"target_load": 0.9, "usage_mem_median": (0.9,) * 4},
                    reward=RewardConfig(node_horizon_s=horizon, **reward))
    return SchedulingEnv(nodes, pods, config=cfg, seed=3)


def _pile_reading(env: SchedulingEnv, read) -> tuple[dict[int, tuple[int, float]], dict[int, float]]:
    """One episode piling onto the busiest node: ``read(node)`` of each decision's chosen node just
    before its bind (``{serial: (node, reading)}``, the last decision left out) and every credit."""
    env.reset()
    at_bind: dict[int, tuple[int, float]] = {}
    credits: dict[int, float] = {}
    done = False
    while not done:
        _, state, cand = env.pending
        node = int(_pile(state, cand))
        before = read(node)
        _, _, done, _, info = env.step_placement(Placement(node), observe=False)
        if not done:
            at_bind[info["decision"]] = (node, before)
        credits.update(info["credits"])
    return at_bind, credits


def test_hot_memory_credit_charges_the_chosen_nodes_hot_memory_minutes_since_the_bind():
    """Hot memory minutes alone (weight 1, horizon past the episode's end): each decision's credit
    is minus its chosen node's hot memory minutes from the bind to the end, read off the per-node
    counter; priced at 0 (the default) the credits are those without the term, decision for
    decision."""
    only_mem = {"node_hot": 0.0, "node_oom": 0.0, "node_throttled": 0.0, "node_hot_mem": 1.0}
    env = _mem_env(horizon=1e9, **only_mem)
    at_bind, credits = _pile_reading(env, lambda node: float(env.sim.load_metrics.node_hot_mem_s[node]))
    end = env.sim.load_metrics.node_hot_mem_s
    assert end.sum() == pytest.approx(env.sim.load_metrics.result()["hot_mem_node_s"])
    assert end.max() > 600.0  # piling runs some node's memory hot for minutes
    assert any(credits[s] < 0 for s in at_bind)
    for s, (node, before) in at_bind.items():
        assert credits[s] == pytest.approx(-(float(end[node]) - before) / 60.0, abs=1e-9)
    assert RewardConfig().node_hot_mem == 0.0
    _, default_c, _ = _run(_mem_env(), _pile)
    _, zero_c, _ = _run(_mem_env(node_hot_mem=0.0), _pile)
    _, priced_c, _ = _run(_mem_env(node_hot_mem=1.0), _pile)
    assert default_c == zero_c
    assert all(priced_c[s] <= default_c[s] + 1e-12 for s in default_c)
    assert any(priced_c[s] < default_c[s] for s in default_c)


def test_node_oom_credit_charges_every_kill_on_the_chosen_node_since_the_bind():
    """OOM kills alone (weight 1, horizon past the episode's end): with ``oom_credit="node"`` each
    decision's credit is minus the kills on its chosen node from the bind to the end, whichever
    pod the kernel picked, read off the node's counter; the placed pod's own kills (the default)
    charge fewer decisions."""
    only_oom = {"node_hot": 0.0, "node_oom": 1.0, "node_throttled": 0.0}

    def _oom_env(**reward) -> SchedulingEnv:  # pods using 2.5x the memory they request: kills
        nodes, pods = _cluster()
        cfg = EnvConfig(mode="replay", replay={"target_load": 0.9, "usage_mem_median": (2.5,) * 4},
                        reward=RewardConfig(node_horizon_s=1e9, **only_oom, **reward))
        return SchedulingEnv(nodes, pods, config=cfg, seed=3)

    env = _oom_env(oom_credit="node")
    at_bind, credits = _pile_reading(env, lambda node: int(env.sim.node_stats.oom_count[node]))
    end = env.sim.node_stats.oom_count
    assert int(end.sum()) == env.sim.counters["oom_events"] > 5  # piling memory-heavy pods kills
    for s, (node, before) in at_bind.items():
        assert credits[s] == -(int(end[node]) - before)
    _, pod_c, chosen = _run(_oom_env(oom_credit="pod"), _pile)
    _, default_c, _ = _run(_oom_env(), _pile)
    _, node_c, chosen_n = _run(_oom_env(oom_credit="node"), _pile)
    assert RewardConfig().oom_credit == "pod" and default_c == pod_c  # the default: as before
    assert chosen == chosen_n  # the same episode, decision for decision
    assert sum(c < 0 for c in node_c.values()) > sum(c < 0 for c in pod_c.values())  # denser
    with pytest.raises(ValueError, match="oom_credit"):
        _oom_env(oom_credit="cluster")


def test_the_default_throttle_credit_is_the_nodes_and_others_are_refused():
    assert RewardConfig().throttle_credit == "node"
    with pytest.raises(ValueError, match="throttle_credit"):
        _throttle_env("cluster")


def test_a_decision_matures_once_its_horizon_has_passed_and_not_before():
    """The open decisions are kept in bind order and only a prefix of them is looked at per step:
    after every step nothing whose horizon has passed is still open, and each credit reported
    belongs to a decision whose horizon has passed (bind times read from the env itself)."""
    env = _env()
    env.reset()
    bound_at: dict[int, float] = {}
    done = False
    while not done:
        _, state, cand = env.pending
        _, _, done, _, info = env.step_placement(Placement(int(_pile(state, cand))), observe=False)
        if not done:
            bound_at[info["decision"]] = env._open[-1][3]
            now = env.sim.now
            assert all(now < d[3] + HORIZON for d in env._open)
            assert [d[0] for d in env._open] == sorted(d[0] for d in env._open)
            assert all(now >= bound_at[s] + HORIZON for s, _ in info["credits"])
    assert env._open == []


def test_stepping_without_observations_builds_only_the_features_asked_for_and_the_same_bits():
    """``step_placement(observe=False)`` leaves the next pod's features unbuilt until
    :attr:`decision` asks: the episode (bindings, credits) is the one an observing env steps,
    and the features asked for at any step are the bits the observing env built then."""
    eager, lazy = _env(seed=5), _env(seed=5)
    builds = 0
    real_build = lazy.features.build

    def counting_build(*args, **kwargs):
        nonlocal builds
        builds += 1
        return real_build(*args, **kwargs)

    lazy.features.build = counting_build  # type: ignore[method-assign]
    eager.reset()
    lazy.reset()  # reset's observation is the first pod's features
    step = 0
    done = False
    while not done:
        pod, state, cand, feats = eager.decision
        lpod, _, lcand = lazy.pending
        assert lpod.index == pod.index and np.array_equal(lcand, cand)
        if step % 7 == 0:  # now and then, as a collector asks for kept decisions only
            got = lazy.decision[3]
            for a, b in ((got.nodes, feats.nodes), (got.pod, feats.pod), (got.context, feats.context)):
                assert a.tobytes() == b.tobytes()
        node = int(_pile(state, cand))
        obs, _, done, _, info = eager.step_placement(Placement(node))
        lobs, _, ldone, _, linfo = lazy.step_placement(Placement(node), observe=False)
        assert obs is not None and lobs is None and done == ldone
        assert linfo["credits"] == info["credits"] and linfo["decision"] == info["decision"]
        step += 1
    assert step > 100 and builds == 1 + (step - 1) // 7  # reset's, then one per decision asked for


def test_credit_collection_keeps_what_it_kept_when_every_pod_had_its_features_built(monkeypatch):
    """The collector reads features only for decisions it keeps (none during warm-up) and for a
    policy behaviour: its decisions, choices, credits and ties are those of a collector that had
    every pod's features built (``pending`` forced to build them), warm-up and policy included."""
    from fedsched.agent.learning.credit import BEHAVIOURS, CreditConfig, collect_credited
    from fedsched.common.learning.nets import NodeScoringPolicy
    from fedsched.common.learning.scorers import PolicyScheduler
    from fedsched.common.schedulers import SchedulerContext
    from fedsched.common.sim.evaluate import make_policy

    def collect() -> list:
        env = _env(seed=9)
        ctx = SchedulerContext(train_pods=env.pool, rng=np.random.default_rng(4))
        torch.manual_seed(0)
        behaviours = [make_policy(b, ctx, "replay") for b in BEHAVIOURS]
        behaviours.append(PolicyScheduler(NodeScoringPolicy().eval(), env.typical, name="current"))
        cfg = CreditConfig(samples=150, explore=0.25, seed=2, warmup=120)
        return collect_credited([env], behaviours, cfg)

    lazy = collect()
    real_pending = SchedulingEnv.pending
    built_first = property(lambda env: (real_pending.fget(env), env._features())[0])
    monkeypatch.setattr(SchedulingEnv, "pending", built_first)
    eager = collect()
    assert len(lazy) == len(eager) == 150
    for a, b in zip(lazy, eager, strict=True):
        assert (a.chosen, a.credit, a.tie) == (b.chosen, b.credit, b.tie)
        for x, y in ((a.decision.nodes, b.decision.nodes), (a.decision.pod, b.decision.pod),
                     (a.decision.context, b.decision.context)):
            assert x.tobytes() == y.tobytes()
