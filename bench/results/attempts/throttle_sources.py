"""Attempt 8 of the learning issue, a probe: where a scheduler's throttled CPU comes from.

Throttled CPU carries most of the trouble score's variance and is where the learned online
policy loses to kube-default (edge +1.28 +- 0.69 in log, benchmark of record). This replays a
benchmark scenario (:data:`fedsched.common.sim.scenarios.SCENARIOS`, its held-out test pods, as
``bench/online_quality.py`` does) with each scheduler and splits each run's throttled CPU
core-hours (the usage model's per-pod charge, ``ReplaySimulator.pod_throttled_core_s``, which
sums to the run's ``throttled_cpu_core_s``) by

- the CPU size of the node it happened on (``ReplaySimulator.load_metrics.node_throttled``),
- the QoS class of the throttled pod,
- pod size: the share carried by the 10% of pods with the largest CPU requests,
- concentration: the share carried by the single most throttled pod of the run.

Run from the project root::

    python bench/results/attempts/throttle_sources.py --scenario edge --seeds 42,43,44,45,46 \\
        --policies kube-default,least-allocated,oracle,learned-online \\
        --json bench/results/attempts/throttle_sources_edge.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.common.compute import single_threaded
from fedsched.common.model.cluster import QOS_CLASSES
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.schedulers.base import place
from fedsched.common.sim.evaluate import make_policy, scheduler_context, split
from fedsched.common.sim.replay import ReplayConfig, ReplaySimulator
from fedsched.common.sim.scenarios import SCENARIOS, build


def sources(scenario: str, policy: str, seed: int) -> dict[str, Any]:
    """One replay of ``policy`` on the scenario's test pods, and where its throttling came from."""
    spec = build(SCENARIOS[scenario])
    train, work = split(spec)
    scheduler = make_policy(policy, scheduler_context(train, seed), "replay")
    sim = ReplaySimulator(spec.nodes, work, config=ReplayConfig(**spec.replay_options), seed=seed,
                          typical=TypicalPods.from_pods(train))
    attach = getattr(scheduler, "attach_simulator", None)
    if attach is not None:
        attach(sim)
    while (d := sim.next_pod()) is not None:
        pod, state = d
        sim.bind(place(scheduler, state, pod, sim.rng))
    res = sim.finish()
    per_pod = sim.pod_throttled_core_s(np.arange(len(work.cpu))) / 3600.0
    per_node = np.asarray(sim.load_metrics.node_throttled, dtype=np.float64) / 3600.0
    total = float(res.metrics["throttled_cpu_core_s"]) / 3600.0
    cap = spec.nodes.cpu
    big = work.cpu >= np.quantile(work.cpu, 0.9)
    share = (lambda x: float(x) / total) if total > 0 else (lambda x: float("nan"))
    return {
        "scenario": scenario, "policy": policy, "seed": seed, "throttled_core_h": total,
        "by_node_cpu_milli": {str(int(c)): float(per_node[cap == c].sum()) for c in np.unique(cap)},
        "by_qos": {QOS_CLASSES[q]: float(per_pod[work.qos == q].sum()) for q in range(len(QOS_CLASSES))},
        "share_top10pct_cpu_pods": share(per_pod[big].sum()),
        "share_most_throttled_pod": share(per_pod.max(initial=0.0)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="edge", choices=sorted(SCENARIOS))
    ap.add_argument("--seeds", default="42,43,44,45,46", help="comma-separated replay seeds")
    ap.add_argument("--policies", default="kube-default,least-allocated,oracle,learned-online")
    ap.add_argument("--json", dest="json_out", help="write every run here")
    args = ap.parse_args(argv)
    single_threaded()
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for policy in args.policies.split(","):
            r = sources(args.scenario, policy, seed)
            runs.append(r)
            by_node = ", ".join(f"{int(k) // 1000}-core {v:.2f}" for k, v in r["by_node_cpu_milli"].items())
            by_qos = ", ".join(f"{k} {v:.2f}" for k, v in r["by_qos"].items() if v > 0)
            print(f"seed {seed} {policy:16s} throttled {r['throttled_core_h']:6.2f} core-h | "
                  f"nodes: {by_node} | pods: {by_qos} | top 10% CPU pods {r['share_top10pct_cpu_pods']:.0%}, "
                  f"one pod {r['share_most_throttled_pod']:.0%}", flush=True)
    print("\nmedian over seeds: throttled core-h | share of the top 10% CPU pods | "
          "share of the single most throttled pod")
    for policy in args.policies.split(","):
        mine = [r for r in runs if r["policy"] == policy]
        med = {k: float(np.median([r[k] for r in mine]))
               for k in ("throttled_core_h", "share_top10pct_cpu_pods", "share_most_throttled_pod")}
        print(f"  {policy:16s} {med['throttled_core_h']:6.2f} | {med['share_top10pct_cpu_pods']:.0%} | "
              f"{med['share_most_throttled_pod']:.0%}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"scenario": args.scenario, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
