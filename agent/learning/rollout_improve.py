"""Rollout-based policy improvement (approximate policy iteration) for packing mode.

Read top to bottom, as CleanRL's single files: the hyper-parameters (:class:`Args`, a line
under each field), the look-ahead (:func:`rollout_value`, :func:`improve_decision`), one
iteration's data (:func:`collect_improved`), the loop (:func:`train`) and the CLI
(:func:`main`).

One **iteration**: walk packing episodes under the current policy (greedy); at sampled
decision points, for each of the policy's ``top_k`` candidate nodes (plus, optionally, a
``teacher`` scheduler's choice) copy the environment (:meth:`SchedulingEnv.clone`), place the
pod there, let the *current policy* decide the next ``horizon`` arrivals and score the
outcome with the environment's packing return over them (allocation gained, failed requests
and fragmentation removed: :class:`~fedsched.agent.learning.env.RewardConfig`). The same
``futures`` are used for every candidate (common random numbers: the run's own next arrivals,
or pods drawn from the training pool as the packing workload's tail draws them), so the
comparison sees the decision and not the luck of the draw. The candidates within ``tie_tol``
of the best form the decision's target set, and the policy is distilled onto the aggregated
targets of all iterations so far with behaviour cloning's loss
(:func:`fedsched.agent.learning.bc.fit`, ``-log sum_{a in best} pi(a|s)``). With an exact
look-ahead this is policy iteration: the one-step look-ahead policy is at least as good as the
policy it rolls out.

Logged per iteration (``progress.csv`` and a CleanRL-style line): the **improvement rate**
(share of sampled decisions where the look-ahead found a node strictly better than the
policy's argmax), the mean look-ahead gain over the argmax, the distillation loss and target
agreement, and the held-out allocation (greedy policy, *validation* pods of the hash split,
fixed seeds, on a separate cluster slice). ``best.pt`` keeps the best held-out policy,
``checkpoint.pt`` the last, ``summary.json`` the run.

    python -m fedsched.agent.learning.rollout_improve --out runs/rollout-improve/x \\
        --init common/data/policies/default.pt --iterations 4 --time-budget-s 2400

May import: numpy, torch, fedsched.common.* and the other fedsched.agent.learning modules
(env, bc); nothing from serving, federation or the coordinator.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsched.agent.learning.bc import BCConfig, collect, fit
from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
from fedsched.common.learning.checkpoint import data_hash, load_checkpoint, save_checkpoint
from fedsched.common.learning.features import FeatureBuilder
from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig
from fedsched.common.learning.records import Decision
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.metrics import mean_ci95
from fedsched.common.model.traces import (
    builtin_trace,
    fits_somewhere,
    load_nodes,
    load_pods,
    slice_cluster,
    split_train_val_test,
)
from fedsched.common.schedulers import Scheduler, SchedulerContext, make_scheduler
from fedsched.common.sim.evaluate import scheduler_context
from fedsched.common.sim.packing import run_packing


@dataclass
class Args:
    """Hyper-parameters of a run (``main`` has a ``--flag`` for each field)."""

    out: str = "runs/rollout-improve/run"
    """run directory: progress.csv, best.pt, checkpoint.pt, summary.json"""
    workload: str = "default"
    """openb pod list variant (openb_pod_list_<workload>.csv) on the openb GPU cluster"""
    init: str | None = None
    """start from this checkpoint (e.g. common/data/policies/default.pt); None: behaviour cloning
    of bc_teacher"""
    bc_teacher: str = "kube-default"
    """without init: the scheduler whose behaviour cloning is the starting policy"""
    bc_samples: int = 3000
    """without init: teacher decisions logged for the starting policy"""
    bc_epochs: int = 8
    """without init: behaviour-cloning passes over the teacher log"""
    slice_nodes: int = 50
    """nodes per training cluster slice (0: the whole cluster)"""
    num_clusters: int = 4
    """training slices (different seeds), visited round robin"""
    target_load: float = 1.3
    """packing: arrived requests as a multiple of capacity"""
    top_k: int = 4
    """candidates per decision: the policy's top_k nodes by logit"""
    teacher: str | None = None
    """also try this scheduler's choice as a candidate (e.g. fgd); None: the policy's only"""
    horizon: int = 200
    """arrivals the current policy decides after the candidate placement (0: to the episode's end)"""
    futures: int = 1
    """futures per candidate (shared by all candidates): 1 uses the run's own next arrivals, more
    draws pods from the training pool with replacement"""
    frag_weight: float = 0.5
    """weight of the fragmentation-removed term in the look-ahead return (the env's frag_removed)"""
    tie_tol: float = 1e-6
    """candidates within this of the best look-ahead return are all targets (in % of capacity)"""
    margin: float = 0.0
    """the argmax stays the target unless a candidate beats it by more than this (% of capacity):
    smaller look-ahead gains are treated as rollout noise; every candidate at least as good as
    the argmax is then a target"""
    min_arrived_pct: float = 0.0
    """sample decision points only once arrived requests passed this % of capacity"""
    sample_prob: float = 0.1
    """probability that a decision (past min_arrived_pct) is a look-ahead point"""
    decisions_per_iter: int = 200
    """look-ahead decision points per iteration"""
    iterations: int = 4
    """improvement iterations (collect, then distil)"""
    aggregate: bool = True
    """distil onto the targets of every iteration so far (DAgger-style), not just the newest"""
    distill_epochs: int = 4
    """behaviour-cloning passes over the aggregated targets per iteration"""
    learning_rate: float = 3e-4
    """Adam step size of the distillation"""
    batch_size: int = 64
    """decisions per distillation minibatch"""
    val_nodes: int = 50
    """nodes of the held-out validation slice (0: the whole cluster)"""
    val_seeds: int = 3
    """workload seeds of the held-out validation runs"""
    val_slice_seed: int = 2024
    """seed of the validation slice (different from every training slice's)"""
    seed: int = 1
    """seeds torch, numpy, the slices and the episodes"""
    time_budget_s: float | None = None
    """stop after the iteration that passes this wall time (None: no limit)"""


# ---- the look-ahead ------------------------------------------------------------------------------

def greedy_node(policy: NodeScoringPolicy, env: SchedulingEnv) -> tuple[int, np.ndarray]:
    """(the policy's argmax node id, its logits over the feasible candidates) for the pending pod."""
    _, _, cand, f = env.decision
    logits = policy.score_numpy(f.nodes, f.pod, f.context)
    return int(cand[int(np.argmax(logits))]), logits


def rollout_value(env: SchedulingEnv, node: int, policy: NodeScoringPolicy, horizon: int,
                  future: np.ndarray | None = None, features: FeatureBuilder | None = None) -> float:
    """The packing return of placing the pending pod on ``node``, then letting ``policy`` decide
    the next ``horizon`` arrivals (0: all), on a copy of ``env`` (``env`` is left untouched)."""
    sim = env.clone(future=future, features=features)
    stop = sim.sim.k + (horizon if horizon > 0 else len(sim.sim) + 1)
    _, total, done, _, _ = sim.step(node)
    while not done and sim.sim.k < stop:
        a, _ = greedy_node(policy, sim)
        _, r, done, _, _ = sim.step(a)
        total += r
    return float(total)


def improve_decision(env: SchedulingEnv, policy: NodeScoringPolicy, args: Args, rng: np.random.Generator,
                     teacher: Scheduler | None = None,
                     features: FeatureBuilder | None = None) -> tuple[Decision, dict[str, float]]:
    """The look-ahead target of the pending decision and its statistics.

    Returns the decision (features of every feasible node, the target set: candidates within
    ``tie_tol`` of the best mean return, or when none beats the argmax by more than ``margin``,
    every candidate at least as good as the argmax) and ``{"improved": 1 if the argmax is not in it, "gain":
    best minus the argmax's return, "candidates": how many were rolled out}``.
    """
    pod, state, cand, f = env.decision
    argmax, logits = greedy_node(policy, env)
    # Nodes with identical features are the same action (e.g. empty nodes of one shape): roll out
    # one representative per class, the top_k classes by logit.
    _, first, klass = np.unique(f.nodes, axis=0, return_index=True, return_inverse=True)
    klass = klass.reshape(-1)
    reps = first[np.argsort(-logits[first], kind="stable")]
    rows = [int(i) for i in reps[: args.top_k]]
    arg_row = int(np.flatnonzero(cand == argmax)[0])
    if teacher is not None:
        scores = np.asarray(teacher.score(state, pod, cand), dtype=np.float64)
        t = int(first[klass[int(np.argmax(scores))]])
        if t not in rows:
            rows.append(t)
    if len(rows) == 1:
        values = np.zeros(1)
    else:
        sim = env.sim
        remaining = len(sim) - sim.k - 1
        if args.futures <= 1:
            futures: list[np.ndarray | None] = [None]
        else:
            futures = [rng.integers(len(env.pool), size=remaining) for _ in range(args.futures)]
        values = np.array([np.mean([rollout_value(env, int(cand[i]), policy, args.horizon, fut, features)
                                    for fut in futures]) for i in rows])
    best = float(values.max())
    arg_value = float(values[[klass[i] for i in rows].index(klass[arg_row])])
    floor = best - args.tie_tol if best - arg_value > args.margin else arg_value - args.tie_tol
    good = [klass[i] for i, v in zip(rows, values, strict=True) if v >= floor]
    target = np.flatnonzero(np.isin(klass, good)).astype(np.int64)  # every node of a target class
    d = Decision(f.nodes.astype(np.float16), f.pod, f.context, target,
                 has_gpus=state.nodes.total_gpu_milli > 0)
    return d, {"improved": float(arg_row not in target), "gain": best - arg_value,
               "candidates": float(len(rows))}


def collect_improved(envs: list[SchedulingEnv], policy: NodeScoringPolicy, args: Args,
                     rng: np.random.Generator, teacher: Scheduler | None = None,
                     features: FeatureBuilder | None = None) -> tuple[list[Decision], dict[str, float]]:
    """Walk ``envs`` (round robin, one decision each in turn) under the greedy policy and take
    ``decisions_per_iter`` look-ahead targets at sampled decision points."""
    out: list[Decision] = []
    stats: list[dict[str, float]] = []
    walked = 0
    while len(out) < args.decisions_per_iter:
        for env in envs:
            if env.sim.arrived_pct >= args.min_arrived_pct and rng.random() < args.sample_prob:
                d, s = improve_decision(env, policy, args, rng, teacher, features)
                out.append(d)
                stats.append(s)
            node, _ = greedy_node(policy, env)
            _, _, done, _, _ = env.step(node)
            walked += 1
            if done:
                env.reset()
            if len(out) >= args.decisions_per_iter:
                break
    agg = {k: float(np.mean([s[k] for s in stats])) for k in ("improved", "gain", "candidates")}
    agg["walked"] = float(walked)
    return out, agg


# ---- evaluation ----------------------------------------------------------------------------------

def evaluate_policy(policy: NodeScoringPolicy, nodes: NodeTable, pods: PodTable, typical: TypicalPods,
                    seeds: list[int], target_load: float = 1.3) -> list[float]:
    """Final GPU allocation % (``alloc_gpu``) of the greedy policy, one packing run per seed."""
    sched = PolicyScheduler(policy, typical)
    return [float(run_packing(nodes, pods, sched, target_load=target_load, seed=s, typical=typical)
                  .metrics["alloc_gpu"]) for s in seeds]


def evaluate_baseline(name: str, nodes: NodeTable, pods: PodTable, train: PodTable, typical: TypicalPods,
                      seeds: list[int], target_load: float = 1.3) -> list[float]:
    """:func:`evaluate_policy` for a registered baseline (statistics from ``train``)."""
    out = []
    for s in seeds:
        scheduler = make_scheduler(name, scheduler_context(train, s))
        out.append(float(run_packing(nodes, pods, scheduler, target_load=target_load,
                                     seed=s, typical=typical).metrics["alloc_gpu"]))
    return out


# ---- the loop ------------------------------------------------------------------------------------

@dataclass
class Problem:
    """What a run trains and validates on."""

    train_nodes: list[NodeTable]
    """the training clusters (slices)"""
    train_pods: PodTable
    """the train part of the hash split (episodes draw from it; typical pods come from it)"""
    val_nodes: NodeTable
    """the held-out validation cluster"""
    val_pods: PodTable
    """the validation part of the hash split"""


def openb_problem(args: Args) -> Problem:
    """The openb GPU cluster and pod list ``args.workload``, split train / validation / test by the
    stable hash (the test part, what the benchmarks judge on, is never touched)."""
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    pods = load_pods(builtin_trace(f"openb_pod_list_{args.workload}.csv"), nodes, allow_oversized=True)
    train, val, _ = split_train_val_test(pods)
    slices = [slice_cluster(nodes, args.slice_nodes, args.seed * 1000 + i) for i in range(args.num_clusters)]
    val_nodes = slice_cluster(nodes, args.val_nodes, args.val_slice_seed)
    return Problem(slices, train, val_nodes, fits_somewhere(val, val_nodes))


def make_envs(problem: Problem, typical: TypicalPods, args: Args) -> list[SchedulingEnv]:
    envs = []
    for i, n in enumerate(problem.train_nodes):
        env = SchedulingEnv(n, fits_somewhere(problem.train_pods, n), typical=typical,
                            config=EnvConfig(mode="packing", target_load=args.target_load))
        env.cfg.reward.frag_removed = args.frag_weight
        env.reset(seed=args.seed * 7919 + 101 * i)  # seeds the episodes and env.np_random (BC tie-breaks)
        envs.append(env)
    return envs


def start_policy(args: Args, envs: list[SchedulingEnv], train: PodTable) -> NodeScoringPolicy:
    """The policy to improve: the ``init`` checkpoint, or behaviour cloning of ``bc_teacher``."""
    if args.init:
        policy, _, _ = load_checkpoint(args.init)
        if not isinstance(policy, NodeScoringPolicy):
            raise ValueError(f"{args.init}: not a node-scoring policy")
        return policy
    torch.manual_seed(args.seed)
    policy = NodeScoringPolicy(PolicyConfig())
    teacher = make_scheduler(args.bc_teacher, SchedulerContext(train_pods=train,
                                                               rng=np.random.default_rng(args.seed)))
    log = collect(envs, teacher, args.bc_samples)
    fit(policy, log, BCConfig(samples=args.bc_samples, epochs=args.bc_epochs, seed=args.seed))
    return policy


def train(args: Args, problem: Problem | None = None, verbose: bool = True) -> dict[str, Any]:
    """Run ``args.iterations`` improvement iterations; returns the summary (also written to
    ``out/summary.json`` when ``out`` is set)."""
    t_start = time.time()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    problem = problem or openb_problem(args)
    typical = TypicalPods.from_pods(problem.train_pods)
    envs = make_envs(problem, typical, args)
    policy = start_policy(args, envs, problem.train_pods)
    for env in envs:
        env.reset()
    teacher = None
    if args.teacher:
        teacher = make_scheduler(args.teacher, SchedulerContext(train_pods=problem.train_pods,
                                                                rng=np.random.default_rng(args.seed)))
    features = FeatureBuilder(typical)  # the rollouts' own: the envs' fragmentation caches stay warm
    val_seeds = [10_000 + args.seed * 100 + i for i in range(args.val_seeds)]

    def validate() -> float:
        return float(np.mean(evaluate_policy(policy, problem.val_nodes, problem.val_pods, typical, val_seeds,
                                             args.target_load)))

    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    meta = {"algorithm": "rollout-improve", "hyperparameters": asdict(args), "typical": typical,
            "data": data_hash(problem.train_pods)}
    # kube-default and the teacher on the same validation runs: what the roll-out gate of
    # ``fedsched serve`` compares the policy with (``reference``, as ``fedsched train`` records it)
    reference = {name: float(np.mean(evaluate_baseline(name, problem.val_nodes, problem.val_pods,
                                                       problem.train_pods, typical, val_seeds,
                                                       args.target_load)))
                 for name in ("kube-default", *([args.teacher] if args.teacher else []))}

    def gate_meta(it: int, val: float) -> dict[str, Any]:
        return {"iteration": it, "val_alloc_gpu": val, "eval_metric": "alloc_gpu",
                "best_eval": {"value": val, "update": it}, "reference": reference, "trained_on_gpus": True}

    start_val = validate()
    best = {"value": start_val, "iteration": 0}
    rows: list[dict[str, Any]] = [{"iteration": 0, "val_alloc_gpu": start_val,
                                   "seconds": time.time() - t_start}]
    if verbose:
        print(f"iteration=0 val_alloc_gpu={start_val:.3f}", flush=True)
    if out is not None:
        save_checkpoint(out / "best.pt", policy, extra=gate_meta(0, start_val), **meta)
    data: list[Decision] = []
    for it in range(1, args.iterations + 1):
        t0 = time.time()
        new, stats = collect_improved(envs, policy, args, rng, teacher, features)
        data = data + new if args.aggregate else new
        t1 = time.time()
        fitted = fit(policy, data, BCConfig(samples=len(data), epochs=args.distill_epochs,
                                            batch_size=args.batch_size, learning_rate=args.learning_rate,
                                            seed=args.seed + it))
        val = validate()
        row = {"iteration": it, "decisions": len(data), "improvement_rate": stats["improved"],
               "lookahead_gain": stats["gain"], "candidates": stats["candidates"], "walked": stats["walked"],
               "distill_loss": fitted["loss"], "target_agreement": fitted["teacher_agreement"],
               "val_alloc_gpu": val, "collect_s": t1 - t0, "seconds": time.time() - t_start}
        rows.append(row)
        if verbose:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
        extra = gate_meta(it, val)
        if val > best["value"]:
            best = {"value": val, "iteration": it}
            if out is not None:
                save_checkpoint(out / "best.pt", policy, extra=extra, **meta)
        if out is not None:
            save_checkpoint(out / "checkpoint.pt", policy, extra=extra, **meta)
            _write_progress(out / "progress.csv", rows)
        if args.time_budget_s is not None and time.time() - t_start > args.time_budget_s:
            break
    summary = {"args": asdict(args), "start_val_alloc_gpu": start_val, "best": best, "reference": reference,
               "final_val_alloc_gpu": rows[-1]["val_alloc_gpu"], "iterations": rows,
               "val_seeds": val_seeds, "seconds": time.time() - t_start, "policy": policy}
    if out is not None:
        (out / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "policy"},
                                                     indent=2))
    return summary


def _write_progress(path: Path, rows: list[dict[str, Any]]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def summarise(values: list[float]) -> dict[str, float]:
    """Mean and 95% interval half-width (Student t) of per-seed values."""
    m, ci = mean_ci95(values)
    return {"mean": m, "ci95": ci, "n": len(values)}


# ---- CLI -----------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> Args:
    """``Args`` from ``--flag`` per field (``fedsched.common.dataclass_flags``: the field docs
    are the help, booleans are ``--aggregate`` / ``--no-aggregate``)."""
    from fedsched.common.dataclass_flags import add_dataclass_flags, build

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_dataclass_flags(ap, Args)
    return build(Args, ap.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)
    args = parse_args(argv)
    summary = train(args)
    print(f"start {summary['start_val_alloc_gpu']:.3f} -> best {summary['best']['value']:.3f} "
          f"(iteration {summary['best']['iteration']}), {summary['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
