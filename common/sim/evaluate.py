"""The evaluation harness behind ``fedsched evaluate``: policies x seeds, mean and 95% CI.

Honest by default: the pod list is split by a stable hash of the pod name
(:func:`fedsched.common.model.traces.split_by_hash`); every statistic a policy may learn from
(FGD's typical pods, a learned policy's training data) comes from the *train* part, and
the workload the policies are judged on is drawn from the *test* part. ``split=None``
uses the whole list for both, which is the published FGD protocol.

Runs are independent (one policy, one seed) and fan out over worker processes; the same
seeds give the same numbers whatever the worker count.

Policies are what :func:`fedsched.common.schedulers.make_scheduler` builds, plus, in replay
mode only, the reference ``oracle`` (:mod:`fedsched.common.sim.replay.oracle`: it reads the
simulator's hidden usage parameters, so it is no baseline; see :func:`make_policy`). In packing
mode the shipped packing policy ``learned`` is judged with the packing check it is served with on
a packing cluster (``fedsched serve --packing-check``, on by default behind a packing gate
objective, with FGD as the check's alternative, ``--packing-alternatives fgd``): :data:`PACKING_LEARNED`:
of the model and FGD, those the packing simulation of the pods it may learn from on the cluster's
nodes shows allocating more than kube-default with evidence, the one with the highest mean, and
kube-default (what the agent answers in shadow mode) where neither does. The model alone is its
checkpoint path (``common/data/policies/default.pt``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.common.compute import single_threaded, worker_pool
from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.metrics import HIGHER_IS_BETTER, LEGACY_COUNTERS, METRICS, mean_ci95
from fedsched.common.model.traces import split_by_hash
from fedsched.common.schedulers import LEARNED, Scheduler, SchedulerContext, make_scheduler
from fedsched.common.sim.packing import CURVE_X, run_packing
from fedsched.common.sim.paired import paired_against
from fedsched.common.sim.run_cache import RunCache, agree, spec_key

log = logging.getLogger("fedsched.evaluate")

PACKING_LEARNED = f"best-of[kube-default,{LEARNED},fgd]"
"""What ``learned`` is in packing mode (:func:`make_policy`; :mod:`fedsched.common.sim.portfolio`)."""


@dataclass
class EvalSpec:
    """One evaluation: a cluster, a pod list, policies and seeds."""

    nodes: NodeTable
    pods: PodTable
    policies: list[str]
    seeds: list[int]
    mode: str = "packing"  # packing | replay
    target_load: float = 1.3  # packing: arrived requests as a multiple of capacity
    test_fraction: float | None = 0.3  # hash split; None = no split (published protocol)
    train_pods: PodTable | None = None  # explicit statistics source (overrides the split)
    replay_options: dict[str, Any] = field(default_factory=dict)
    reference: str = "kube-default"  # the paired comparisons are taken against it (when it runs)


@dataclass
class RunOutput:
    policy: str
    seed: int
    metrics: dict[str, float]
    curve: list[float] | None  # packing: allocation % at CURVE_X arrived %
    idle_gpu: dict[str, Any] | None = None  # packing: where the GPU stays idle at the end (PackingResult)
    choice: dict[str, Any] | None = None  # a best-of[...] choice: the member chosen, simulated means


def scheduler_context(train: PodTable, seed: int) -> SchedulerContext:
    """The context a scheduler is built with for one run of ``seed``: statistics from ``train``
    and a random stream of its own (a policy's sampling never shares the run's tie-breaks)."""
    return SchedulerContext(train_pods=train, rng=np.random.default_rng(seed + 1_000_003))


def split(spec: EvalSpec) -> tuple[PodTable, PodTable]:
    """(statistics pods, workload pods)."""
    if spec.train_pods is not None:
        return spec.train_pods, spec.pods
    if spec.test_fraction is None:
        return spec.pods, spec.pods
    train, test = split_by_hash(spec.pods, spec.test_fraction)
    return train, test


def make_policy(name: str, ctx: SchedulerContext, mode: str) -> Scheduler:
    """``make_scheduler(name, ctx)``; the replay oracle for ``"oracle"`` (or one of its
    variants, ``ORACLE_VARIANTS``) in replay mode (a reference point that reads the simulator's
    hidden state; never a registered baseline); in packing mode, ``learned`` as a packing cluster
    serves it (:data:`PACKING_LEARNED`, named ``learned``)."""
    from fedsched.common.sim.replay.oracle import ORACLE_VARIANTS, Oracle, OracleArgs

    if mode == "packing" and name == LEARNED:
        sched = make_scheduler(PACKING_LEARNED, ctx)
        sched.name = LEARNED
        return sched

    if name in ORACLE_VARIANTS:
        if mode != "replay":
            raise ValueError("the oracle reads the replay simulator's hidden usage parameters: "
                             "replay mode only")
        oracle = Oracle(ctx, OracleArgs(knows=ORACLE_VARIANTS[name]))
        oracle.name = name
        return oracle
    return make_scheduler(name, ctx)


def run_one(spec: EvalSpec, policy: str, seed: int) -> RunOutput:
    """One policy on one seed; also the unit of work of the process pool."""
    single_threaded()
    train, work = split(spec)
    typical = TypicalPods.from_pods(train)
    scheduler = make_policy(policy, scheduler_context(train, seed), spec.mode)
    if spec.mode == "packing":
        res = run_packing(spec.nodes, work, scheduler, target_load=spec.target_load, seed=seed,
                          typical=typical)
        return RunOutput(policy, seed, res.metrics, [float(v) for v in res.curve(CURVE_X)], res.idle_gpu,
                         choice_of(scheduler))
    if spec.mode == "replay":
        from fedsched.common.sim.replay import ReplayConfig, run_replay

        cfg = ReplayConfig(**spec.replay_options)
        res = run_replay(spec.nodes, work, scheduler, config=cfg, seed=seed, typical=typical)
        return RunOutput(policy, seed, res.metrics, None)
    raise ValueError(f"unknown mode {spec.mode!r}: expected packing or replay")


def choice_of(scheduler: Scheduler) -> dict[str, Any] | None:
    """What a ``best-of[...]`` scheduler chose (None for any other, or before it saw a cluster)."""
    from fedsched.common.sim.portfolio import BestOf

    if not isinstance(scheduler, BestOf) or scheduler.chosen is None:
        return None
    return {"chosen": scheduler.chosen, "simulated": dict(scheduler.simulated)}


def _run_star(args: tuple[EvalSpec, str, int]) -> RunOutput:
    return run_one(*args)


def evaluate(spec: EvalSpec, jobs: int | None = None,
             progress: Callable[[int, int, RunOutput], None] | None = None,
             cache: RunCache | None = None) -> dict[str, Any]:
    """Run every (policy, seed) and aggregate: ``{"policies": {NAME: {METRIC: {mean, ci95}}}}``.

    The result also carries ``runs`` (per-seed metrics), ``paired`` (every other policy against
    ``spec.reference`` seed by seed: :func:`fedsched.common.sim.paired.paired_against`; when the
    reference is among the policies) and, in packing mode, ``curves`` (mean allocation % against
    arrived % per policy) for the plot.

    With a ``cache`` (:class:`fedsched.common.sim.run_cache.RunCache`) the baselines' runs found
    in it are not replayed but one, replayed to check them (a mismatch replays them all); new
    baseline runs are stored (and the cache pruned to its size); ``cached_runs`` in the result
    counts the runs taken from it.
    """
    train, _ = split(spec)
    for p in spec.policies:  # fail fast on unknown names, before any worker starts
        make_policy(p, SchedulerContext(train_pods=train), spec.mode)
    tasks = [(spec, p, s) for p in spec.policies for s in spec.seeds]
    outputs: list[RunOutput] = []
    key = spec_key(spec) if cache is not None else ""
    hits: dict[tuple[str, int], RunOutput] = {}
    if cache is not None:
        for _, p, s in tasks:
            hit = cache.get(key, p, s)
            if hit is not None:
                hits[(p, s)] = hit
    check = next(iter(hits), None)  # the first cached run in task order: replayed to check the cache
    todo = [t for t in tasks if (t[1], t[2]) not in hits or (t[1], t[2]) == check]
    cached = [hits[(p, s)] for _, p, s in tasks if (p, s) in hits and (p, s) != check]

    def done(o: RunOutput) -> None:
        outputs.append(o)
        if progress:
            progress(len(outputs), len(tasks), o)

    ran = _run_tasks(todo, jobs, done)
    if check is None or agree(ran[check].metrics, hits[check].metrics):
        for o in cached:  # reported once the check has passed
            done(o)
    else:
        log.warning("run cache: %s seed %s replayed differs from its cached figures; replaying the %d "
                    "cached runs of this evaluation", check[0], check[1], len(cached))
        cached = []
        ran |= _run_tasks([t for t in tasks if (t[1], t[2]) in hits and (t[1], t[2]) != check], jobs, done)
    if cache is not None:
        stored = [cache.put(key, o) for o in ran.values()]
        if any(stored):  # a learned policy's runs are never stored: no scan of the cache for them
            cache.prune()
    result = aggregate(spec, outputs)
    if cache is not None:
        result["cached_runs"] = len(cached)
    return result


def _run_tasks(tasks: list[tuple[EvalSpec, str, int]], jobs: int | None,
               done: Callable[[RunOutput], None] | None) -> dict[tuple[str, int], RunOutput]:
    """Run ``tasks`` over ``jobs`` worker processes (in this process for one), ``done`` called on
    each output as it arrives."""
    out: dict[tuple[str, int], RunOutput] = {}
    if not tasks:
        return out
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))

    def take(o: RunOutput) -> None:
        out[(o.policy, o.seed)] = o
        if done is not None:
            done(o)

    if jobs == 1:
        for t in tasks:
            take(_run_star(t))
    else:
        with worker_pool(jobs) as pool:
            futures = [pool.submit(_run_star, t) for t in tasks]
            for f in as_completed(futures):
                take(f.result())
    return out


def aggregate(spec: EvalSpec, outputs: list[RunOutput]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "mode": spec.mode, "seeds": list(spec.seeds), "target_load": spec.target_load,
        "split": "none" if spec.test_fraction is None and spec.train_pods is None else "hash",
        "policies": {}, "runs": {}, "curves": {"x": [int(x) for x in CURVE_X]},
    }
    for p in spec.policies:
        runs = sorted((o for o in outputs if o.policy == p), key=lambda o: o.seed)
        result["runs"][p] = {str(o.seed): o.metrics for o in runs}
        if any(o.choice is not None for o in runs):
            result.setdefault("choices", {})[p] = {str(o.seed): o.choice for o in runs}
        result["policies"][p] = {}
        for m in METRICS:
            mean, ci = mean_ci95([o.metrics.get(m, float("nan")) for o in runs])
            result["policies"][p][m] = {"mean": mean, "ci95": ci}
        curves = [o.curve for o in runs if o.curve is not None]
        if curves:
            arr = np.array(curves)
            ok = ~np.isnan(arr)
            mean = np.where(ok.any(axis=0), np.nansum(arr, axis=0) / np.maximum(ok.sum(axis=0), 1), np.nan)
            result["curves"][p] = [float(v) for v in mean]
    if spec.reference in result["runs"] and len(spec.policies) > 1:
        result["reference"] = spec.reference
        result["paired"] = paired_against(result["runs"], spec.reference)
    return result


def format_table(result: dict[str, Any]) -> str:
    """Metrics as rows, policies as columns, ``mean ± ci95``; the best value marked ``*``."""
    pols = list(result["policies"])
    order = [m for m in METRICS if m not in LEGACY_COUNTERS] + list(LEGACY_COUNTERS)
    rows = [m for m in order if any(result["policies"][p][m]["mean"] == result["policies"][p][m]["mean"]
                                    for p in pols)]
    cells = {}
    for m in rows:
        means = {p: result["policies"][p][m]["mean"] for p in pols}
        valid = {p: v for p, v in means.items() if v == v}
        best = (max if m in HIGHER_IS_BETTER else min)(valid.values()) if valid else None
        for p in pols:
            v, ci = means[p], result["policies"][p][m]["ci95"]
            distinct = len(set(valid.values())) > 1
            mark = "*" if best is not None and v == best and distinct else " "
            cells[m, p] = "n/a" if v != v else f"{v:.2f} ± {ci:.2f}{mark}"
    label = {m: f"{m} (legacy)" if m in LEGACY_COUNTERS else m for m in rows}
    w0 = max(len(v) for v in label.values()) + 2
    widths = {p: max(len(p), *(len(cells[m, p]) for m in rows)) + 2 for p in pols}
    lines = ["metric".ljust(w0) + "".join(p.rjust(widths[p]) for p in pols)]
    lines.append("-" * len(lines[0]))
    for m in rows:
        lines.append(label[m].ljust(w0) + "".join(cells[m, p].rjust(widths[p]) for p in pols))
    n = len(result["seeds"])
    lines.append(f"({result['mode']}, {n} seeds, mean ± 95% CI half-width; * best; split: {result['split']})")
    for p, by_seed in result.get("choices", {}).items():
        chosen = sorted({c["chosen"] for c in by_seed.values() if c is not None})
        first = next(c for c in by_seed.values() if c is not None)
        sims = ", ".join(f"{m} {v:.2f}%" for m, v in first["simulated"].items())
        lines.append(f"{p}: the packing simulation of the statistics pods on this cluster chose "
                     f"{' / '.join(chosen)} (simulated allocation: {sims})")
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str | Path) -> None:
    def clean(x: Any) -> Any:
        if isinstance(x, float) and x != x:
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(clean(result), indent=2))


def plot(result: dict[str, Any], path: str | Path) -> None:
    """Allocation against arrived load, one line per policy (packing mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = np.array(result["curves"]["x"])
    drawn = 0
    for p in result["policies"]:
        if p in result["curves"]:
            ax.plot(x, result["curves"][p], label=p)
            drawn += 1
    if drawn == 0:  # replay: a bar chart of the headline metrics instead
        ms = ["alloc_cpu", "alloc_gpu", "util_mean"]
        pols = list(result["policies"])
        for k, m in enumerate(ms):
            ax.bar(np.arange(len(pols)) + k * 0.25, [result["policies"][p][m]["mean"] or 0 for p in pols],
                   width=0.25, label=m)
        ax.set_xticks(np.arange(len(pols)) + 0.25, pols, rotation=20)
        ax.set_ylabel("%")
    else:
        ax.plot(x, x, color="grey", lw=0.8, ls=":", label="arrived")
        ax.set_xlabel("arrived requests (% of capacity)")
        ax.set_ylabel("allocated (% of capacity)")
        ax.set_xlim(50, x.max())
        ax.set_ylim(50, 100)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(f"fedsched evaluate ({result['mode']}, {len(result['seeds'])} seeds)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
