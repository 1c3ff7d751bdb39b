"""The online (replay-mode) node-scoring policy: distillation of a privileged teacher on
several member profiles, then optional PPO fine-tuning.

Why a privileged teacher. What separates a good online placement from a bad one is the use a
pod *will* have, which requests do not say (calibrated use is about half the request, with a
wide spread per application). The replay oracle (``fedsched.common.sim.replay.oracle``) reads
every pod's true mean use; the policy cannot, but it sees what a real cluster shows: the
windowed mean, peak and spread of each node's measured use, the headroom left after the pod's
*expected* use (its application's observed use per request where siblings run) and the pods on
the node (``FEATURE_SCHEMA_VERSION`` 2). Behaviour cloning of the oracle on those features
("learning by cheating", Chen et al., CoRL 2019) teaches the policy to predict from
observations what the oracle knows; RL (``fedsched train --algo ppo --init``) can then start
from it.

Training data, never the benchmark's: the synthetic member profiles (``web``, ``gpu``,
``edge``) with generator parameters drawn per cluster from broad ranges
(:func:`profile_parameters`: node count, pod sizes, daily cycle, GPU mix) and seeds ``1000 *
seed + i`` (``bench/online_quality.py`` uses fixed parameter points and seed 7), and openb
node slices of 40-100 nodes (slice seeds ``1000 * seed + i``), each replayed on the *train*
part of its pods (the hash split every evaluation shares:
``bench/online_quality.py`` replays the test part), at requested loads drawn from
``target_loads`` per environment, so the policy sees light and heavy clusters.

    python -m fedsched.agent.learning.online --out runs/online-policy [--samples N] ...

writes ``checkpoint.pt`` (with the recipe, the teacher's agreement and the held-out validation
figures in its metadata) and ``summary.json``. Validation: each profile's *validation* pods on
a cluster of a seed not used for training, the policy beside kube-default and the oracle,
online metrics (hot CPU node-seconds, throttled CPU, OOM kills per 1,000 starts).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.agent.learning.bc import BCConfig, collect, fit
from fedsched.agent.learning.credit import BEHAVIOURS, CreditConfig, collect_credited, fit_credit
from fedsched.agent.learning.env import EnvConfig, RewardConfig, SchedulingEnv
from fedsched.agent.learning.ppo import PPOConfig, PPOTrainer
from fedsched.common.learning.checkpoint import data_hash, load_checkpoint, save_checkpoint
from fedsched.common.learning.kinds import NODE_SCORING, kind_of
from fedsched.common.learning.scorers import scorer_for
from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.metrics import TROUBLE_SMOOTHING, trouble_score
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.model.traces import (
    builtin_trace,
    fits_somewhere,
    load_nodes,
    load_pods,
    slice_cluster,
    split_train_val_test,
)
from fedsched.common.schedulers import SchedulerContext
from fedsched.common.sim.evaluate import make_policy
from fedsched.common.sim.replay import ReplayConfig, run_replay
from fedsched.common.sim.replay.oracle import ORACLE

PROFILES = ("web", "gpu", "edge", "openb")
OPENB_REPLAY = {"start_quantile": 0.01, "time_compression": 10.0, "max_pods": 1200}
VALIDATION_METRICS = ("hot_cpu_node_s", "throttled_cpu_core_s", "oom_kills_per_1k_starts",
                      "pending_p99_s", "failed_pods")


@dataclass
class OnlineRecipe:
    """What the online policy is trained on, and how."""

    profiles: tuple[str, ...] = PROFILES
    """member profiles to train on: synthetic profile names and/or openb"""
    clusters_per_profile: int = 3
    """training clusters (environments) per profile"""
    target_loads: tuple[float, ...] = (0.6, 0.75, 0.9)
    """requested loads (share of the bottleneck resource) the environments replay, round robin"""
    method: str = "credit"
    """credit: regress each node's cost on the node credit of an exploring behaviour policy
    (``agent/learning/credit.py``); distil: behaviour cloning of ``teacher``"""
    teacher: str = ORACLE
    """distil: the scheduler the policy imitates (the oracle, or a baseline name)"""
    credit: CreditConfig = field(default_factory=CreditConfig)
    """credit: collection and regression settings"""
    bc: BCConfig = field(default_factory=lambda: BCConfig(samples=30_000, epochs=8))
    """behaviour-cloning settings (samples over all environments)"""
    hidden: int = 64
    """width of the policy's hidden layers"""
    seed: int = 1
    """seeds the clusters (1000 * seed + i), the episodes and the fit"""
    validate: bool = True
    """judge the policy on held-out clusters of every profile after the fit"""
    validation_clusters: int = 2
    """held-out clusters per profile in the validation"""
    ppo_steps: int = 0
    """PPO fine-tuning decisions after the distillation (0: none); node-credit reward"""
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(
        learning_rate=5e-5, num_steps=128, critic_warmup=4, ent_coef=0.001, gamma=0.9, seed=1))
    """PPO settings of the fine-tuning (total_steps is set from ppo_steps)"""
    reward: RewardConfig = field(default_factory=lambda: RewardConfig(node_horizon_s=1800.0))
    """reward of the fine-tuning environments (node credit over a 30-minute horizon)"""
    test_fraction: float = 0.3
    """hash split: the test part (never used here)"""
    val_fraction: float = 0.1
    """hash split: the validation part"""


def profile_parameters(profile: str, rng: np.random.Generator) -> dict[str, Any]:
    """Randomised generator parameters of one training cluster (domain randomisation over
    broad ranges, so the policy meets small and large clusters, small and large pods, calm
    and cyclic arrivals; no range is centred on a benchmark scenario)."""
    u = rng.uniform
    if profile == "web":
        return {"n_nodes": int(rng.integers(6, 31)), "n_pods": 2000, "trace_hours": 24.0,
                "cpu_median_milli": float(u(250, 1500)),
                "cpu_max_milli": int(rng.choice([4000, 8000, 16000])),
                "diurnal_amplitude": float(u(0.0, 0.5))}
    if profile == "gpu":
        return {"n_nodes": int(rng.integers(8, 31)), "n_pods": 800, "trace_hours": 24.0,
                "cpu_pod_fraction": float(u(0.05, 0.5)), "share_fraction": float(u(0.1, 0.45)),
                "cores_per_gpu_median": float(u(3.0, 12.0)),
                "cpu_pod_cpu_median_milli": float(u(2000, 12000))}
    if profile == "edge":
        return {"n_nodes": int(rng.integers(5, 16)), "n_pods": 1000, "trace_hours": 8.0,
                "gpu_node_fraction": float(rng.choice([0.0, 0.3])), "cpu_median_milli": float(u(250, 1000)),
                "cpu_max_milli": int(rng.choice([2000, 3000, 4000]))}
    return {"slice": int(rng.integers(40, 101))}


def profile_cluster(profile: str, seed: int) -> tuple[NodeTable, PodTable, dict[str, Any]]:
    """A training or validation cluster of ``profile``: randomised parameters drawn from
    ``seed`` (:func:`profile_parameters`), the generator (or the openb slice) seeded with it,
    and its replay options."""
    params = profile_parameters(profile, np.random.default_rng([seed, len(profile)]))
    if profile == "openb":
        all_nodes = load_nodes(builtin_trace("openb_node_list_all_node.csv"))
        nodes = slice_cluster(all_nodes, params["slice"], seed)
        pods = fits_somewhere(load_pods(builtin_trace("openb_pod_list_default.csv"), all_nodes), nodes)
        return nodes, pods, dict(OPENB_REPLAY)
    nodes, pods = generate_cluster(profile, seed, **params)
    return nodes, pods, {}


def reference_typical(recipe: OnlineRecipe) -> TypicalPods:
    """The typical pods of the fragmentation features, one set for every environment and for
    serving (the checkpoint stores it): the openb default trace's train part
    (:func:`fedsched.common.federation.members.reference_typical`)."""
    from fedsched.common.federation.members import reference_typical as openb_typical

    return openb_typical(recipe.test_fraction, recipe.val_fraction)


def build_envs(recipe: OnlineRecipe, typical: TypicalPods,
               reward: RewardConfig | None = None) -> tuple[list[SchedulingEnv], list[str]]:
    """The replay training environments (train pods only) and a hash of their data."""
    envs: list[tuple[NodeTable, PodTable, dict[str, Any]]] = []
    hashes: list[str] = []
    k = 0
    for profile in recipe.profiles:
        for i in range(recipe.clusters_per_profile):
            nodes, pods, replay = profile_cluster(profile, 1000 * recipe.seed + i)
            train, _, _ = split_train_val_test(pods, recipe.test_fraction, recipe.val_fraction)
            replay["target_load"] = recipe.target_loads[k % len(recipe.target_loads)]
            replay["allow_unreachable_load"] = True  # a training cluster may not reach every load
            k += 1
            envs.append((nodes, fits_somewhere(train, nodes), replay))
            hashes.append(data_hash(train))
    n_max = max(len(n) for n, _, _ in envs)
    rw = reward or RewardConfig()
    out = [SchedulingEnv(n, p, typical=typical, config=EnvConfig(mode="replay", max_nodes=n_max, replay=r,
                                                                reward=rw),
                         seed=recipe.seed * 100 + j)
           for j, (n, p, r) in enumerate(envs)]
    return out, hashes


Figures = dict[str, dict[str, dict[str, float]]]


SMOOTHING = TROUBLE_SMOOTHING


def validate(policy: Any, recipe: OnlineRecipe, typical: TypicalPods,
             references: Figures | None = None) -> Figures:
    """Per held-out cluster (``validation_clusters`` per profile, seeds no training cluster has,
    their validation pods at 85% requested load): the policy, kube-default and the oracle.
    ``references`` (filled on the first call) keeps kube-default's and the oracle's figures, which
    do not depend on the policy, for the next stage's validation."""
    out: Figures = {}
    refs = references if references is not None else {}
    for profile in recipe.profiles:
        for j in range(recipe.validation_clusters):
            nodes, pods, replay = profile_cluster(profile, 1000 * recipe.seed + 900 + j)
            train, val, _ = split_train_val_test(pods, recipe.test_fraction, recipe.val_fraction)
            val = fits_somewhere(val, nodes)
            cfg = ReplayConfig(**replay, target_load=0.85, allow_unreachable_load=True)
            key = f"{profile}-{j}"
            rows: dict[str, dict[str, float]] = dict(refs.get(key, {}))
            for name in ("policy", "kube-default", ORACLE):
                if name in rows:
                    continue
                if name == "policy":
                    sched = scorer_for(policy, typical)
                else:
                    ctx = SchedulerContext(train_pods=train, rng=np.random.default_rng(0))
                    sched = make_policy(name, ctx, "replay")
                res = run_replay(nodes, val, sched, config=cfg, seed=2024, typical=typical)
                rows[name] = {m: float(res.metrics[m]) for m in VALIDATION_METRICS}
            refs[key] = {n: r for n, r in rows.items() if n != "policy"}
            out[key] = rows
    return out


def validation_score(figures: Figures) -> float:
    """One number to select on (lower is better): the mean over held-out clusters of the trouble
    score (``fedsched.common.model.metrics.trouble_score``: hot CPU node-seconds, throttled CPU,
    OOM kills and failed pods, ``log((policy + s) / (kube-default + s))`` with a per-metric
    smoothing ``s`` so that clusters without trouble count ~0). The shipped online policy's
    checkpoint was selected with the form before failed pods joined it (its stored figures hold
    every metric, so the score can be recomputed)."""
    terms = [trouble_score(rows["policy"], rows["kube-default"]) for rows in figures.values()]
    return float(np.mean(terms)) if terms else math.nan


def fine_tune(policy: Any, recipe: OnlineRecipe, typical: TypicalPods, log: Any) -> tuple[Any, list[dict]]:
    """PPO from ``policy`` (a copy) on node-credit replay environments for ``ppo_steps`` decisions."""
    import copy

    envs, _ = build_envs(recipe, typical, recipe.reward)
    cfg = copy.deepcopy(recipe.ppo)
    cfg.total_steps = recipe.ppo_steps
    trainer = PPOTrainer(envs, cfg, copy.deepcopy(policy))
    rows: list[dict] = []

    def on_update(stats: dict[str, float]) -> None:
        rows.append(stats)
        keys = ("update", "global_step", "mean_reward", "approx_kl", "clipfrac", "explained_variance",
                "entropy", "steps_per_s")
        log("online ppo: " + ", ".join(f"{k}={stats[k]:.4g}" for k in keys if k in stats))

    trainer.train(on_update=on_update)
    return trainer.policy, rows


def train(recipe: OnlineRecipe, out: Path, log: Any = print, init: Path | None = None) -> dict[str, Any]:
    """Distil ``recipe.teacher`` into a node-scoring policy (or start from ``init``), optionally
    fine-tune it with PPO; write checkpoint.pt and summary.json."""
    import torch

    from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig

    for p in recipe.profiles:
        if p != "openb" and p not in ("web", "gpu", "edge"):
            raise ValueError(f"unknown profile {p!r}: expected web, gpu, edge or openb")
    if not recipe.profiles or recipe.clusters_per_profile < 1 or recipe.bc.samples < 1:
        raise ValueError("need at least one profile, one cluster per profile and one sample")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    torch.manual_seed(recipe.bc.seed)
    typical = reference_typical(recipe)
    envs, hashes = build_envs(recipe, typical)
    start = (f"starting from {init}" if init is not None
             else f"{recipe.bc.samples} decisions of {recipe.teacher}" if recipe.method == "distil"
             else f"credit regression on {recipe.credit.samples} decisions of {', '.join(BEHAVIOURS)}")
    log(f"online: {len(envs)} replay environments ({', '.join(recipe.profiles)}), {start}")
    epochs: list[dict[str, float]] = []
    if init is not None:  # a distilled policy already: fine-tune it
        policy, _, _ = load_checkpoint(init)
        if kind_of(policy) != NODE_SCORING:
            raise ValueError(f"--init {init}: a {kind_of(policy)} policy; the online policy scores nodes")
        epochs = []
        n_decisions = 0
    elif recipe.method == "credit":
        credit_envs, _ = build_envs(recipe, typical, recipe.reward)
        behaviours = [make_policy(b, SchedulerContext(rng=np.random.default_rng(recipe.seed)), "replay")
                      for b in BEHAVIOURS]
        data = collect_credited(credit_envs, behaviours, recipe.credit,
                                progress=lambda n: log(f"online credit collect: samples={n}"))
        n_decisions = len(data)
        credits = np.array([c.credit for c in data])
        log(f"online credit: {n_decisions} decisions, {np.mean(credits < 0):.1%} with a cost, "
            f"mean credit {credits.mean():.4g}, min {credits.min():.4g}")
        policy = NodeScoringPolicy(PolicyConfig(hidden=recipe.hidden))

        def on_credit_epoch(stats: dict[str, float]) -> None:
            epochs.append(stats)
            log("online credit fit: " + ", ".join(f"{k}={v:.4g}" for k, v in stats.items()))

        fit_credit(policy, data, recipe.credit, on_epoch=on_credit_epoch)
    elif recipe.method == "distil":
        ctx = SchedulerContext(rng=np.random.default_rng(recipe.seed))
        teacher = make_policy(recipe.teacher, ctx, "replay")
        decisions = collect(envs, teacher, recipe.bc.samples,
                            progress=lambda n: log(f"online collect: samples={n}") if n % 5000 == 0 else None)
        n_decisions = len(decisions)
        policy = NodeScoringPolicy(PolicyConfig(hidden=recipe.hidden))

        def on_epoch(stats: dict[str, float]) -> None:
            epochs.append(stats)
            log("online fit: " + ", ".join(f"{k}={v:.4g}" for k, v in stats.items()))

        fit(policy, decisions, recipe.bc, on_epoch=on_epoch)
    else:
        raise ValueError(f"unknown method {recipe.method!r}: expected credit or distil")
    references: Figures = {}
    figures = validate(policy, recipe, typical, references) if recipe.validate else {}
    _log_figures(log, recipe.method if init is None else "init", figures)
    first = recipe.method if init is None else "init"
    stages = {first: {"validation": figures, "score": validation_score(figures)}}
    chosen = first
    if recipe.ppo_steps > 0:
        tuned, ppo_rows = fine_tune(policy, recipe, typical, log)
        tuned_figures = validate(tuned, recipe, typical, references) if recipe.validate else {}
        _log_figures(log, "ppo", tuned_figures)
        stages["ppo"] = {"validation": tuned_figures, "score": validation_score(tuned_figures),
                         "updates": len(ppo_rows), "last_update": ppo_rows[-1] if ppo_rows else {},
                         "curve": ppo_rows}
        # RL must end above its warm start on validation to be kept (lower score is better).
        if not recipe.validate or stages["ppo"]["score"] < stages[first]["score"]:
            policy, figures, chosen = tuned, tuned_figures, "ppo"
    log(f"online: kept the {chosen} policy; validation scores (mean log ratio to kube-default, lower is "
        f"better): " + ", ".join(f"{k}={v['score']:.4g}" for k, v in stages.items()))
    recipe_d = asdict(recipe)
    command = "python -m fedsched.agent.learning.online " + " ".join(_flags(recipe))
    hyper = {**recipe_d, "mode": "replay", "operating_mode": "online"}
    meta = dict(algorithm=recipe.method if chosen != "ppo" else f"{recipe.method}+ppo", hyperparameters=hyper,
                typical=typical, data="+".join(sorted(set(hashes))))
    extra = {"operating_mode": "online", "teacher": recipe.teacher, "recipe": command,
             "fit": epochs[-1] if epochs else {}, "validation": figures,
             "validation_score": validation_score(figures), "stages": stages, "kept": chosen}
    ckpt = save_checkpoint(out / "checkpoint.pt", policy, extra=extra, **meta)
    summary = {"algorithm": meta["algorithm"], "operating_mode": "online", "method": recipe.method,
               "samples": n_decisions, "init": str(init) if init else None, "epochs": epochs,
               "validation": figures, "stages": stages,
               "kept": chosen, "recipe": command,
               "wall_s": round(time.time() - t0, 1), "checkpoint": str(ckpt)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


def _log_figures(log: Any, stage: str, figures: Figures) -> None:
    for cluster, rows in figures.items():
        log(f"online validation ({stage}) {cluster}: " + "; ".join(
            f"{n} " + ", ".join(f"{m}={v:.4g}" for m, v in r.items()) for n, r in rows.items()))


def _flags(r: OnlineRecipe) -> list[str]:
    return [f"--method {r.method}", f"--profiles {','.join(r.profiles)}",
            f"--clusters-per-profile {r.clusters_per_profile}",
            f"--target-loads {','.join(str(x) for x in r.target_loads)}", f"--teacher {r.teacher}",
            f"--samples {r.bc.samples if r.method == 'distil' else r.credit.samples}",
            f"--epochs {r.bc.epochs if r.method == 'distil' else r.credit.epochs}",
            f"--ppo-steps {r.ppo_steps}",
            f"--seed {r.seed}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedsched.agent.learning.online",
                                 description=(__doc__ or "").split("\n")[0])
    d = OnlineRecipe()
    ap.add_argument("--out", type=Path, required=True, help="run directory")
    ap.add_argument("--profiles", default=",".join(d.profiles), help="comma-separated: web,gpu,edge,openb")
    ap.add_argument("--clusters-per-profile", type=int, default=d.clusters_per_profile)
    ap.add_argument("--target-loads", default=",".join(str(x) for x in d.target_loads))
    ap.add_argument("--method", default=d.method, choices=("credit", "distil"))
    ap.add_argument("--teacher", default=d.teacher, help="distil: the scheduler to imitate")
    ap.add_argument("--samples", type=int, default=d.bc.samples)
    ap.add_argument("--epochs", type=int, default=d.bc.epochs)
    ap.add_argument("--ppo-steps", type=int, default=d.ppo_steps,
                    help="PPO fine-tuning decisions after the distillation (node credit; 0: none)")
    ap.add_argument("--init", type=Path, default=None,
                    help="start from this node-scoring checkpoint instead of distilling the teacher")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--no-validate", action="store_true", help="skip the held-out validation runs")
    a = ap.parse_args(argv)
    try:
        loads = tuple(float(x) for x in a.target_loads.split(","))
    except ValueError:
        ap.error(f"--target-loads: expected comma-separated numbers, got {a.target_loads!r}")
    recipe = OnlineRecipe(profiles=tuple(p for p in a.profiles.split(",") if p),
                          clusters_per_profile=a.clusters_per_profile, target_loads=loads,
                          method=a.method, teacher=a.teacher,
                          bc=BCConfig(samples=a.samples, epochs=a.epochs, seed=a.seed),
                          credit=CreditConfig(samples=a.samples, epochs=a.epochs, seed=a.seed),
                          seed=a.seed, validate=not a.no_validate, ppo_steps=a.ppo_steps)
    try:
        summary = train(recipe, a.out, log=lambda m: print(m, file=sys.stderr, flush=True), init=a.init)
    except ValueError as e:
        ap.error(str(e))
    print(json.dumps({k: summary[k] for k in ("checkpoint", "samples", "wall_s")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
