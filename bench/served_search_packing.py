"""The decision-time search and the packing check as a serving agent runs them, on the packing
table's protocol.

``bench/agent_quality.py --policy lookahead:learned`` measures the search with its arrivals drawn
from the workload's statistics pods. A serving agent has none: ``fedsched serve --search`` draws
them from the pods it was asked to place (``agent/serving/search.py``). This replays a packing
scenario of the table (default ``packing/openb-default``: its test pods, 130% arrived, the table's
seeds) through the agent itself: each arriving pod is a filter and a prioritize request to a
:class:`~fedsched.agent.serving.decider.Decider` (in process, no HTTP; early ranking on, as served;
the roll-out gate off: the policy's own path is what is measured) whose cache holds every earlier
placement, and is sent the nodes the pod fits (kube-scheduler's own filters run before the
extender's); the node it picks is bound in the simulator and in the cache, on the GPUs the model
chooses. The agent's safety filter runs too; packing mode has no usage model, so the cache's use
is the pods' requests (a cluster without telemetry) and the default 90% thresholds would refuse
every node 90% requested, which a packing cluster fills on purpose: ``--cpu-threshold`` and
``--mem-threshold`` default to 1.0 here (refusals still counted).

``--packing-check BASELINE`` serves with ``fedsched serve --packing-check`` (``--search ""``: the
model alone): the agent answers kube-default's scores (shadow mode) until its simulation of the pods
asked for so far shows the model allocating more than the baseline with evidence, and the pod is
bound where that answer puts it, on kube-default's GPUs. The run waits for the check's simulation
when one starts: the pods of a GPU cluster arrive over days, the simulation takes a minute (with
``--search`` on too the check simulates the search over the model, tens of minutes per check at
1,213 nodes: ``bench/packing_check_cost.py``).
``--packing-alternatives`` (``fedsched serve``'s, FGD by default; ``off``) are simulated beside
the model, and where one of them is proven and allocates the most it answers instead, its pick bound
on the GPUs it chooses (the roll-out gate is off here, as everywhere in this benchmark). At a
re-check what served before keeps serving unless another candidate is proven to allocate more
than it; ``--no-incumbent`` has each verdict choose afresh, to compare (per seed the run counts the
switches between candidates).

The figures are paired by seed with the columns of an ``agent_quality`` JSON (``--pair``, the same
scenario and seeds): what serving changes against the policy measured in the benchmark, and
against FGD and kube-default.

    python bench/served_search_packing.py [--search default|""] [--packing-check kube-default]
        [--packing-alternatives fgd|off] [--no-incumbent] [--policy learned] [--scenario cpubound/openb-1]
        [--seeds 10] [--jobs 2]
        [--pair bench/results/agent_quality_lookahead_learned.json] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
from agent_quality import scenario_spec
from harness.provenance import write_json

from fedsched.cli.serve import packing_alternatives
from fedsched.common.compute import single_threaded
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.metrics import mean_ci95
from fedsched.common.sim.evaluate import split

SEED0 = 42  # the packing table's first seed
RESULTS = ("switched", "kept", "single", "no-pool")


def run_seed(scenario: str, policy: str, search: str, seed: int, cpu_threshold: float,
             mem_threshold: float, max_pods: int | None = None, packing_check: str | None = None,
             alternatives: tuple[str, ...] = (), keep_incumbent: bool = True) -> dict[str, Any]:
    """One packing run through the agent; its metrics, what the search did, what the filter refused
    and, with the packing check, the decisions per source and the check's verdict."""
    from fedsched.agent.cluster.cache import ClusterCache
    from fedsched.agent.cluster.k8s_objects import pod_to_json
    from fedsched.agent.serving.decider import Decider, DeciderConfig, SafetyConfig
    from fedsched.agent.serving.model_store import ModelStore
    from fedsched.cli.serve import search_args
    from fedsched.common.schedulers.base import Placement, default_gpu_choice
    from fedsched.common.sim.packing import PackingSimulator

    single_threaded()
    t0 = time.time()
    spec = scenario_spec(scenario)
    train, test = split(spec)
    nodes = spec.nodes
    sim = PackingSimulator(nodes, test, target_load=spec.target_load, seed=seed,
                           typical=TypicalPods.from_pods(train))
    cache = ClusterCache.from_table(nodes)
    cfg = DeciderConfig(gate=None, budget_ms=1e6, search=search_args(search or None),
                        safety=SafetyConfig(cpu_threshold=cpu_threshold, mem_threshold=mem_threshold),
                        packing_check=packing_check, packing_alternatives=alternatives)
    decider = Decider(cache, ModelStore(policy), cfg)
    check = decider.packing_check
    if check is not None:
        check.keep_incumbent = keep_incumbent
    names = list(nodes.names)
    sources = {"policy": 0, "shadow": 0, **{a: 0 for a in alternatives}}
    switches, last_served = 0, None
    try:
        while (item := sim.next_pod()) is not None and (max_pods is None or sim.k < max_pods):
            pod, _ = item
            uid = f"u-{sim.k}"
            obj = pod_to_json(pod, f"p-{sim.k}", nodes.models, uid=uid)
            # kube-scheduler's own filters (NodeResourcesFit) send the extender only the nodes the
            # pod fits; the extender's filter is the safety filter on top
            fits = np.flatnonzero(cache.state.feasible(pod))
            passed = decider.filter(obj, [names[i] for i in fits]).passed if len(fits) else []
            if not passed:
                sim.bind(Placement(-1))
                continue
            d = decider.prioritize(obj, passed)
            served = d.served
            if check is not None and check.running:
                check.wait()
            shadow = d.source == "fallback" and d.reason == "shadow"
            if not (d.source == "policy" or shadow) or d.chosen is None:
                raise RuntimeError(f"pod {sim.k}: the agent answered {d.source} ({d.reason}), not the policy")
            source = "shadow" if shadow else served.name if served is not None else "policy"
            sources[source] += 1
            if source != "shadow":  # the candidate serving changed (shadow -> a candidate is no switch)
                if last_served is not None and source != last_served:
                    switches += 1
                last_served = source
            node = cache.index[d.chosen]
            gpus = (default_gpu_choice(cache.state, pod, node) if shadow
                    else (served or decider.models.current.scheduler).select_gpus(cache.state, pod, node))
            cache.bind(uid, pod, d.chosen, gpus)
            sim.bind(Placement(node, gpus))
            if sim.k % 2000 == 0:
                print(f"  seed {seed}: {sim.k}/{len(sim)} pods ({time.time() - t0:.0f} s)", file=sys.stderr,
                      flush=True)
    finally:
        decider.close()
    reg = decider.metrics.registry
    searches = {r: reg.get_sample_value("fedsched_search_decisions_total", {"result": r}) or 0.0
                for r in RESULTS}
    refused = {r: reg.get_sample_value("fedsched_refused_nodes_total", {"reason": r}) or 0.0
               for r in ("cpu", "memory")}
    res = sim.result()
    verdict = None
    if check is not None and (v := check.verdict(decider.models.current, cache.table)) is not None:
        verdict = {"active": v.active, "lower": v.lower, "policy": v.policy, "against": v.against,
                   "pods": v.pods, "figures": v.figures(), "serves": v.choose(("policy", *alternatives))}
    return {"seed": seed, "metrics": res.metrics, "searches": searches, "refused": refused,
            "sources": sources, "switches": switches, "verdict": verdict, "wall_s": time.time() - t0}


def paired(runs: dict[int, dict[str, float]], other: dict[str, dict[str, Any]],
           metric: str) -> dict[str, Any]:
    diffs = [runs[s][metric] - other[str(s)][metric] for s in sorted(runs) if str(s) in other]
    mean, ci = mean_ci95(diffs)
    return {"mean": mean, "ci95": ci, "n": len(diffs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="packing/openb-default")
    ap.add_argument("--policy", default="learned", help="the served checkpoint or shipped policy name")
    ap.add_argument("--search", default="default", help="fedsched serve --search's arguments ('': off)")
    ap.add_argument("--packing-check", help="fedsched serve --packing-check's baseline (default: off)")
    ap.add_argument("--packing-alternatives", default="fgd",
                    help="fedsched serve --packing-alternatives (with --packing-check; off: none)")
    ap.add_argument("--seeds", type=int, default=10, help=f"seeds {SEED0}, {SEED0 + 1}, ...")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cpu-threshold", type=float, default=1.0)
    ap.add_argument("--mem-threshold", type=float, default=1.0)
    ap.add_argument("--metric", default="alloc_gpu")
    ap.add_argument("--no-incumbent", action="store_true",
                    help="each packing verdict chooses afresh, what served before not kept (to compare)")
    ap.add_argument("--max-pods", type=int, help="stop each run after this many arrivals (a smoke test)")
    ap.add_argument("--pair", type=Path, help="an agent_quality JSON of the same scenario and seeds")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    if args.seeds < 2:
        ap.error("--seeds must be at least 2 (one seed has no interval)")
    other: dict[str, Any] = {}
    if args.pair is not None:
        other = json.loads(args.pair.read_text())["scenarios"][args.scenario]["result"]["runs"]
    t0 = time.time()
    seeds = list(range(SEED0, SEED0 + args.seeds))
    alternatives = packing_alternatives(args.packing_alternatives) if args.packing_check else ()
    runs: dict[int, dict[str, Any]] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        futs = [pool.submit(run_seed, args.scenario, args.policy, args.search, s, args.cpu_threshold,
                            args.mem_threshold, args.max_pods, args.packing_check, alternatives,
                            not args.no_incumbent)
                for s in seeds]
        for f in as_completed(futs):
            r = f.result()
            runs[r["seed"]] = r
            value = r["metrics"][args.metric]
            print(f"[{len(runs)}/{len(seeds)}] seed {r['seed']}: {args.metric} {value:.2f}; "
                  f"search {', '.join(f'{k} {int(v)}' for k, v in r['searches'].items())}; refused "
                  f"{', '.join(f'{k} {int(v)}' for k, v in r['refused'].items())}; answered "
                  f"{', '.join(f'{k} {v}' for k, v in r['sources'].items())} (switches {r['switches']}); "
                  f"check {r['verdict']} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    metrics = {s: r["metrics"] for s, r in runs.items()}
    mean, ci = mean_ci95([m[args.metric] for m in metrics.values()])
    label = (f"served {args.policy} --search {args.search!r} --packing-check {args.packing_check} "
             f"--packing-alternatives {','.join(alternatives) or 'off'}"
             + (" --no-incumbent" if args.no_incumbent else ""))
    print(f"{args.scenario}, {len(seeds)} seeds: {label}: {args.metric} {mean:.2f} ± {ci:.2f}")
    out: dict[str, Any] = {"benchmark": "served_search_packing", "scenario": args.scenario,
                           "policy": args.policy, "search": args.search,
                           "packing_check": args.packing_check, "packing_alternatives": list(alternatives),
                           "keep_incumbent": not args.no_incumbent,
                           "seeds": seeds,
                           "cpu_threshold": args.cpu_threshold, "mem_threshold": args.mem_threshold,
                           "metric": args.metric,
                           "served": {"mean": mean, "ci95": ci}, "runs": {str(s): runs[s] for s in seeds},
                           "paired": {}}
    for col, col_runs in other.items():
        d = paired(metrics, col_runs, args.metric)
        if d["n"]:
            out["paired"][col] = d
            print(f"  served - {col}: {d['mean']:+.2f} ± {d['ci95']:.2f} pp ({d['n']} seeds)")
    out["wall_s"] = time.time() - t0
    print(f"({out['wall_s']:.0f} s)", file=sys.stderr)
    if args.json_out:
        write_json(args.json_out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
