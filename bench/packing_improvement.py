"""Does a rollout-improved packing policy beat its behaviour-cloning start and FGD?

The packing scenarios of ``bench/agent_quality.py`` (the openb GPU cluster, 1213 nodes, 130%
arrived GPU requests; pods split by the stable name hash, statistics from the train part, the
workload drawn from the *test* part, seeds 42..), for the given checkpoints beside the shipped
``learned`` (the BC-of-FGD start) and FGD. Prints GPU allocation at 130% arrived (the
artefact's binned value, ``gpu_alloc_at_target``) as mean ± 95% CI over seeds, and the paired
per-seed differences of each checkpoint against ``learned`` and ``fgd`` (mean ± 95% CI: the
same seeds give the same workload, so the pairing removes the workload's luck).

    python bench/packing_improvement.py --policy runs/rollout-improve/x/best.pt --seeds 10 \\
        --variants default --json runs/rollout-improve/x/eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from fedsched.common.model.metrics import mean_ci95
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.sim.evaluate import EvalSpec, evaluate

METRIC = "gpu_alloc_at_target"
VARIANTS = ["default", "gpushare40", "multigpu50", "gpuspec33", "cpu050"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", action="append", required=True, help="checkpoint(s) to judge")
    ap.add_argument("--baselines", default="learned,fgd")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=42)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    for p in args.policy:
        if not Path(p).exists():
            print(f"no checkpoint at {p}", file=sys.stderr)
            return 2
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    baselines = [b for b in args.baselines.split(",") if b]
    out: dict[str, dict] = {"seeds": seeds, "metric": METRIC, "variants": {}}
    for v in args.variants.split(","):
        pods = load_pods(builtin_trace(f"openb_pod_list_{v}.csv"), nodes, allow_oversized=True)
        spec = EvalSpec(nodes=nodes, pods=pods, policies=list(args.policy) + baselines, seeds=seeds,
                        mode="packing", target_load=1.3)
        t0 = time.time()
        res = evaluate(spec, jobs=args.jobs)
        per_seed = {p: [res["runs"][p][str(s)][METRIC] for s in seeds] for p in spec.policies}
        row: dict[str, dict] = {}
        print(f"\n== openb-{v}: {len(nodes)} nodes, {len(seeds)} seeds ({time.time() - t0:.0f} s) ==")
        for p in spec.policies:
            m, ci = mean_ci95(per_seed[p])
            row[p] = {"mean": m, "ci95": ci, "per_seed": per_seed[p]}
            print(f"{p:60s} {m:7.3f} ± {ci:.3f}")
        for p in args.policy:
            for b in baselines:
                d = np.array(per_seed[p]) - np.array(per_seed[b])
                m, ci = mean_ci95(d)
                row[p][f"minus_{b}"] = {"mean": m, "ci95": ci}
                print(f"  {Path(p).name} - {b}: {m:+.3f} ± {ci:.3f}")
        out["variants"][v] = row
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
