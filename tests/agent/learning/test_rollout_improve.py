"""Rollout-based policy improvement (agent/learning/rollout_improve.py) and the clone helpers
it rolls out on (PackingSimulator.clone, SchedulingEnv.clone)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
from fedsched.agent.learning.rollout_improve import (
    Args,
    Problem,
    greedy_node,
    improve_decision,
    parse_args,
    rollout_value,
    train,
)
from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig
from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.schedulers import SchedulerContext, make_scheduler
from fedsched.common.sim.packing import PackingSimulator, run_packing


def gpu_cluster(n_nodes: int = 12, n_pods: int = 400, seed: int = 0) -> tuple[NodeTable, PodTable]:
    """8-GPU nodes; half the pods share a GPU, the rest take 1, 4 or 8 whole GPUs. Spreading
    (kube-default) strands the 8-GPU pods, packing (best-fit) places everything."""
    rng = np.random.default_rng(seed)
    nodes = NodeTable(names=tuple(f"n{i}" for i in range(n_nodes)), cpu=np.full(n_nodes, 64000),
                      mem=np.full(n_nodes, 262144), gpu=np.full(n_nodes, 8),
                      model=np.zeros(n_nodes, dtype=np.int64), models=("A100",),
                      disk_io=np.full(n_nodes, 1000.0), net=np.full(n_nodes, 10000.0))
    kind = rng.choice(4, n_pods, p=[0.5, 0.3, 0.1, 0.1])
    cpu = np.array([4000, 8000, 16000, 32000])[kind]
    pods = PodTable(names=tuple(f"p{seed}-{i}" for i in range(n_pods)), cpu=cpu, mem=cpu * 4 // 1000 * 1024,
                    num_gpu=np.array([1, 1, 4, 8])[kind], gpu_milli=np.array([500, 1000, 1000, 1000])[kind],
                    spec_mask=np.zeros(n_pods, dtype=np.int64), qos=np.ones(n_pods, dtype=np.int64),
                    creation=np.full(n_pods, np.nan), deletion=np.full(n_pods, np.nan))
    return nodes, pods


def _env(seed: int = 3, steps: int = 20) -> SchedulingEnv:
    nodes, pods = gpu_cluster()
    env = SchedulingEnv(nodes, pods, config=EnvConfig(mode="packing"))
    env.reset(seed=seed)
    kd = make_scheduler("kube-default", SchedulerContext(train_pods=pods))
    for _ in range(steps):
        pod, state, cand, _ = env.decision
        env.step(int(cand[int(np.argmax(kd.score(state, pod, cand)))]))
    return env


def _fingerprint(env: SchedulingEnv) -> tuple:
    sim, st = env.sim, env.sim.state
    return (sim.k, sim.allocated_pct, sim.arrived_pct, round(sim.frag.total, 9), st.cpu_req.tobytes(),
            st.gpu_free.tobytes(), st.version.tobytes(), sim.placements[: sim.k].tobytes(), len(sim.gpus),
            tuple(env.action_masks()), env.decision[0].index, str(sim.rng.bit_generator.state),
            str(env.np_random.bit_generator.state), env.episode_return)


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    """Equal metric dicts (NaN equals NaN)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


def _first_feasible(env: SchedulingEnv) -> int:
    return int(env.decision[2][0])


@pytest.mark.parametrize("future", [False, True])
@pytest.mark.parametrize("steps", [1, 15, 1000])  # one step, some, to the end of the episode
def test_env_clone_leaves_the_original_untouched(future: bool, steps: int) -> None:
    env = _env()
    before = _fingerprint(env)
    fut = np.random.default_rng(0).integers(len(env.pool), size=60) if future else None
    clone = env.clone(future=fut)
    for _ in range(steps):
        _, _, done, _, _ = clone.step(_first_feasible(clone))
        if done:
            break
    assert _fingerprint(env) == before
    assert clone.sim.k > env.sim.k


def test_env_clone_without_future_replays_the_same_episode() -> None:
    env = _env()
    clone = env.clone()
    assert _fingerprint(clone)[:-3] == _fingerprint(env)[:-3]
    for _ in range(1000):
        a, b = env.step(_first_feasible(env)), clone.step(_first_feasible(clone))
        assert a[1] == b[1] and a[2] == b[2]
        if a[2]:
            break
    assert _same(env.final_metrics(), clone.final_metrics())


def test_env_clone_with_a_future_uses_it() -> None:
    env = _env()
    fut = np.full(30, 7, dtype=np.int64)  # pod 7 thirty times
    clone = env.clone(future=fut)
    assert len(clone.sim) == env.sim.k + 1 + 30
    clone.step(_first_feasible(clone))
    assert clone.decision[0].index == 7


@pytest.mark.parametrize("pending", [False, True])
def test_simulator_clone_is_independent(pending: bool) -> None:
    nodes, pods = gpu_cluster()
    sched = make_scheduler("best-fit", SchedulerContext(train_pods=pods))
    typical = TypicalPods.from_pods(pods)
    sim = PackingSimulator(nodes, pods, target_load=1.3, seed=5, typical=typical)
    from fedsched.common.schedulers import place

    for _ in range(10):
        pod, state = sim.next_pod()
        sim.bind(place(sched, state, pod, sim.rng, node_rank=sim.node_rank))
    if pending:
        sim.next_pod()
    copy = sim.clone()
    while (item := copy.next_pod()) is not None:
        copy.bind(place(sched, item[1], item[0], copy.rng, node_rank=copy.node_rank))
    assert sim.k == 10 and copy.done
    # Finishing the original gives exactly the uninterrupted run.
    while (item := sim.next_pod()) is not None:
        sim.bind(place(sched, item[1], item[0], sim.rng, node_rank=sim.node_rank))
    ref = run_packing(nodes, pods, sched, target_load=1.3, seed=5, typical=typical)
    assert _same(sim.result().metrics, ref.metrics) and _same(copy.result().metrics, ref.metrics)


def test_rollout_value_and_improve_decision_leave_env_untouched() -> None:
    env = _env()
    torch.manual_seed(0)
    policy = NodeScoringPolicy(PolicyConfig())
    before = _fingerprint(env)
    node, _ = greedy_node(policy, env)
    v = rollout_value(env, node, policy, horizon=30)
    assert np.isfinite(v)
    d, stats = improve_decision(env, policy, Args(top_k=3, horizon=30), np.random.default_rng(0))
    assert _fingerprint(env) == before
    assert len(d.best) >= 1 and len(d.nodes) == len(env.decision[2])
    assert stats["improved"] in (0.0, 1.0) and stats["gain"] >= 0.0


def test_cli_flags_map_to_args() -> None:
    a = parse_args(["--top-k", "5", "--teacher", "fgd", "--no-aggregate", "--time-budget-s", "60"])
    assert (a.top_k, a.teacher, a.aggregate, a.time_budget_s) == (5, "fgd", False, 60.0)


def test_rollout_improvement_beats_its_bc_start() -> None:
    """The Done-means test: on a small packing problem, RL (rollout improvement) ends strictly
    better than the behaviour cloning of a weak heuristic (kube-default) it started from, on
    held-out pods and seeds, by more than seed noise.

    Measured gains (validation allocation, 10 seeds, after 3 iterations) for seeds 1, 2, 3:
    +12.8, +4.6, +13.3 pp; the BC starts themselves range 72.8-78.3 over those seeds.
    """
    torch.set_num_threads(1)
    nodes, train_pods = gpu_cluster(seed=0)
    _, val_pods = gpu_cluster(seed=1)  # held out: another draw of pods
    args = Args(out="", bc_teacher="kube-default", bc_samples=800, bc_epochs=6, top_k=3, horizon=30,
                decisions_per_iter=200, sample_prob=0.5, iterations=3, distill_epochs=6, learning_rate=1e-3,
                val_seeds=10, seed=1)
    s = train(args, Problem([nodes, nodes], train_pods, nodes, val_pods), verbose=False)
    start, end = s["start_val_alloc_gpu"], s["final_val_alloc_gpu"]
    assert end >= start + 3.0, (start, end)
    assert all(r["improvement_rate"] > 0 for r in s["iterations"][1:])
