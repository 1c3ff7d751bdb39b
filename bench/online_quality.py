"""Online quality: kube-default, the load-aware heuristics and two reference points on loaded
replay scenarios, judged by the online metrics (hot node-time, throttling, contended pod-time,
OOM kills, pending SLA, stranded resources), mean ± 95% CI over seeds.

Schedulers (columns):

- ``kube-default`` and every load-aware baseline of ``fedsched.common.schedulers.BASELINES``:
  ``target-load-packing`` (Trimaran), ``load-variation-risk-balancing`` (Trimaran) and
  ``koordinator-load-aware``; they are what users run today, and ``*`` marks the best of them;
- ``prefer-hot`` (``REFERENCES``): piles pods onto busy nodes; a metric on which it does not
  lose to kube-default rewards the wrong thing;
- the shipped learned policies (``learned``: batch packing, FGD-like; ``learned-td3``: the TD3
  weight policy; ``learned-online``: the online policy of ``agent/learning/online.py``), judged
  on clusters and workloads none of them was trained on;
- ``oracle`` (``fedsched.common.sim.replay.oracle``): reads the simulator's hidden usage
  parameters (every pod's true mean use, every node's true expected load) and picks the
  feasible node with the least expected CPU use after placement plus half the use its free
  requests will bring at the workload's mean use per request, memory as an OOM guard. No real
  scheduler knows what it knows; its figures say how much room better predictions of use give.
  It is greedy and scores means (no cycle, no noise), so it is a reference, not a bound: where
  a heuristic beats it, the heuristic's measurement of current use carries what it ignores.
  The ``oracle vs best`` column is its relative gap to the best heuristic per metric.
  ``oracle-app`` and ``oracle-workload`` (``--policies``) apply its rule knowing only each
  application's true use per request, or only requests: what each part of its knowledge is worth.

Scenarios (rows of :data:`SCENARIOS`): the synthetic member profiles
(``common/model/synthetic.py``) and the openb trace at the sizes real clusters have (web 200
nodes, GPU training 100, edge 40, openb a 150-node slice: see its note), 24 h or more of trace
each, at a requested load where kube-default really runs into trouble (85% of capacity, daily
peaks, bursting best-effort pods). ``--quick`` uses 8-10-node variants: a smoke test of the
benchmark, never a result (their intervals cannot separate the oracle from kube-default).
Every run is one ``fedsched.common.sim.evaluate`` run (the same harness as ``fedsched evaluate``):
the pods are split by a stable hash of their names, the schedulers' statistics come from the train
part and the replayed workload is the held-out *test* part (30%). The requested load is the test
workload's, solved by the replay's ``target_load`` (an unreachable target is an error); the
reached load is printed (``offered_load_pct``), with kube-default's hot CPU node-time as a share
of all node-time.

    python bench/online_quality.py [--quick] [--seeds N] [--scenarios web,gpu] [--json OUT]

The baselines' runs are kept in the run cache (``fedsched.common.sim.run_cache``; ``--run-cache
DIR``, ``--no-run-cache``): a second run with another learned policy replays only that policy and
one cached run, replayed to check the rest (the tables say how many came from the cache; the
scenario's time is then not a full run's).

Every scheduler is also compared with kube-default seed by seed (one seed replays one workload
for every scheduler, so the difference is the decisions' alone): the second table of each
scenario gives the paired trouble score (``fedsched.common.sim.paired``, the comparison the
roll-out gate and the federation's verdicts use) and each trouble metric's log ratio, mean ± 95%
half-width, then the benchmark's checks of its own power (:func:`acceptance`): the oracle's gap in
hot CPU node-time separated from 0 where it is 10% or more, every trouble half-width at most
0.05, prefer-hot significantly worse on every headline figure.

Progress goes to stderr, tables to stdout; ``--json`` writes every run (per seed), the
aggregates, the paired figures with their per-seed values, the checks, the scenario parameters
and the provenance (commit, dirty files, machine). ``--policies`` adds learned policies
(checkpoints) as further columns.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import asdict
from typing import Any

import numpy as np
from harness.provenance import git_commit, machine, strict_json, write_json

from fedsched.common.model.load_metrics import LOAD_METRICS
from fedsched.common.model.metrics import (
    FAILED_REQUESTS,
    HIGHER_IS_BETTER,
    LEGACY_COUNTERS,
    TROUBLE_SMOOTHING,
)
from fedsched.common.model.traces import split_by_hash
from fedsched.common.schedulers import (
    BASELINES,
    LEARNED,
    LEARNED_ONLINE,
    LEARNED_TD3,
    SchedulerContext,
    split_names,
)
from fedsched.common.sim.evaluate import EvalSpec, RunOutput, evaluate, make_policy
from fedsched.common.sim.paired import TROUBLE, paired_against
from fedsched.common.sim.replay import ReplayConfig, replay_workload
from fedsched.common.sim.replay.oracle import ORACLE
from fedsched.common.sim.run_cache import RunCache
from fedsched.common.sim.scenarios import HELDOUT, SCENARIOS, TEST_FRACTION, Scenario, build

HEURISTICS = [
    "kube-default", "target-load-packing", "load-variation-risk-balancing", "koordinator-load-aware",
]
# The shipped learned policies: the batch-packing one (FGD-like), the TD3 weight policy and the
# online one (agent/learning/online.py); what each would do if served on these clusters.
LEARNED_POLICIES = [LEARNED, LEARNED_TD3, LEARNED_ONLINE]
POLICIES = [*HEURISTICS, "prefer-hot", ORACLE, *LEARNED_POLICIES]
assert all(p in BASELINES for p in HEURISTICS)
# Rows of the table: the online metrics, then pending and failures, then the legacy counters.
ROWS = [*LOAD_METRICS, "failed_pods", *FAILED_REQUESTS, "pending_p99_s", "util_mean", *LEGACY_COUNTERS]


def describe(sc: Scenario, spec: EvalSpec, quick: bool) -> dict[str, Any]:
    """The parameters a reader needs, and the run span (the workload's end, seed 0)."""
    v = sc.variant(quick)
    _, work = split_by_hash(spec.pods, TEST_FRACTION)  # what evaluate replays
    wl = replay_workload(work, spec.nodes, ReplayConfig(**spec.replay_options), np.random.default_rng(0))
    n = spec.nodes
    return {
        "source": sc.source, "seed": sc.seed, "why": sc.why, "notes": sc.notes,
        "cluster": {k: list(x) if isinstance(x, tuple) else x for k, x in v.cluster.items()},
        "replay": dict(v.replay), "nodes": len(n), "cores": float(n.cpu.sum()) / 1000.0,
        "gpus": int(n.gpu.sum()), "pods": len(spec.pods), "test_pods": len(work),
        "replayed_pods": len(wl.pod), "span_s": wl.end, "duration_scale": wl.duration_scale,
        "split": f"hash, test fraction {TEST_FRACTION} (replayed: the test part)",
    }


def _fmt(v: float) -> str:
    if v != v:
        return "n/a"
    a = abs(v)
    if a >= 1e5:
        return f"{v:.3g}"
    return f"{v:.0f}" if a >= 100 else f"{v:.2f}"


def gaps(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per metric: the best heuristic, its mean, the oracle's mean and the relative gap."""
    pols = res["policies"]
    out: dict[str, dict[str, Any]] = {}
    for m in ROWS:
        hv = {p: pols[p][m]["mean"] for p in HEURISTICS if p in pols and not math.isnan(pols[p][m]["mean"])}
        if not hv or ORACLE not in pols:
            continue
        best = (max if m in HIGHER_IS_BETTER else min)(hv, key=hv.get)
        o, b = pols[ORACLE][m]["mean"], hv[best]
        rel = (o - b) / abs(b) if b else (0.0 if o == b else math.copysign(math.inf, o - b))
        out[m] = {"best_heuristic": best, "best_mean": b, "oracle_mean": o, "oracle_minus_best": o - b,
                  "relative": rel}
    return out


def table(name: str, res: dict[str, Any], info: dict[str, Any]) -> str:
    pols = [p for p in POLICIES if p in res["policies"]] + [p for p in res["policies"] if p not in POLICIES]
    data = res["policies"]
    rows = [m for m in ROWS if any(data[p][m]["mean"] == data[p][m]["mean"] for p in pols)]
    gap = gaps(res)
    cells: dict[tuple[str, str], str] = {}
    for m in rows:
        hv = [data[p][m]["mean"] for p in HEURISTICS if p in data and not math.isnan(data[p][m]["mean"])]
        best = (max if m in HIGHER_IS_BETTER else min)(hv) if hv else None
        distinct = len(set(hv)) > 1
        for p in pols:
            v, ci = data[p][m]["mean"], data[p][m]["ci95"]
            mark = "*" if p in HEURISTICS and best is not None and v == best and distinct else " "
            cells[m, p] = "n/a" if v != v else f"{_fmt(v)} ± {_fmt(ci)}{mark}"
        g = gap.get(m)
        cells[m, "gap"] = ("" if g is None else
                           "=" if g["oracle_minus_best"] == 0 else
                           f"{100 * g['relative']:+.0f}%" if math.isfinite(g["relative"]) else
                           f"{g['oracle_minus_best']:+.3g}")
    cols = [*pols, "gap"]
    head = {p: p for p in pols} | {"gap": "oracle vs best"}
    label = {m: f"{m} (legacy)" if m in LEGACY_COUNTERS else m for m in rows}
    w0 = max(len(x) for x in label.values()) + 2
    widths = {c: max(len(head[c]), *(len(cells[m, c]) for m in rows)) + 2 for c in cols}
    kube = data.get("kube-default", {}).get("hot_cpu_node_s", {}).get("mean", math.nan)
    node_time = info["nodes"] * info["span_s"]
    off = [data[p]["offered_load_pct"]["mean"] for p in pols]
    lines = [
        f"== {name}: {info['nodes']} nodes ({info['cores']:.0f} cores, {info['gpus']} GPUs), "
        f"{info['replayed_pods']} of {info['test_pods']} held-out test pods replayed "
        f"({info['pods']} in all), span {info['span_s'] / 3600:.1f} h ==",
        f"   {info['why']}",
        f"   cluster {info['cluster']}; replay {info['replay']}; duration scale {info['duration_scale']:.3g}",
        f"   offered (requested) load {np.nanmean(off):.1f}% of capacity; kube-default hot CPU node-time "
        f"{kube / 3600:.1f} node-h = {100 * kube / node_time:.1f}% of all node-time",
    ]
    lines += [f"   note: {x}" for x in info["notes"]]
    lines.append("metric".ljust(w0) + "".join(head[c].rjust(widths[c]) for c in cols))
    lines.append("-" * len(lines[-1]))
    for m in rows:
        lines.append(label[m].ljust(w0) + "".join(cells[m, c].rjust(widths[c]) for c in cols))
    lines.append(f"({len(res['seeds'])} seeds, mean ± 95% CI half-width; lower is better except util_mean; "
                 f"* best heuristic; 'oracle vs best': (oracle - best heuristic) / best heuristic, the "
                 f"difference itself where the best is 0)")
    return "\n".join(lines)


PAIRED_COLUMNS = (TROUBLE, *TROUBLE_SMOOTHING)
HEADLINE = (TROUBLE, "hot_cpu_node_s", "throttled_cpu_core_s")
"""The figures on which prefer-hot must lose to kube-default, significantly (the benchmark's own
check: a metric prefer-hot does not lose on cannot tell a good scheduler from a bad one)."""
TROUBLE_HALF_WIDTH = 0.05  # the paired 95% half-width of the trouble score every policy must reach
ORACLE_MIN_GAP = 0.10  # an oracle gap in hot CPU node-time of 10% or more must be significant


def _paired_cell(x: dict[str, Any]) -> str:
    return "n/a" if x["mean"] != x["mean"] else f"{x['mean']:+.3f} ± {x['ci95']:.3f}"


def paired_figure(paired: dict[str, Any], metric: str) -> dict[str, Any]:
    """The trouble score, or a trouble metric's log ratio, from one policy's paired figures."""
    return paired[TROUBLE] if metric == TROUBLE else paired["log_ratio"][metric]


def acceptance(res: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's power, per scenario: does it separate what must be separated?

    - ``oracle_hot``: where the oracle's mean gap in hot CPU node-time to kube-default is 10% or
      more (``|exp(mean log ratio) - 1|``), its paired 95% interval excludes 0;
    - ``trouble_half_width``: every policy's paired 95% half-width of the trouble score is at
      most 0.05 (the policies above it listed with their widths);
    - ``prefer_hot_worse``: prefer-hot is significantly worse than kube-default on every
      :data:`HEADLINE` figure.
    A goal whose policy did not run is ``None``.
    """
    paired = res.get("paired", {})
    out: dict[str, Any] = {}
    if ORACLE in paired:
        hot = paired[ORACLE]["log_ratio"]["hot_cpu_node_s"]
        gap = math.expm1(hot["mean"]) if hot["mean"] == hot["mean"] else math.nan
        needs = abs(gap) >= ORACLE_MIN_GAP
        out["oracle_hot"] = {"log_ratio": hot["mean"], "ci95": hot["ci95"], "gap": gap,
                             "must_separate": needs, "met": (hot["verdict"] != "tie") if needs else True}
    widths = {p: d[TROUBLE]["ci95"] for p, d in paired.items()}
    wide = {p: w for p, w in widths.items() if not w <= TROUBLE_HALF_WIDTH}
    out["trouble_half_width"] = {"goal": TROUBLE_HALF_WIDTH, "widths": widths, "too_wide": wide,
                                 "met": not wide if widths else None}
    if "prefer-hot" in paired:
        v = {m: paired_figure(paired["prefer-hot"], m)["verdict"] for m in HEADLINE}
        out["prefer_hot_worse"] = {"verdicts": v, "met": all(x == "worse" for x in v.values())}
    return out


def paired_table(res: dict[str, Any]) -> str:
    """Each policy against kube-default seed by seed: the trouble score and each trouble metric's
    log ratio, mean ± 95% half-width, with the verdict on the trouble score; then the checks."""
    paired = res.get("paired", {})
    if not paired:
        return ""
    pols = [p for p in POLICIES if p in paired] + [p for p in paired if p not in POLICIES]
    head = {TROUBLE: "trouble score", **{m: f"log {m}" for m in TROUBLE_SMOOTHING}}
    cells = {(p, c): _paired_cell(paired_figure(paired[p], c)) for p in pols for c in PAIRED_COLUMNS}
    w0 = max(len(p) for p in pols) + 2
    widths = {c: max(len(head[c]), *(len(cells[p, c]) for p in pols)) + 2 for c in PAIRED_COLUMNS}
    lines = [f"paired against {res['reference']} (same seeds): mean ± 95% half-width of the per-seed "
             f"difference; below 0 is better",
             "scheduler".ljust(w0) + "".join(head[c].rjust(widths[c]) for c in PAIRED_COLUMNS) + "  verdict"]
    lines.append("-" * len(lines[-1]))
    for p in pols:
        lines.append(p.ljust(w0) + "".join(cells[p, c].rjust(widths[c]) for c in PAIRED_COLUMNS)
                     + f"  {paired[p][TROUBLE]['verdict']}")
    acc = acceptance(res)
    if "oracle_hot" in acc:
        o = acc["oracle_hot"]
        lines.append(f"check oracle hot CPU node-time: gap {100 * o['gap']:+.0f}% (log ratio "
                     f"{o['log_ratio']:+.3f} ± {o['ci95']:.3f}); "
                     + ("must exclude 0: " + ("met" if o["met"] else "MISSED") if o["must_separate"]
                        else "under 10%, nothing to separate"))
    t = acc["trouble_half_width"]
    too_wide = ", ".join(f"{p} {w:.3f}" for p, w in t["too_wide"].items())
    lines.append(f"check trouble half-width <= {TROUBLE_HALF_WIDTH}: "
                 + ("met" if t["met"] else f"MISSED, {too_wide}"))
    if "prefer_hot_worse" in acc:
        h = acc["prefer_hot_worse"]
        lines.append("check prefer-hot significantly worse: " + ("met" if h["met"] else "MISSED")
                     + " (" + ", ".join(f"{m} {v}" for m, v in h["verdicts"].items()) + ")")
    return "\n".join(lines)


GOAL_MARGIN = 0.10  # trouble score below the best heuristic's, interval clear
GOAL_HOT_RATIO = 0.8  # hot CPU node-time against the best heuristic's
GUARDRAILS = ("oom_kills_per_1k_starts", "throttled_cpu_core_s", "failed_pods", "pending_p99_s")


def best_heuristic(res: dict[str, Any]) -> str:
    """The heuristic with the lowest mean paired trouble score against kube-default (which
    scores 0 against itself): the scheduler a learned policy has to beat on this scenario."""
    paired = res.get("paired", {})
    scores = {h: (0.0 if h == res.get("reference") else paired[h][TROUBLE]["mean"])
              for h in HEURISTICS if h == res.get("reference") or h in paired}
    return min(scores, key=lambda h: scores[h])


def learning_goals(res: dict[str, Any]) -> dict[str, Any]:
    """Every learned policy (and the oracle) against the scenario's best heuristic, seed by seed
    on the same runs: its trouble score's difference (goal: at most -``GOAL_MARGIN``, the 95%
    interval's upper end below it), its hot CPU node-time ratio ``exp(mean log ratio)`` (goal:
    at most ``GOAL_HOT_RATIO``, the interval's upper end too), and the guardrails against
    kube-default (no metric of ``GUARDRAILS`` significantly worse: OOM kills, throttling and
    failed pods in log ratio, pending p99 as a difference), with what the failed pods requested
    beside their count (``failed_requests``: the paired difference from kube-default)."""
    runs, paired = res.get("runs", {}), res.get("paired", {})
    if not paired or "reference" not in res:
        return {}
    best = best_heuristic(res)
    against = paired_against(runs, best)
    out: dict[str, Any] = {"best_heuristic": best, "policies": {}}
    for p in against:
        if p in HEURISTICS or p == "prefer-hot":
            continue
        t = against[p][TROUBLE]
        hot = against[p]["log_ratio"]["hot_cpu_node_s"]
        worse = []
        kd = paired.get(p, {})
        for m in GUARDRAILS:
            fig = kd.get("log_ratio", {}).get(m) or kd.get("diff", {}).get(m)
            if fig is not None and fig["verdict"] == "worse":
                worse.append(m)
        out["policies"][p] = {
            "trouble_vs_best": {k: t[k] for k in ("mean", "ci95", "n", "verdict")},
            "trouble_goal_met": bool(t["n"] >= 2 and t["mean"] + t["ci95"] <= -GOAL_MARGIN),
            "hot_ratio_vs_best": math.exp(hot["mean"]),
            "hot_ratio_interval": [math.exp(hot["mean"] - hot["ci95"]), math.exp(hot["mean"] + hot["ci95"])],
            "hot_goal_met": bool(hot["n"] >= 2 and math.exp(hot["mean"] + hot["ci95"]) <= GOAL_HOT_RATIO),
            "guardrails_worse": worse,
            "failed_requests": {m: {k: kd["diff"][m][k] for k in ("mean", "ci95", "n", "verdict")}
                                for m in FAILED_REQUESTS if m in kd.get("diff", {})},
        }
    return out


def goals_table(goals: dict[str, Any]) -> str:
    if not goals:
        return ""
    lines = [f"against the best heuristic ({goals['best_heuristic']}), same seeds: trouble score difference "
             f"(goal <= -{GOAL_MARGIN:.2f}, interval clear), hot CPU node-time ratio (goal <= "
             f"{GOAL_HOT_RATIO}, interval clear), guardrails against kube-default ({', '.join(GUARDRAILS)})"]
    for p, g in goals["policies"].items():
        t = g["trouble_vs_best"]
        lo, hi = g["hot_ratio_interval"]
        rails = "all held" if not g["guardrails_worse"] else "WORSE: " + ", ".join(g["guardrails_worse"])
        lines.append(f"  {p}: trouble {t['mean']:+.3f} ± {t['ci95']:.3f} "
                     f"({'met' if g['trouble_goal_met'] else 'missed'}); "
                     f"hot CPU x{g['hot_ratio_vs_best']:.2f} [{lo:.2f}, {hi:.2f}] "
                     f"({'met' if g['hot_goal_met'] else 'missed'}); guardrails {rails}"
                     + "".join(f"; {m} {f['mean']:+.1f} ± {f['ci95']:.1f} ({f['verdict']})"
                               for m, f in g.get("failed_requests", {}).items() if f["mean"] or f["ci95"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 seeds and the smaller scenario variants")
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds per scheduler (default: the scenario's, 60; 5-8 --heldout, 3 --quick)")
    ap.add_argument("--scenarios", default=None,
                    help=f"comma-separated scenario names (default: all of {', '.join(SCENARIOS)}; with "
                         f"--heldout all of {', '.join(HELDOUT)})")
    ap.add_argument("--heldout", action="store_true",
                    help="the scenarios outside the online policy's training ranges (HELDOUT)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="comma-separated schedulers (default: all)")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: the CPU count)")
    ap.add_argument("--json", dest="json_out", help="write every run and the aggregates here")
    ap.add_argument("--run-cache", default=None,
                    help="where the baselines' runs are cached between runs (default: FEDSCHED_RUN_CACHE, "
                         "else ~/.cache/fedsched/runs); one cached run is replayed to check the rest; the "
                         "least recently used go past FEDSCHED_RUN_CACHE_MAX_MB (default 1000)")
    ap.add_argument("--no-run-cache", action="store_true", help="replay every scheduler")
    args = ap.parse_args(argv)
    catalogue = HELDOUT if args.heldout else SCENARIOS
    names = [s for s in (args.scenarios or ",".join(catalogue)).split(",") if s]
    unknown = [s for s in names if s not in catalogue]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(catalogue)}")
    try:
        policies = split_names(args.policies)
    except ValueError as e:
        ap.error(f"--policies: {e}")
    for p in policies:  # learned policies (checkpoints) are welcome too: any name evaluate takes
        try:
            make_policy(p, SchedulerContext(), "replay")
        except (ValueError, TypeError, OSError) as e:
            ap.error(f"scheduler {p!r}: {e}")
    if args.seeds is not None and args.seeds < 1:
        ap.error("--seeds must be at least 1 (one seed runs, but has no interval and no verdict)")
    jobs = args.jobs or os.cpu_count() or 1
    try:
        cache = None if args.no_run_cache else RunCache(args.run_cache)
    except ValueError as e:
        ap.error(f"--run-cache: {e}")
    t_all = time.time()
    out: dict[str, Any] = {
        "benchmark": "online_quality", "quick": args.quick, "heldout": args.heldout, "policies": policies,
        "heuristics": HEURISTICS, "provenance": {**git_commit(), "machine": machine()},
        "scenarios": {},
    }
    for name in names:
        sc = catalogue[name]
        spec = build(sc, args.quick)
        n_seeds = args.seeds if args.seeds is not None else (3 if args.quick else sc.seeds)
        spec.policies, spec.seeds = policies, list(range(42, 42 + n_seeds))
        info = describe(sc, spec, args.quick)
        t0 = time.time()
        print(f"[{name}] {info['nodes']} nodes, {info['replayed_pods']} pods, "
              f"{len(policies)} schedulers x {n_seeds} seeds on {jobs} workers",
              file=sys.stderr, flush=True)

        def progress(k: int, n: int, o: RunOutput, name: str = name, t0: float = t0) -> None:
            hot = o.metrics["hot_cpu_node_s"] / 3600
            print(f"[{name}] {k}/{n} {o.policy} seed {o.seed}: hot_cpu {hot:.1f} "
                  f"node-h, offered {o.metrics['offered_load_pct']:.1f}% ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)

        res = evaluate(spec, jobs=jobs, progress=progress, cache=cache)
        res.pop("curves", None)
        wall = time.time() - t0
        goals = learning_goals(res)
        cached = f", {res['cached_runs']} runs from the run cache" if res.get("cached_runs") else ""
        print(table(name, res, info) + "\n" + paired_table(res) + "\n" + goals_table(goals)
              + f"\n({wall:.0f} s{cached})\n", flush=True)
        kube = res["policies"].get("kube-default", {}).get("hot_cpu_node_s", {}).get("mean", math.nan)
        out["scenarios"][name] = {
            "parameters": info, "wall_s": wall, "result": res, "oracle_gap": gaps(res),
            "acceptance": acceptance(res), "learning_goals": goals,
            "kube_default_hot_cpu_node_h": kube / 3600.0,
            "kube_default_hot_cpu_share_pct": 100.0 * kube / (info["nodes"] * info["span_s"]),
        }
        if args.json_out:  # as we go: a long run keeps what it finished
            write_json(args.json_out, strict_json(out), default=_json_default)
    out["wall_s"] = time.time() - t_all
    if args.json_out:
        write_json(args.json_out, strict_json(out), default=_json_default)
    print(f"total {out['wall_s']:.0f} s", file=sys.stderr)
    return 0


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if hasattr(x, "__dataclass_fields__"):
        return asdict(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


if __name__ == "__main__":
    sys.exit(main())
