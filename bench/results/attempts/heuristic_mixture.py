"""Attempt (issue 24): the online policy's logits beside a weighted mixture of the heuristics'
scores, the weights searched on the trouble score itself over training clusters.

The shipped ``online.pt`` scores a node as ``logits + 2 * kube-default / 100`` (its metadata's
``kube_weight``). Here a candidate scores it as ``a * logits + sum_k w_k * score_k / 100`` over
heuristics ``k`` (kube-default, Trimaran's TargetLoadPacking and LoadVariationRiskBalancing,
Koordinator LoadAware, BestFit: each exactly as the benchmark runs it, 0-100 per node; a
Koordinator node it refuses keeps its refusal offset), so the search moves the policy towards
any heuristic by any amount and never needs a new network. Each candidate replays the same
training clusters on the same seeds as kube-default (common random numbers), and its objective
is the mean trouble score against kube-default seed by seed, per profile: the number the
benchmark and the roll-out gate judge, not a per-decision proxy of it.

Training clusters are :func:`fedsched.agent.learning.online.profile_cluster`'s at realistic
scale (randomised generator parameters, the daily peak inside each episode) with generator seeds
``1000 * seed + i`` (``--seed 3``: no benchmark's (7), validation's (31), federation member's
(1000 + i) or shipped training cluster's seed), their train pods at 85% requested load. The
search never reads the roll-out gate's validation clusters; ``--validate N`` judges chosen
mixtures there afterwards (the clusters and seeds ``fedsched evidence`` replays; a checkpoint's
``scoring`` metadata holds only ``kube_weight``, so a mixture is not a checkpoint ``fedsched
evidence`` could read).

    python bench/results/attempts/heuristic_mixture.py --json runs/mix/grid.json \\
        --candidates "logits=1,kube-default=2;logits=1,kube-default=2,target-load-packing=2;..."
    python bench/results/attempts/heuristic_mixture.py --validate 60 --profiles gpu,edge \\
        --candidates "logits=1,kube-default=2;logits=1,kube-default=2,load-variation-risk-balancing=1"
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.agent.learning.online import profile_cluster
from fedsched.common.compute import single_threaded, worker_pool
from fedsched.common.learning.checkpoint import load_checkpoint, typical_from_dict
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.metrics import TROUBLE_SMOOTHING, trouble_score
from fedsched.common.model.traces import fits_somewhere, split_train_val_test
from fedsched.common.schedulers import RESOLVERS, SHIPPED, SchedulerContext, default_policy_path
from fedsched.common.schedulers.base import Scheduler
from fedsched.common.sim.evaluate import make_policy, scheduler_context
from fedsched.common.sim.paired import paired_difference
from fedsched.common.sim.replay import ReplayConfig, run_replay

HEURISTICS = ("kube-default", "target-load-packing", "load-variation-risk-balancing",
              "koordinator-load-aware", "best-fit")
LOGITS = "logits"
KEPT = (*TROUBLE_SMOOTHING, "pending_p99_s")


@dataclass
class Args:
    policy: str = str(default_policy_path("learned-online"))
    """the node-scoring checkpoint whose logits the mixture keeps"""
    candidates: str = "logits=1,kube-default=2"
    """';'-separated mixtures, each 'name=weight,...' over logits and HEURISTICS (the first is the
    reference every other is paired with; the default is online.pt as shipped)"""
    profiles: str = "web,gpu,edge"
    """profiles of the training clusters"""
    clusters_per_profile: int = 4
    """training clusters per profile"""
    seeds: int = 2
    """replay seeds per cluster (every candidate and kube-default replay the same ones)"""
    seed: int = 3
    """the clusters' generator seeds are 1000 * seed + i"""
    target_load: float = 0.85
    """requested load of each replay"""
    workers: int = 2
    """processes"""
    json: str = ""
    """where to write every run's figures and the summaries"""
    validate: int = 0
    """instead of the search: replay the candidates on the roll-out gate's validation clusters
    (``fedsched evidence``'s: generator seed 31, held-out pods) with this many seeds, kube-default
    beside them, each paired with the first"""


def parse_mixture(text: str) -> dict[str, float]:
    """'logits=1,kube-default=2' -> {"logits": 1.0, "kube-default": 2.0}; unknown names, repeated
    names, negative or non-finite weights and an empty mixture are errors."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise ValueError(f"mixture term {part!r}: expected name=weight")
        if name not in (LOGITS, *HEURISTICS):
            raise ValueError(f"unknown mixture term {name!r}; expected {LOGITS} or one of "
                             f"{', '.join(HEURISTICS)}")
        if name in out:
            raise ValueError(f"mixture term {name!r} given twice")
        w = float(value)
        if not np.isfinite(w) or w < 0:
            raise ValueError(f"mixture weight {name}={value}: expected a finite number >= 0")
        out[name] = w
    if not any(out.values()):
        raise ValueError(f"mixture {text!r} has no positive weight")
    return out


def label(mix: dict[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in mix.items() if v)


class Mixture(Scheduler):
    """``a * logits + sum_k w_k * score_k / 100``; GPUs as the policy picks them."""

    name = "mixture"

    def __init__(self, policy_path: str, mix: dict[str, float], ctx: SchedulerContext) -> None:
        super().__init__(ctx)
        policy, meta, _ = load_checkpoint(policy_path)
        # the logits alone (kube_weight 0): kube-default is a term of the mixture like the others
        self.policy = PolicyScheduler(policy, typical_from_dict(meta.get("typical_pods")), ctx)
        self.a = mix.get(LOGITS, 0.0)
        self.parts = [(w, make_policy(k, ctx, "replay")) for k, w in mix.items() if k != LOGITS and w > 0]
        self.name = label(mix)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        s = np.zeros(len(nodes)) if self.a == 0 else self.a * self.policy.score(state, pod, nodes)
        for w, h in self.parts:
            s = s + w / 100.0 * np.asarray(h.score(state, pod, nodes), dtype=np.float64)
        return s

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        return self.policy.select_gpus(state, pod, node)


PREFIX = "mix:"


def resolve(name: str, ctx: SchedulerContext) -> Scheduler | None:
    """``mix:<mixture>`` names for the evaluation's registry (the validation mode)."""
    if not name.startswith(PREFIX):
        return None
    policy, _, mix = name[len(PREFIX):].partition("@")
    return Mixture(policy, parse_mixture(mix), ctx)


def validate(a: Args, mixes: Sequence[str]) -> dict[str, Any]:
    """The candidates beside kube-default on each profile's validation cluster of the roll-out gate,
    as ``fedsched evidence`` replays them; every candidate minus the first, paired."""
    from fedsched.common.sim.evaluate import evaluate
    from fedsched.common.sim.evidence import EVIDENCE_SEED, PROFILE_SCENARIO
    from fedsched.common.sim.scenarios import SCENARIOS, build

    RESOLVERS.insert(0, resolve)
    names = [f"{PREFIX}{a.policy}@{m}" for m in mixes]
    out: dict[str, Any] = {}
    for profile in [p for p in a.profiles.split(",") if p]:
        spec = build(SCENARIOS[PROFILE_SCENARIO[profile]], seed=EVIDENCE_SEED)
        spec.seeds = list(range(100, 100 + a.validate))
        spec.policies, spec.reference = ["kube-default", *names], "kube-default"
        t0 = time.time()
        res = evaluate(spec, jobs=a.workers)
        trouble = {m: res["paired"][n]["trouble_score"]["values"] for m, n in zip(mixes, names, strict=True)}
        out[profile] = {m: {"vs_kube": res["paired"][n]["trouble_score"],
                            "log_ratio": res["paired"][n]["log_ratio"],
                            "minus_first": paired_difference(trouble[m], trouble[mixes[0]])}
                        for m, n in zip(mixes, names, strict=True)}
        print(f"{profile}: {len(spec.nodes)} nodes, {len(spec.seeds)} seeds ({time.time() - t0:.0f} s); "
              f"trouble score against kube-default and minus the first, paired")
        for m, s in out[profile].items():
            v, f = s["vs_kube"], s["minus_first"]
            print(f"  {m:70s} {v['mean']:+.3f} ± {v['ci95']:.3f}   {f['mean']:+.3f} ± {f['ci95']:.3f}",
                  flush=True)
    return out


@functools.lru_cache(maxsize=4)
def cluster(profile: str, gen_seed: int) -> tuple[Any, Any, dict[str, Any]]:
    nodes, pods, replay = profile_cluster(profile, gen_seed, "realistic")
    train, _, _ = split_train_val_test(pods, 0.3, 0.1)  # online.py's split
    return nodes, fits_somewhere(train, nodes), replay


def run(args: Args, profile: str, gen_seed: int, seed: int, mix: str) -> dict[str, Any]:
    """One replay: kube-default (``mix == ""``) or a mixture, on one training cluster and seed."""
    single_threaded()
    t0 = time.perf_counter()
    nodes, pods, replay = cluster(profile, gen_seed)
    ctx = scheduler_context(pods, seed)  # the evaluation's: statistics and a tie-break stream per seed
    sched = (make_policy("kube-default", ctx, "replay") if not mix
             else Mixture(args.policy, parse_mixture(mix), ctx))
    cfg = ReplayConfig(**replay, target_load=args.target_load, allow_unreachable_load=True)
    res = run_replay(nodes, pods, sched, config=cfg, seed=seed, typical=TypicalPods.from_pods(pods))
    return {"profile": profile, "cluster": gen_seed, "seed": seed, "mix": mix, "nodes": len(nodes),
            "pods": len(pods), "wall_s": time.perf_counter() - t0,
            "metrics": {m: float(res.metrics[m]) for m in KEPT}}


def summarise(rows: list[dict[str, Any]], mixes: Sequence[str]) -> dict[str, Any]:
    """Per profile and mixture: the trouble score against kube-default over (cluster, seed), and
    each mixture minus the first, paired."""
    by = {(r["profile"], r["cluster"], r["seed"], r["mix"]): r["metrics"] for r in rows}
    out: dict[str, Any] = {}
    for profile in sorted({r["profile"] for r in rows}):
        keys = sorted({(c, s) for (p, c, s, _) in by if p == profile})
        trouble = {m: [trouble_score(by[(profile, c, s, m)], by[(profile, c, s, "")]) for c, s in keys]
                   for m in mixes}
        out[profile] = {m: {"vs_kube": paired_difference(trouble[m], [0.0] * len(keys)),
                            "minus_first": paired_difference(trouble[m], trouble[mixes[0]])}
                        for m in mixes}
    return out


def main(argv: list[str] | None = None) -> int:
    d = Args()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in asdict(d).items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    a = Args(**vars(ap.parse_args(argv)))
    if a.policy in SHIPPED:
        a.policy = str(default_policy_path(a.policy))
    mixes = [label(parse_mixture(m)) for m in a.candidates.split(";") if m.strip()]
    if len(set(mixes)) != len(mixes):
        raise SystemExit("a mixture is listed twice")
    if a.validate:
        if a.validate < 2:
            raise SystemExit("--validate needs at least 2 seeds")
        summary = validate(a, mixes)
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            out = {"args": asdict(a), "mixes": mixes, "validation": summary}
            Path(a.json).write_text(json.dumps(out, indent=1))
        return 0
    profiles = [p for p in a.profiles.split(",") if p]
    tasks = [(p, 1000 * a.seed + i, 42 + s, m) for p in profiles for i in range(a.clusters_per_profile)
             for s in range(a.seeds) for m in ["", *mixes]]
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    with worker_pool(a.workers) as pool:
        futures = [pool.submit(run, a, *t) for t in tasks]
        for f in as_completed(futures):
            r = f.result()
            rows.append(r)
            print(f"[{len(rows)}/{len(tasks)}] {r['profile']} {r['cluster']} ({r['nodes']} nodes, "
                  f"{r['pods']} pods) seed {r['seed']} {r['mix'] or 'kube-default'}: {r['wall_s']:.1f} s",
                  flush=True)
    summary = summarise(rows, mixes)
    print(f"trouble score against kube-default on the training clusters ({a.clusters_per_profile} per "
          f"profile x {a.seeds} seeds), and minus the first mixture, paired; mean ± 95% half-width")
    for profile, per in summary.items():
        for m, s in per.items():
            v, f = s["vs_kube"], s["minus_first"]
            print(f"  {profile:5s} {m:70s} {v['mean']:+.3f} ± {v['ci95']:.3f}   "
                  f"{f['mean']:+.3f} ± {f['ci95']:.3f}")
    print(f"({time.time() - t0:.0f} s)")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        out = {"args": asdict(a), "mixes": mixes, "summary": summary, "runs": rows}
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
