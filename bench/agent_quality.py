"""Quality of the learned policy against every baseline, on data it was not trained on.

Scenarios (each through ``fedsched.common.sim.evaluate``, the same harness as ``fedsched
evaluate``; pods split by a stable hash of their names, statistics from the train part,
workloads drawn from the *test* part):

- ``packing/openb-<variant>``: the published protocol (130% arrived GPU requests) on the
  1213-node openb GPU cluster, for the default workload and the other variants;
- ``replay/<profile>``: synthetic member clusters (web with diurnal load, GPU training,
  edge) replayed with the usage model (overload, OOM, pending latency), durations scaled
  to a 60% mean requested load;
- ``replay/openb``: the openb default trace replayed, durations scaled to 40% mean load.

Prints one table per scenario (mean ± 95% CI over seeds) and writes
``{"scenarios": {NAME: {"policies": {POLICY: {METRIC: {"mean", "ci95"}}}}}}``.

    python bench/agent_quality.py [--policy CKPT] [--seeds 10] --json OUT.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.sim.evaluate import EvalSpec, evaluate, format_table, write_json

PACKING_BASELINES = ["kube-default", "best-fit", "dot-product", "gpu-packing", "gpu-clustering", "fgd",
                     "random"]
REPLAY_BASELINES = ["kube-default", "best-fit", "fgd", "target-load-packing", "most-allocated"]
VARIANTS = ["default", "gpushare40", "multigpu50", "gpuspec33", "cpu050"]


def scenarios(quick: bool) -> list[tuple[str, EvalSpec]]:
    out = []
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    for v in VARIANTS[:2] if quick else VARIANTS:
        pods = load_pods(builtin_trace(f"openb_pod_list_{v}.csv"), nodes, allow_oversized=True)
        out.append((f"packing/openb-{v}", EvalSpec(nodes=nodes, pods=pods, policies=[], seeds=[],
                                                   mode="packing", target_load=1.3)))
    for profile in ("web", "gpu", "edge"):
        n, p = generate_cluster(profile, seed=7)
        # As generated the profiles are lightly loaded; durations are scaled to a 60% mean
        # requested load so placement matters.
        out.append((f"replay/{profile}", EvalSpec(nodes=n, pods=p, policies=[], seeds=[], mode="replay",
                                                  replay_options={"target_load": 0.6})))
    all_nodes = load_nodes(builtin_trace("openb_node_list_all_node.csv"))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), all_nodes)
    out.append(("replay/openb", EvalSpec(nodes=all_nodes, pods=pods, policies=[], seeds=[], mode="replay",
                                         replay_options={"start_quantile": 0.01, "target_load": 0.4,
                                                         "time_compression": 10.0})))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", action="append", dest="policies",
                    help="learned policy checkpoint(s) (default: the shipped 'learned' and 'learned-td3')")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="fewer scenarios (a smoke run)")
    ap.add_argument("--only", help="comma-separated scenario name prefixes to run")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    learned = args.policies or ["learned", "learned-td3"]
    for p in learned:
        if p not in ("learned", "learned-td3") and not Path(p).exists():
            print(f"no checkpoint at {p}", file=sys.stderr)
            return 2
    result: dict[str, dict] = {"scenarios": {}, "learned": learned, "seeds": args.seeds}
    for name, spec in scenarios(args.quick):
        if args.only and not any(name.startswith(o) for o in args.only.split(",")):
            continue
        spec.policies = learned + (PACKING_BASELINES if spec.mode == "packing" else REPLAY_BASELINES)
        spec.seeds = list(range(42, 42 + args.seeds))
        t0 = time.time()
        print(f"\n== {name}: {len(spec.nodes)} nodes, {len(spec.pods)} pods ==", flush=True)
        res = evaluate(spec, jobs=args.jobs)
        res.pop("runs", None)
        res.pop("curves", None)
        print(format_table(res))
        print(f"({time.time() - t0:.0f} s)", flush=True)
        result["scenarios"][name] = res
        if args.json_out:  # write as we go: a long run keeps what it finished
            write_json(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
