"""Attempt (issue 24, item 1): counterfactual node credit, every candidate of a decision credited
under the same future.

The shipped online policy (``common/data/policies/online.pt``, ``scripts/train_online_policy.sh``)
regresses each logged decision's *chosen* node's cost over the next 30 minutes; the other
candidates' logits are left to generalisation, and each decision's future is its own (what the
other pods, the usage noise and the later decisions did), so two decisions' credits differ by far
more than by their nodes. Here each sampled decision is credited for ``candidates`` of its nodes
at once, with the simulator as the model:

- the replay simulator is forked at the decision (:func:`fork`: an independent copy whose random
  generators are copied too, so every fork draws the same usage noise, failures and tie-breaks:
  common random numbers);
- the *factual* fork places the pod where the exploring behaviour put it and runs ``horizon``
  seconds on with kube-default placing the later pods; each other candidate's fork places the pod
  there and puts every later pod where the factual fork put it, while it still fits (kube-default
  otherwise): the other decisions are held fixed, so a candidate's cost differs from the factual
  one by what this decision changes;
- each candidate's credit is the env's node credit (``RewardConfig.node_*``: its hot CPU
  minutes, throttled core-minutes and the pod's OOM kills over the horizon) measured in its own
  fork.

The credited decisions (``candidates`` records per decision, sharing its features) are fitted
exactly as the shipped recipe fits its own (``fedsched.agent.learning.online.train`` with the
shipped recipe's settings and ``--kube-weight 2``), from the same training clusters and
behaviours; only the credit differs. The result is judged on the roll-out gate's validation
clusters (``fedsched evidence``, 60 paired seeds, never the benchmark's) against the shipped
policy's evidence (``evidence_kube_weight2.json``, the same seeds):

    python bench/results/attempts/counterfactual_credit.py --out runs/cf --decisions 20000 --workers 2
    fedsched evidence runs/cf/checkpoint.pt --jobs 2 --json runs/cf/evidence.json
    python bench/results/attempts/compare_evidence.py bench/results/attempts/evidence_kube_weight2.json \\
        runs/cf/evidence.json

Run from the project root with the project's environment active.
"""

from __future__ import annotations

import argparse
import copy
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsched.agent.learning.credit import BEHAVIOURS, CreditConfig, Credited
from fedsched.agent.learning.env import RewardConfig, SchedulingEnv
from fedsched.agent.learning.online import (
    OnlineRecipe,
    _collection_key,
    build_envs,
    n_envs,
    reference_typical,
    train,
)
from fedsched.common.compute import worker_pool
from fedsched.common.learning.records import Decision
from fedsched.common.schedulers import SchedulerContext
from fedsched.common.schedulers.base import Placement, place
from fedsched.common.schedulers.kube_default import KubeDefault
from fedsched.common.sim.evaluate import make_policy
from fedsched.common.sim.replay.simulator import ReplaySimulator


@dataclass
class Args:
    out: Path = Path("runs/cf")
    """where the credited decisions, the checkpoint and the summary go"""
    decisions: int = 20_000
    """sampled decisions (each gives ``candidates`` credited records)"""
    candidates: int = 4
    """nodes credited per decision: the behaviour's pick, kube-default's and random others"""
    horizon: float = 1800.0
    """simulated seconds each fork runs after the decision (the shipped credit's horizon)"""
    sample_prob: float = 0.5
    """share of the decisions that are credited (the rest are only stepped)"""
    workers: int = 2
    """collection processes"""
    seed: int = 1
    """the training clusters' seed (the shipped recipe's: 1) and the behaviours'"""
    scale: str = "small"
    """the clusters' sizes (``online.profile_parameters``): small (the shipped recipe's) or realistic"""
    warmup: int = 0
    """decisions at the start of each episode that are stepped but never credited"""
    fit: int = 1
    """1: fit and write the checkpoint after the collection; 0: collect only"""
    time_budget_s: float = 0.0
    """> 0: each collection process stops after this many seconds with what it has"""


def shipped_recipe(samples: int, workers: int, seed: int, scale: str = "small") -> OnlineRecipe:
    """``scripts/train_online_policy.sh``'s recipe (small clusters, fixed credit weights, 10
    epochs, tie weight 0.3, plain minibatches, kube weight 2), with ``samples`` records."""
    return OnlineRecipe(
        clusters_per_profile=4, target_loads=(0.85, 0.95, 1.0), seed=seed, scale=scale,
        credit_weights="fixed", workers=workers, kube_weight=2.0, validate=False,
        credit=CreditConfig(samples=samples, epochs=10, size_buckets=False),
        reward=RewardConfig(node_horizon_s=1800.0))


def fork(sim: ReplaySimulator) -> ReplaySimulator:
    """An independent copy of ``sim`` as it stands (its generators included); the trace, the node
    table and the cached pods, which no step writes, are shared."""
    memo: dict[int, object] = {id(x): x for x in (sim.nodes, sim.pods, sim.typical, sim.workload,
                                                  sim._arr_t, sim._arr_p, sim.progress)}
    for pod in sim._pod_cache:
        if pod is not None:
            memo[id(pod)] = pod
    return copy.deepcopy(sim, memo)


def node_cost(sim: ReplaySimulator, node: int, pod: int, start: tuple[float, float, int],
              w: RewardConfig) -> float:
    lm = sim.load_metrics
    return (w.node_hot * (float(lm.node_hot_s[node]) - start[0]) / 60.0
            + w.node_throttled * (float(lm.node_throttled[node]) - start[1]) / 60.0
            + w.node_oom * (sim.oom_kills_of(pod) - start[2]))


def run_on(sim: ReplaySimulator, pod, node: int, horizon: float, kube: KubeDefault,
           factual: dict[int, Placement] | None) -> tuple[ReplaySimulator, dict[int, Placement], tuple]:
    """Place ``pod`` on ``node`` in ``sim`` (a fork) and run ``horizon`` seconds on: later pods go
    where ``factual`` put them while they fit, else where kube-default puts them. Returns the fork,
    the placements it made and the node's figures at the decision."""
    lm = sim.load_metrics
    start = (float(lm.node_hot_s[node]), float(lm.node_throttled[node]), sim.oom_kills_of(pod.index))
    state = sim.state
    sim.bind(Placement(node, kube.select_gpus(state, pod, node)))
    end = sim.now + horizon
    made: dict[int, Placement] = {}
    while (d := sim.next_pod()) is not None:
        p, st = d
        if sim.now >= end:  # the pod is left pending: the fork is dropped
            break
        pl = factual.get(p.index) if factual is not None else None
        if pl is not None and st.feasible(p, np.array([pl.node]))[0]:
            pl = Placement(pl.node, kube.select_gpus(st, p, pl.node))
        else:
            pl = place(kube, st, p, sim.rng)
        sim.bind(pl)
        made[p.index] = pl
    return sim, made, start


def credit_decision(env: SchedulingEnv, pick: int, others: list[int], horizon: float,
                    kube: KubeDefault) -> list[tuple[int, float]]:
    """(candidate position, credit) for the behaviour's pick and ``others`` (positions in the
    pending decision's candidates), each measured in its own fork."""
    pod, _, cand = env.pending
    w = env.cfg.reward
    fsim, made, start = run_on(fork(env.sim), pod, int(cand[pick]), horizon, kube, None)
    out = [(pick, -node_cost(fsim, int(cand[pick]), pod.index, start, w))]
    for j in others:
        sim, _, s = run_on(fork(env.sim), pod, int(cand[j]), horizon, kube, made)
        out.append((j, -node_cost(sim, int(cand[j]), pod.index, s, w)))
    return out


def collect_share(args: Args, worker: int, indices: list[int], quota: int) -> list[Credited]:
    import torch

    torch.set_num_threads(1)
    recipe = shipped_recipe(0, args.workers, args.seed, args.scale)
    typical = reference_typical(recipe)
    envs, _ = build_envs(recipe, typical, recipe.reward, only=indices)
    behaviours = [make_policy(b, SchedulerContext(rng=np.random.default_rng(args.seed + worker)), "replay")
                  for b in BEHAVIOURS]
    rng = np.random.default_rng([args.seed, worker, 17])
    kube = KubeDefault()
    explore = recipe.credit.explore
    out: list[Credited] = []
    for env in envs:
        env.reset()
    steps = [0] * len(envs)
    t0, sampled = time.perf_counter(), 0
    while sampled < quota:
        for k, env in enumerate(envs):
            pod, state, cand = env.pending
            if rng.random() < explore:
                pick = int(rng.integers(len(cand)))
            else:
                sched = behaviours[int(rng.integers(len(behaviours)))]
                attach = getattr(sched, "attach_simulator", None)
                if attach is not None:
                    attach(env.sim)
                scores = np.asarray(sched.score(state, pod, cand), dtype=np.float64)
                best = np.flatnonzero(scores == scores.max())
                pick = int(best[rng.integers(len(best))])
            steps[k] += 1
            if steps[k] > args.warmup and len(cand) >= 2 and rng.random() < args.sample_prob:
                kd = np.asarray(kube.score(state, pod, cand), dtype=np.float64)
                pool = [int(np.argmax(kd))] if int(np.argmax(kd)) != pick else []
                rest = [j for j in rng.permutation(len(cand)).tolist() if j != pick and j not in pool]
                others = (pool + rest)[:args.candidates - 1]
                feats = env.decision[3]
                dec = Decision(feats.nodes.astype(np.float16), feats.pod, feats.context, np.array([pick]),
                               has_gpus=state.nodes.total_gpu_milli > 0)
                for j, credit in credit_decision(env, pick, others, args.horizon, kube):
                    out.append(Credited(dec, j, float(credit), float(kd[j]) / 100.0))
                sampled += 1
                if sampled % 500 == 0:
                    print(f"cf collect [worker {worker}]: {sampled}/{quota} decisions, "
                          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            node = int(cand[pick])
            _, _, term, trunc, _ = env.step_placement(Placement(node, kube.select_gpus(state, pod, node)),
                                                      observe=False)
            if term or trunc:
                env.reset()
                steps[k] = 0
            if sampled >= quota or (args.time_budget_s > 0 and time.perf_counter() - t0 > args.time_budget_s):
                return out
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f, default in vars(Args()).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(default), default=default)
    args = Args(**vars(ap.parse_args(argv)))
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    recipe0 = shipped_recipe(0, args.workers, args.seed, args.scale)
    n = n_envs(recipe0)
    shares = [list(range(w, n, args.workers)) for w in range(args.workers)]
    per, extra = divmod(args.decisions, args.workers)
    quotas = [per + (w < extra) for w in range(args.workers)]
    data_path = args.out / "credited.pkl"
    if data_path.exists():
        data = pickle.loads(data_path.read_bytes())["data"]
        print(f"cf: {len(data)} records read from {data_path}", file=sys.stderr)
    else:
        from multiprocessing import get_context

        with worker_pool(args.workers, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(collect_share, args, w, shares[w], quotas[w]) for w in range(args.workers)]
            data = [c for f in futures for c in f.result()]
        print(f"cf: {len(data)} records from {len({id(c.decision) for c in data})} decisions in "
              f"{time.time() - t0:.0f} s",
              file=sys.stderr, flush=True)
    recipe = shipped_recipe(len(data), args.workers, args.seed, args.scale)
    data_path.write_bytes(pickle.dumps({"collection": _collection_key(recipe), "data": data}, protocol=5))
    credits = np.array([c.credit for c in data])
    by_decision: dict[int, list[float]] = {}
    for c in data:
        by_decision.setdefault(id(c.decision), []).append(c.credit)
    spread = np.array([max(v) - min(v) for v in by_decision.values()])
    print(f"cf: {np.mean(credits < 0):.1%} of records with a cost; decisions whose candidates' credits "
          f"differ: {np.mean(spread > 0):.1%}", file=sys.stderr, flush=True)
    if not args.fit:
        return 0
    summary = train(recipe, args.out, log=lambda m: print(m, file=sys.stderr, flush=True),
                    data_path=data_path)
    print(f"cf: done in {time.time() - t0:.0f} s; checkpoint {summary['checkpoint']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
