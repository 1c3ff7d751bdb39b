"""The online (replay-mode) node-scoring policy: credit regression (``--method credit``,
``agent/learning/credit.py``) or distillation of a privileged teacher on several member
profiles, then optional PPO fine-tuning.

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
node slices (slice seeds ``1000 * seed + i``), each replayed on the *train* part of its pods
(the hash split every evaluation shares: ``bench/online_quality.py`` replays the test part), at
requested loads drawn from ``target_loads`` per environment, so the policy sees light and heavy
clusters. ``--scale realistic`` (the default) draws clusters as large as the served ones (web
30-320 nodes, gpu 20-160, edge 10-80, openb slices 60-300) with the daily peak inside each
episode; ``--scale small`` the 5-30-node clusters of the shipped ``online.pt``.

Credit collection runs in ``--workers`` processes (or Ray tasks with ``--engine ray``, on this
machine or the Ray cluster ``RAY_ADDRESS`` names), each stepping its share of the environments;
``--data FILE`` keeps the collected decisions so that another fit (``--tie-weights``) needs no
new collection. ``--credit-weights trouble`` (the default) prices each environment's node
credit as the trouble score does on that cluster (``credit.trouble_weights``). ``--horizon`` sets
the credit's horizon and ``--throttle-credit`` whose throttling it charges a decision: ``node``
(the default) the chosen node's, ``pod`` the placed pod's own (``RewardConfig.throttle_credit``);
``--oom-credit`` whose OOM kills: ``pod`` (the default) the placed pod's, ``node`` every kill on
the chosen node (``RewardConfig.oom_credit``); ``--mem-use-range LO,HI`` draws each training
cluster's median memory use per request (``OnlineRecipe.mem_use_range``); all are part of the
key under which ``--data`` keeps decisions. ``--credit-target`` is a fit
choice (kept decisions serve both): ``log`` (the default) regresses on ``log1p`` of the cost,
``mean`` on the cost itself (``credit.targets``; measured worse, see the policies README).
``--kube-weight W`` keeps kube-default beside the policy wherever it scores: its logits plus W
times kube-default's score / 100, written into the checkpoint's scoring options
(``fedsched.common.learning.scorers``) so that validation, the benchmarks and serving score alike.

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
import os
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.agent.learning.bc import BCConfig, collect, fit
from fedsched.agent.learning.credit import (
    BEHAVIOURS,
    CREDIT_TARGETS,
    CreditConfig,
    collect_credited,
    fit_credit,
)
from fedsched.agent.learning.env import OOM_CREDITS, THROTTLE_CREDITS, EnvConfig, RewardConfig, SchedulingEnv
from fedsched.agent.learning.ppo import PPOConfig, PPOTrainer
from fedsched.common.compute import worker_pool
from fedsched.common.learning.checkpoint import data_hash, load_checkpoint, save_checkpoint
from fedsched.common.learning.features import MAX_USE_RATIO
from fedsched.common.learning.kinds import NODE_SCORING, kind_of
from fedsched.common.learning.scorers import MAX_KUBE_WEIGHT, SCORING_KEY, scorer_for, scoring_metadata
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
MAX_EPISODE_PODS = 30_000  # a realistic training cluster's pods per episode (its train part: 60%)
PEAK_HOUR = "peak_hour"  # profile_parameters' key: hour of the online classes' daily peak (replay)
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
    """reward of the credit and fine-tuning environments (node credit over a 30-minute horizon)"""
    credit_weights: str = "trouble"
    """credit: trouble (each environment's node-credit weights price a hot node-minute, a
    throttled core-minute and an OOM kill as the trouble score does on that cluster, from a
    kube-default run of it: ``credit.trouble_weights``) or fixed (``reward``'s weights everywhere)"""
    scale: str = "realistic"
    """training and validation cluster sizes (``profile_parameters``): realistic or small"""
    tie_weights: tuple[float, ...] = (0.3,)
    """credit: the regression's tie weights (``CreditConfig.tie_weight``) to fit; with more than
    one, each is fitted on the same decisions and the best on the validation clusters is kept"""
    kube_weight: float = 0.0
    """weight of kube-default's score / 100 added to the policy's logits wherever it scores
    (validation included): written into the checkpoint's scoring options
    (``fedsched.common.learning.scorers``); 0: the logits alone"""
    engine: str = "processes"
    """credit collection: processes (this machine) or ray (Ray tasks, as Flower's simulation runs
    its members: this machine, or a Ray cluster through ``RAY_ADDRESS``)"""
    workers: int = 1
    """processes collecting credited decisions in parallel (each steps its share of the
    environments); 1: in this process"""
    mem_use_range: tuple[float, float] | None = None
    """training clusters only: the usage model's median memory use per request
    (``ReplayConfig.usage_mem_median``, every QoS class alike) drawn log-uniformly in this range
    per cluster, from a stream of its own (the clusters and pods are those drawn without it); None:
    the usage model's calibrated default everywhere. Validation clusters keep the default"""
    test_fraction: float = 0.3
    """hash split: the test part (never used here)"""
    val_fraction: float = 0.1
    """hash split: the validation part"""


def profile_parameters(profile: str, rng: np.random.Generator, scale: str = "realistic") -> dict[str, Any]:
    """Randomised generator parameters of one training cluster (domain randomisation over
    broad ranges, so the policy meets small and large clusters, small and large pods, calm
    and cyclic arrivals; no range is centred on a benchmark scenario).

    ``scale="realistic"``: node counts drawn log-uniformly over an order of magnitude (web
    30-320, gpu 20-160, edge 10-80, openb slices of 60-300 nodes) and arrivals per node and
    hour drawn broadly, so a training cluster is as large and as busy as the clusters the
    policy serves (hot nodes are rare events on a small cluster, and the load signals of a
    200-node cluster are not a 10-node one's); episodes span a few hours of that traffic.
    The daily cycle's phase is drawn too (``PEAK_HOUR``: the online classes' use, and web
    arrivals, peak somewhere inside the episode; the usage model's default puts it at 14:00).
    ``scale="small"``: the 5-30-node clusters of the first online policy."""
    u = rng.uniform
    if scale not in ("realistic", "small"):
        raise ValueError(f"unknown training scale {scale!r}: expected realistic or small")
    if scale == "small":
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
                    "gpu_node_fraction": float(rng.choice([0.0, 0.3])),
                    "cpu_median_milli": float(u(250, 1000)),
                    "cpu_max_milli": int(rng.choice([2000, 3000, 4000]))}
        return {"slice": int(rng.integers(40, 101))}

    def log_uniform(lo: float, hi: float) -> int:
        return round(math.exp(u(math.log(lo), math.log(hi))))

    def sized(n_nodes: int, per_node_hour: tuple[float, float], hours: tuple[float, float]) -> dict[str, Any]:
        h = float(u(*hours))
        # where the online classes' daily use peaks: inside the episode (a few hours of a day
        # that starts at midnight would never reach the usage model's afternoon peak)
        return {"n_nodes": n_nodes, "trace_hours": h, PEAK_HOUR: float(u(0.25, 0.85) * h),
                "n_pods": int(np.clip(n_nodes * h * u(*per_node_hour), 200, MAX_EPISODE_PODS))}

    if profile == "web":
        return {**sized(log_uniform(30, 320), (8.0, 40.0), (4.0, 10.0)),
                "cpu_median_milli": float(u(250, 1500)),
                "cpu_max_milli": int(rng.choice([4000, 8000, 16000])),
                "diurnal_amplitude": float(u(0.0, 0.5))}
    if profile == "gpu":
        return {**sized(log_uniform(20, 160), (2.0, 8.0), (8.0, 24.0)),
                "cpu_pod_fraction": float(u(0.05, 0.5)), "share_fraction": float(u(0.1, 0.45)),
                "cores_per_gpu_median": float(u(3.0, 12.0)),
                "cpu_pod_cpu_median_milli": float(u(2000, 12000))}
    if profile == "edge":
        return {**sized(log_uniform(10, 80), (10.0, 50.0), (3.0, 8.0)),
                "gpu_node_fraction": float(rng.choice([0.0, 0.3])), "cpu_median_milli": float(u(250, 1000)),
                "cpu_max_milli": int(rng.choice([2000, 3000, 4000]))}
    return {"slice": log_uniform(60, 300)}


def profile_cluster(profile: str, seed: int,
                    scale: str = "realistic") -> tuple[NodeTable, PodTable, dict[str, Any]]:
    """A training or validation cluster of ``profile``: randomised parameters drawn from
    ``seed`` (:func:`profile_parameters`), the generator (or the openb slice) seeded with it,
    and its replay options."""
    params = profile_parameters(profile, np.random.default_rng([seed, len(profile)]), scale)
    if profile == "openb":
        all_nodes = load_nodes(builtin_trace("openb_node_list_all_node.csv"))
        nodes = slice_cluster(all_nodes, params["slice"], seed)
        pods = fits_somewhere(load_pods(builtin_trace("openb_pod_list_default.csv"), all_nodes), nodes)
        replay = dict(OPENB_REPLAY)
        if scale == "realistic":
            replay["max_pods"] = 8 * params["slice"]  # about the same pods per node on any slice
        return nodes, pods, replay
    peak = params.pop(PEAK_HOUR, None)
    replay: dict[str, Any] = {}
    if peak is not None:  # the daily cycle's phase, arrivals (web) and use alike
        shift = peak - ReplayConfig.usage_peak_hour[1]
        replay["usage_peak_hour"] = tuple((h + shift) % 24.0 for h in ReplayConfig.usage_peak_hour)
        if profile == "web":
            params["diurnal_peak_hour"] = peak
    nodes, pods = generate_cluster(profile, seed, **params)
    return nodes, pods, replay


def reference_typical(recipe: OnlineRecipe) -> TypicalPods:
    """The typical pods of the fragmentation features, one set for every environment and for
    serving (the checkpoint stores it): the openb default trace's train part
    (:func:`fedsched.common.federation.members.reference_typical`)."""
    from fedsched.common.federation.members import reference_typical as openb_typical

    return openb_typical(recipe.test_fraction, recipe.val_fraction)


def mem_use_level(recipe: OnlineRecipe, profile: str, i: int) -> float:
    """Training cluster ``i`` of ``profile``: its median memory use per request, log-uniform in
    ``recipe.mem_use_range`` (a stream of its own: the cluster's other draws do not move)."""
    assert recipe.mem_use_range is not None
    lo, hi = recipe.mem_use_range
    rng = np.random.default_rng([1000 * recipe.seed + i, zlib.crc32(profile.encode()), 0x4D454D])
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def build_envs(recipe: OnlineRecipe, typical: TypicalPods, reward: RewardConfig | None = None,
               only: Sequence[int] | None = None) -> tuple[list[SchedulingEnv], list[str]]:
    """The replay training environments (train pods only) and a hash of their data; ``only``:
    just those of these indices (a collection worker's share)."""
    envs: list[tuple[NodeTable, PodTable, dict[str, Any]]] = []
    hashes: list[str] = []
    k = 0
    keep = None if only is None else set(only)
    for profile in recipe.profiles:
        for i in range(recipe.clusters_per_profile):
            if keep is not None and k not in keep:
                k += 1
                continue
            nodes, pods, replay = profile_cluster(profile, 1000 * recipe.seed + i, recipe.scale)
            train, _, _ = split_train_val_test(pods, recipe.test_fraction, recipe.val_fraction)
            replay["target_load"] = recipe.target_loads[k % len(recipe.target_loads)]
            replay["allow_unreachable_load"] = True  # a training cluster may not reach every load
            if recipe.mem_use_range is not None:
                replay["usage_mem_median"] = (mem_use_level(recipe, profile, i),) * 4
            k += 1
            envs.append((nodes, fits_somewhere(train, nodes), replay))
            hashes.append(data_hash(train))
    n_max = max(len(n) for n, _, _ in envs)
    rw = reward or RewardConfig()
    indices = sorted(keep) if keep is not None else range(len(envs))
    out = [SchedulingEnv(n, p, typical=typical, config=EnvConfig(mode="replay", max_nodes=n_max, replay=r,
                                                                reward=rw),
                         seed=recipe.seed * 100 + j)
           for j, (n, p, r) in zip(indices, envs, strict=True)]
    return out, hashes


def n_envs(recipe: OnlineRecipe) -> int:
    return len(recipe.profiles) * recipe.clusters_per_profile


def price_trouble(envs: Sequence[SchedulingEnv], typical: TypicalPods) -> list[dict[str, float]]:
    """Give each node-credit environment the weights of ``credit.trouble_weights``, from one
    kube-default replay of its cluster (its first episode's seed); returns the weights."""
    from fedsched.agent.learning.credit import trouble_weights
    from fedsched.common.schedulers.kube_default import KubeDefault

    out = []
    for env in envs:
        res = run_replay(env.cluster_nodes, env.pool, KubeDefault(), config=ReplayConfig(**env.cfg.replay),
                         seed=int(env._seed or 0), typical=typical)
        w = trouble_weights(res.metrics, int(res.counters["binds"]), float(res.counters["starts"]))
        env.cfg = replace(env.cfg, reward=replace(env.cfg.reward, **w))
        out.append(w)
    return out


def _collect_share(recipe: OnlineRecipe, worker: int, indices: list[int], quota: int,
                   own_process: bool = True) -> list:
    """One collection worker: build its environments, price them, collect ``quota`` decisions."""
    import copy

    if own_process:  # a collection process computes nothing in parallel; the fit's process does
        import torch

        torch.set_num_threads(1)
    typical = reference_typical(recipe)
    envs, _ = build_envs(recipe, typical, recipe.reward, only=indices)
    if recipe.credit_weights == "trouble":
        price_trouble(envs, typical)
    behaviours = [make_policy(b, SchedulerContext(rng=np.random.default_rng(recipe.seed + worker)), "replay")
                  for b in BEHAVIOURS]
    cfg = copy.deepcopy(recipe.credit)
    cfg.samples, cfg.seed = quota, recipe.credit.seed + 7919 * worker

    def progress(n: int) -> None:
        print(f"online credit collect [worker {worker}]: samples={n}/{quota}", file=sys.stderr, flush=True)

    return collect_credited(envs, behaviours, cfg, progress=progress)


def collect_parallel(recipe: OnlineRecipe, log: Any) -> list:
    """Credited decisions from ``recipe.workers`` processes (or Ray tasks with ``engine="ray"``:
    on this machine, or on the Ray cluster ``RAY_ADDRESS`` names, whose workers need fedsched
    installed), each stepping its share of the environments (round robin by index) for its share
    of ``credit.samples``; one process worker runs here. The same recipe gives the same
    decisions for the same worker count, whichever the engine."""
    from multiprocessing import get_context

    n = n_envs(recipe)
    workers = max(1, min(recipe.workers, n))
    shares = [list(range(w, n, workers)) for w in range(workers)]
    total = recipe.credit.samples
    quotas = [total // workers + (w < total % workers) for w in range(workers)]
    if recipe.engine == "ray":  # Ray (Flower's simulation engine): this machine, or RAY_ADDRESS's cluster
        import ray

        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False, include_dashboard=False)
        log(f"online credit: {workers} Ray tasks, {n} environments")
        task = ray.remote(num_cpus=1)(_collect_share)
        refs = [task.remote(recipe, w, shares[w], quotas[w]) for w in range(workers)]
        return [c for part in ray.get(refs) for c in part]
    if workers == 1:
        return _collect_share(recipe, 0, shares[0], quotas[0], own_process=False)
    log(f"online credit: {workers} collection processes, {n} environments")
    with worker_pool(workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_collect_share, recipe, w, shares[w], quotas[w]) for w in range(workers)]
        out: list = []
        for f in futures:
            out.extend(f.result())
    return out


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
            nodes, pods, replay = profile_cluster(profile, 1000 * recipe.seed + 900 + j, recipe.scale)
            train, val, _ = split_train_val_test(pods, recipe.test_fraction, recipe.val_fraction)
            val = fits_somewhere(val, nodes)
            cfg = ReplayConfig(**replay, target_load=0.85, allow_unreachable_load=True)
            key = f"{profile}-{j}"
            rows: dict[str, dict[str, float]] = dict(refs.get(key, {}))
            for name in ("policy", "kube-default", ORACLE):
                if name in rows:
                    continue
                if name == "policy":
                    sched = scorer_for(policy, typical, **scoring_metadata(recipe.kube_weight))
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


def _credited_data(recipe: OnlineRecipe, path: Path | None, log: Any) -> list:
    """The credited decisions: read from ``path`` when it exists (an earlier collection of the
    same recipe, to fit again without collecting), else collected and, with ``path``, kept there."""
    import pickle

    if path is not None and path.exists():
        with path.open("rb") as f:
            saved = pickle.load(f)
        if saved.get("collection") != _collection_key(recipe):
            raise ValueError(f"--data {path}: collected under another recipe ({saved.get('collection')}); "
                             "remove it or point --data elsewhere")
        log(f"online credit: {len(saved['data'])} decisions read from {path}")
        return saved["data"]
    data = collect_parallel(recipe, log)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with tmp.open("wb") as f:
            pickle.dump({"collection": _collection_key(recipe), "data": data}, f, protocol=5)
        tmp.replace(path)
    return data


def _collection_key(recipe: OnlineRecipe) -> dict[str, Any]:
    c = recipe.credit
    return {"profiles": list(recipe.profiles), "clusters_per_profile": recipe.clusters_per_profile,
            "target_loads": list(recipe.target_loads), "scale": recipe.scale, "seed": recipe.seed,
            "credit_weights": recipe.credit_weights, "samples": c.samples, "explore": c.explore,
            "warmup": c.warmup, "credit_seed": c.seed, "workers": recipe.workers,
            "horizon_s": recipe.reward.node_horizon_s,
            # only when not the default, so decisions kept before the option existed still match
            **({} if recipe.reward.throttle_credit == "node"
               else {"throttle_credit": recipe.reward.throttle_credit}),
            **({} if recipe.reward.node_hot_mem == 0 else {"hot_mem_credit": recipe.reward.node_hot_mem}),
            **({} if recipe.reward.oom_credit == "pod" else {"oom_credit": recipe.reward.oom_credit}),
            **({} if recipe.reward.node_oom == RewardConfig.node_oom
               else {"oom_price": recipe.reward.node_oom}),
            **({} if recipe.mem_use_range is None else {"mem_use_range": list(recipe.mem_use_range)})}


def train(recipe: OnlineRecipe, out: Path, log: Any = print, init: Path | None = None,
          data_path: Path | None = None) -> dict[str, Any]:
    """Distil ``recipe.teacher`` into a node-scoring policy (or start from ``init``), or fit it
    by credit regression (one fit per tie weight, the best on validation kept), optionally
    fine-tune it with PPO; write checkpoint.pt and summary.json. ``data_path``: where credited
    decisions are kept between runs (read if present)."""
    import torch

    from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig

    for p in recipe.profiles:
        if p != "openb" and p not in ("web", "gpu", "edge"):
            raise ValueError(f"unknown profile {p!r}: expected web, gpu, edge or openb")
    if not recipe.profiles or recipe.clusters_per_profile < 1 or recipe.bc.samples < 1:
        raise ValueError("need at least one profile, one cluster per profile and one sample")
    if len(recipe.tie_weights) > 1 and not recipe.validate:
        raise ValueError("several tie weights are chosen between on the validation clusters: "
                         "give one with --no-validate")
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
    candidates: list[tuple[str, Any, list[dict[str, float]]]] = []
    if init is not None:  # a distilled policy already: fine-tune it
        policy, _, _ = load_checkpoint(init)
        if kind_of(policy) != NODE_SCORING:
            raise ValueError(f"--init {init}: a {kind_of(policy)} policy; the online policy scores nodes")
        epochs = []
        n_decisions = 0
    elif recipe.method == "credit":
        data = _credited_data(recipe, data_path, log)
        n_decisions = len(data)
        credits = np.array([c.credit for c in data])
        log(f"online credit: {n_decisions} decisions, {np.mean(credits < 0):.1%} with a cost, "
            f"mean credit {credits.mean():.4g}, min {credits.min():.4g}")
        for tie in recipe.tie_weights:
            candidate = NodeScoringPolicy(PolicyConfig(hidden=recipe.hidden))
            torch.manual_seed(recipe.credit.seed)
            cfg = CreditConfig(**{**asdict(recipe.credit), "tie_weight": tie})
            rows: list[dict[str, float]] = []

            def on_credit_epoch(stats: dict[str, float], rows: list = rows, tie: float = tie) -> None:
                rows.append(stats)
                log(f"online credit fit (tie {tie:g}): "
                    + ", ".join(f"{k}={v:.4g}" for k, v in stats.items()))

            fit_credit(candidate, data, cfg, on_epoch=on_credit_epoch)
            candidates.append((f"credit-tie{tie:g}", candidate, rows))
        policy, epochs = candidates[0][1], candidates[0][2]
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
    stages: dict[str, dict[str, Any]] = {}
    if len(candidates) > 1:  # several tie weights: the best on the held-out clusters is kept
        best, first = math.inf, candidates[0][0]
        for name, candidate, rows in candidates:
            cand_figures = validate(candidate, recipe, typical, references)
            _log_figures(log, name, cand_figures)
            stages[name] = {"validation": cand_figures, "score": validation_score(cand_figures), "fit": rows}
            if stages[name]["score"] < best:
                best = stages[name]["score"]
                policy, epochs, first = candidate, rows, name
        figures = stages[first]["validation"]
    else:
        figures = validate(policy, recipe, typical, references) if recipe.validate else {}
        first = recipe.method if init is None else "init"
        _log_figures(log, first, figures)
        stages[first] = {"validation": figures, "score": validation_score(figures)}
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
             "validation_score": validation_score(figures), "stages": stages, "kept": chosen,
             SCORING_KEY: scoring_metadata(recipe.kube_weight)}
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
            f"--ppo-steps {r.ppo_steps}", f"--credit-weights {r.credit_weights}",
            f"--scale {r.scale}", f"--workers {r.workers}", f"--engine {r.engine}",
            f"--tie-weights {','.join(f'{t:g}' for t in r.tie_weights)}",
            *([] if r.credit.size_buckets else ["--no-size-buckets"]),
            f"--credit-target {r.credit.target}",
            f"--horizon {r.reward.node_horizon_s:g}", f"--throttle-credit {r.reward.throttle_credit}",
            f"--hot-mem-credit {r.reward.node_hot_mem:g}", f"--oom-credit {r.reward.oom_credit}",
            f"--oom-price {r.reward.node_oom:g}",
            *([] if r.mem_use_range is None
              else [f"--mem-use-range {','.join(f'{x:g}' for x in r.mem_use_range)}"]),
            f"--kube-weight {r.kube_weight:g}",
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
    ap.add_argument("--credit-weights", default=d.credit_weights, choices=("trouble", "fixed"),
                    help="credit: price each environment's node credit as the trouble score does (trouble) "
                         "or with fixed weights")
    ap.add_argument("--scale", default=d.scale, choices=("realistic", "small"),
                    help="training and validation cluster sizes")
    ap.add_argument("--workers", type=int, default=d.workers,
                    help="processes (or Ray tasks) collecting credited decisions in parallel")
    ap.add_argument("--engine", default=d.engine, choices=("processes", "ray"),
                    help="where collection runs: local processes, or Ray tasks (RAY_ADDRESS: a cluster)")
    ap.add_argument("--tie-weights", default=",".join(f"{t:g}" for t in d.tie_weights),
                    help="credit: comma-separated tie weights; each is fitted, the best on validation kept")
    ap.add_argument("--no-size-buckets", action="store_true",
                    help="credit: plain random minibatches (the first online policy's fit)")
    ap.add_argument("--credit-target", default=CreditConfig.target, choices=CREDIT_TARGETS,
                    help="credit: regress on log1p of the cost (log: its tail compressed) or on the cost "
                         "itself (mean: the expected cost, rare large costs counted in full)")
    ap.add_argument("--data", type=Path, default=None,
                    help="credit: keep the collected decisions in this file, or read them from it if present")
    ap.add_argument("--horizon", type=float, default=d.reward.node_horizon_s,
                    help="credit: seconds after a bind whose hot, throttled and OOM outcome on the chosen "
                         "node is charged to the decision (long enough to reach the daily peak: hours)")
    ap.add_argument("--throttle-credit", default=d.reward.throttle_credit,
                    help="credit: whose throttled CPU a decision is charged: node (the chosen node's over "
                         "the horizon) or pod (the placed pod's own, until the horizon or its end)")
    ap.add_argument("--hot-mem-credit", type=float, default=d.reward.node_hot_mem,
                    help="credit: price of a minute the chosen node's windowed memory use spends above the "
                         "hot threshold, as given under either --credit-weights (a hot CPU minute costs 0.1 "
                         "with fixed weights); 0: not charged")
    ap.add_argument("--oom-credit", default=d.reward.oom_credit,
                    help="credit: whose OOM kills a decision is charged: pod (the placed pod's own) or node "
                         "(every kill on the chosen node over the horizon, as a deployed member measures)")
    ap.add_argument("--oom-price", type=float, default=d.reward.node_oom,
                    help="credit, with --credit-weights fixed: price of one OOM kill (a hot CPU minute "
                         "costs 0.1); trouble weights price it per cluster")
    ap.add_argument("--mem-use-range", default=None,
                    help="LO,HI: each training cluster's median memory use per request drawn log-uniformly "
                         f"in [LO, HI], 0 < LO <= HI <= {MAX_USE_RATIO:g} (default: the usage model's "
                         "calibrated level everywhere)")
    ap.add_argument("--kube-weight", type=float, default=d.kube_weight,
                    help="weight of kube-default's score / 100 added to the policy's logits wherever it "
                         "scores (kept in the checkpoint; 0: the logits alone)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--no-validate", action="store_true", help="skip the held-out validation runs")
    a = ap.parse_args(argv)
    try:
        loads = tuple(float(x) for x in a.target_loads.split(","))
        ties = tuple(float(x) for x in a.tie_weights.split(","))
    except ValueError:
        ap.error(f"--target-loads and --tie-weights: expected comma-separated numbers, got "
                 f"{a.target_loads!r}, {a.tie_weights!r}")
    if not ties or any(not math.isfinite(t) or t < 0 for t in ties):
        ap.error(f"--tie-weights: expected finite numbers >= 0, got {a.tie_weights!r}")
    if not 0 <= a.kube_weight <= MAX_KUBE_WEIGHT:
        ap.error(f"--kube-weight: expected a number in [0, {MAX_KUBE_WEIGHT:g}], got {a.kube_weight:g}")
    if not math.isfinite(a.horizon) or a.horizon <= 0:
        ap.error(f"--horizon: expected seconds > 0, got {a.horizon:g}")
    if not math.isfinite(a.hot_mem_credit) or a.hot_mem_credit < 0:
        ap.error(f"--hot-mem-credit: expected a finite number >= 0, got {a.hot_mem_credit:g}")
    if a.throttle_credit not in THROTTLE_CREDITS:
        ap.error(f"--throttle-credit: expected node or pod, got {a.throttle_credit!r}")
    if not math.isfinite(a.oom_price) or a.oom_price < 0:
        ap.error(f"--oom-price: expected a finite number >= 0, got {a.oom_price:g}")
    if a.oom_price != d.reward.node_oom and a.credit_weights != "fixed":
        ap.error("--oom-price: only with --credit-weights fixed (trouble weights price a kill per cluster)")
    mem_range = None
    if a.mem_use_range is not None:
        try:
            mem_range = tuple(float(x) for x in a.mem_use_range.split(","))
        except ValueError:
            mem_range = ()
        if (len(mem_range) != 2 or not all(0 < x <= MAX_USE_RATIO for x in mem_range)
                or mem_range[0] > mem_range[1]):
            ap.error(f"--mem-use-range: expected LO,HI with 0 < LO <= HI <= {MAX_USE_RATIO:g}, "
                     f"got {a.mem_use_range!r}")
    if a.oom_credit not in OOM_CREDITS:
        ap.error(f"--oom-credit: expected pod or node, got {a.oom_credit!r}")
    recipe = OnlineRecipe(profiles=tuple(p for p in a.profiles.split(",") if p),
                          clusters_per_profile=a.clusters_per_profile, target_loads=loads,
                          method=a.method, teacher=a.teacher,
                          bc=BCConfig(samples=a.samples, epochs=a.epochs, seed=a.seed),
                          credit=CreditConfig(samples=a.samples, epochs=a.epochs, seed=a.seed,
                                              size_buckets=not a.no_size_buckets,
                                              target=a.credit_target),
                          seed=a.seed, validate=not a.no_validate, ppo_steps=a.ppo_steps,
                          credit_weights=a.credit_weights, scale=a.scale, workers=max(1, a.workers),
                          tie_weights=ties, engine=a.engine, kube_weight=a.kube_weight,
                          mem_use_range=mem_range,
                          reward=replace(d.reward, node_horizon_s=a.horizon,
                                         throttle_credit=a.throttle_credit,
                                         node_hot_mem=a.hot_mem_credit, oom_credit=a.oom_credit,
                                         node_oom=a.oom_price))
    try:
        summary = train(recipe, a.out, log=lambda m: print(m, file=sys.stderr, flush=True), init=a.init,
                        data_path=a.data)
    except ValueError as e:
        ap.error(str(e))
    print(json.dumps({k: summary[k] for k in ("checkpoint", "samples", "wall_s")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
