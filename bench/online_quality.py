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

Scenarios (rows of :data:`SCENARIOS`; ``--quick`` uses the smaller variant of each): the
synthetic member profiles (``common/model/synthetic.py``) and the openb trace, each at a
requested load where kube-default really runs into trouble (60-85% of capacity, daily peaks,
bursting best-effort pods). Every run is one ``fedsched.common.sim.evaluate`` run (the same
harness as ``fedsched evaluate``): the pods are split by a stable hash of their names, the
schedulers' statistics come from the train part and the replayed workload is the held-out
*test* part (30%). The requested load is the test workload's, solved by the replay's
``target_load`` (an unreachable target is an error); the reached load is printed
(``offered_load_pct``), with kube-default's hot CPU node-time as a share of all node-time.

    python bench/online_quality.py [--quick] [--seeds N] [--scenarios web,gpu] [--json OUT]

``--quick`` (3 seeds, the quick variants) takes about 75 s on a shared 2-core machine; the full
run (10 seeds) about 5 minutes. Progress goes to stderr, tables to stdout; ``--json`` writes
every run (per seed), the aggregates, the scenario parameters and the provenance (commit, dirty
files, machine). ``--policies`` adds learned policies (checkpoints) as further columns.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from harness.provenance import git_commit, machine, strict_json, write_json

from fedsched.common.model.load_metrics import LOAD_METRICS
from fedsched.common.model.metrics import HIGHER_IS_BETTER, LEGACY_COUNTERS
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.model.traces import (
    builtin_trace,
    fits_somewhere,
    load_nodes,
    load_pods,
    slice_cluster,
    split_by_hash,
)
from fedsched.common.schedulers import BASELINES, LEARNED, LEARNED_ONLINE, LEARNED_TD3, SchedulerContext
from fedsched.common.sim.evaluate import EvalSpec, RunOutput, evaluate, make_policy
from fedsched.common.sim.replay import ReplayConfig, replay_workload
from fedsched.common.sim.replay.oracle import ORACLE

HEURISTICS = [
    "kube-default", "target-load-packing", "load-variation-risk-balancing", "koordinator-load-aware",
]
# The shipped learned policies: the batch-packing one (FGD-like), the TD3 weight policy and the
# online one (agent/learning/online.py); what each would do if served on these clusters.
LEARNED_POLICIES = [LEARNED, LEARNED_TD3, LEARNED_ONLINE]
POLICIES = [*HEURISTICS, "prefer-hot", ORACLE, *LEARNED_POLICIES]
assert all(p in BASELINES for p in HEURISTICS)
TEST_FRACTION = 0.3
# Rows of the table: the online metrics, then pending and failures, then the legacy counters.
ROWS = [*LOAD_METRICS, "failed_pods", "pending_p99_s", "util_mean", *LEGACY_COUNTERS]


@dataclass(frozen=True)
class Variant:
    """One size of a scenario: how the cluster is built and replayed."""

    cluster: dict[str, Any]  # synthetic: generate_cluster overrides; openb: {"slice": k, "pods": list}
    replay: dict[str, Any]  # ReplayConfig fields


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str  # a synthetic profile name, or "openb"
    seed: int  # generator seed (synthetic) or node-slice seed (openb)
    why: str
    full: Variant
    quick: Variant
    notes: list[str] = field(default_factory=list)

    def variant(self, quick: bool) -> Variant:
        return self.quick if quick else self.full


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario(
        "web", "web", 7,
        "CPU-only web serving with 1-core median services (up to 8 cores): 85% of CPU requested, "
        "arrivals with a daily cycle (rate 1.3:0.7), the usage model's class-wide afternoon peak",
        full=Variant({"n_nodes": 8, "n_pods": 15000, "trace_hours": 72.0, "cpu_median_milli": 1000.0,
                      "cpu_max_milli": 8000, "diurnal_amplitude": 0.3}, {"target_load": 0.85}),
        quick=Variant({"n_nodes": 8, "n_pods": 5000, "trace_hours": 24.0, "cpu_median_milli": 1000.0,
                       "cpu_max_milli": 8000, "diurnal_amplitude": 0.3}, {"target_load": 0.85})),
    Scenario(
        "gpu", "gpu", 7,
        "GPU training and inference with CPU-side work: 40% CPU-only pods of 8 cores (data "
        "preparation), 30% GPU-sharing pods, jobs with 8 cores per GPU, 25% best-effort pods; "
        "85% of the GPUs requested",
        full=Variant({"n_nodes": 10, "n_pods": 2400, "cores_per_gpu_median": 8.0, "cpu_pod_fraction": 0.4,
                      "share_fraction": 0.3, "cpu_pod_cpu_median_milli": 8000.0,
                      "qos_weights": (0.25, 0.45, 0.2, 0.1), "trace_hours": 48.0}, {"target_load": 0.85}),
        quick=Variant({"n_nodes": 10, "n_pods": 1200, "cores_per_gpu_median": 8.0, "cpu_pod_fraction": 0.4,
                       "share_fraction": 0.3, "cpu_pod_cpu_median_milli": 8000.0,
                       "qos_weights": (0.25, 0.45, 0.2, 0.1), "trace_hours": 24.0}, {"target_load": 0.85}),
        notes=["target_load is measured in GPU (the cluster has GPUs)"]),
    Scenario(
        "edge", "edge", 7,
        "small edge nodes (4-8 cores) with 0.6-core median pods: 85% of CPU requested, half the pods "
        "best-effort (bursting into idle CPU up to 4x their request), arrivals in bursts of a minute",
        full=Variant({"n_nodes": 8, "n_pods": 6000, "gpu_node_fraction": 0.0, "trace_hours": 24.0,
                      "cpu_median_milli": 600.0, "cpu_max_milli": 3000, "mem_median_mib": 512.0},
                     {"target_load": 0.85}),
        quick=Variant({"n_nodes": 8, "n_pods": 2000, "gpu_node_fraction": 0.0, "trace_hours": 8.0,
                       "cpu_median_milli": 600.0, "cpu_max_milli": 3000, "mem_median_mib": 512.0},
                      {"target_load": 0.85}),
        notes=["gpu_node_fraction 0: target_load is then CPU (with edge GPUs it would be GPU share)"]),
    Scenario(
        "openb", "openb", 7,
        "the openb default trace (42% best-effort pods) on a node slice of the full cluster (CPU and "
        "GPU nodes), durations scaled to 85% of the GPUs requested",
        full=Variant({"slice": 60, "pods": "openb_pod_list_default.csv"},
                     {"start_quantile": 0.01, "time_compression": 10.0, "target_load": 0.85}),
        quick=Variant({"slice": 60, "pods": "openb_pod_list_default.csv"},
                      {"start_quantile": 0.01, "time_compression": 10.0, "target_load": 0.85,
                       "max_pods": 1200}),
        notes=["node slice of openb_node_list_all_node.csv (slice_cluster, seed = scenario seed); "
               "pods that fit no node of the slice dropped; target_load is measured in GPU"]),
)}


def build(sc: Scenario, quick: bool) -> EvalSpec:
    """The scenario's cluster and pod list as an :class:`EvalSpec` (policies and seeds empty)."""
    v = sc.variant(quick)
    if sc.source == "openb":
        all_nodes = load_nodes(builtin_trace("openb_node_list_all_node.csv"))
        nodes = slice_cluster(all_nodes, int(v.cluster["slice"]), sc.seed)
        pods = fits_somewhere(load_pods(builtin_trace(v.cluster["pods"]), all_nodes), nodes)
    else:
        nodes, pods = generate_cluster(sc.source, sc.seed, **dict(v.cluster))
    return EvalSpec(nodes=nodes, pods=pods, policies=[], seeds=[], mode="replay",
                    test_fraction=TEST_FRACTION, replay_options=dict(v.replay))


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 seeds and the smaller scenario variants")
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds per scheduler (default 10; 3 with --quick)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated scenario names")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="comma-separated schedulers (default: all)")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: the CPU count)")
    ap.add_argument("--json", dest="json_out", help="write every run and the aggregates here")
    args = ap.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:  # learned policies (checkpoints) are welcome too: any name evaluate takes
        try:
            make_policy(p, SchedulerContext(), "replay")
        except (ValueError, TypeError, OSError) as e:
            ap.error(f"scheduler {p!r}: {e}")
    n_seeds = args.seeds if args.seeds is not None else (3 if args.quick else 10)
    seeds = list(range(42, 42 + n_seeds))
    jobs = args.jobs or os.cpu_count() or 1
    t_all = time.time()
    out: dict[str, Any] = {
        "benchmark": "online_quality", "quick": args.quick, "seeds": seeds, "policies": policies,
        "heuristics": HEURISTICS, "provenance": {**git_commit(), "machine": machine()},
        "scenarios": {},
    }
    for name in names:
        sc = SCENARIOS[name]
        spec = build(sc, args.quick)
        spec.policies, spec.seeds = policies, seeds
        info = describe(sc, spec, args.quick)
        t0 = time.time()
        print(f"[{name}] {info['nodes']} nodes, {info['replayed_pods']} pods, "
              f"{len(policies)} schedulers x {len(seeds)} seeds on {jobs} workers",
              file=sys.stderr, flush=True)

        def progress(k: int, n: int, o: RunOutput, name: str = name, t0: float = t0) -> None:
            hot = o.metrics["hot_cpu_node_s"] / 3600
            print(f"[{name}] {k}/{n} {o.policy} seed {o.seed}: hot_cpu {hot:.1f} "
                  f"node-h, offered {o.metrics['offered_load_pct']:.1f}% ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)

        res = evaluate(spec, jobs=jobs, progress=progress)
        res.pop("curves", None)
        wall = time.time() - t0
        print(table(name, res, info) + f"\n({wall:.0f} s)\n", flush=True)
        kube = res["policies"].get("kube-default", {}).get("hot_cpu_node_s", {}).get("mean", math.nan)
        out["scenarios"][name] = {
            "parameters": info, "wall_s": wall, "result": res, "oracle_gap": gaps(res),
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
