"""Probe (issue 24, item 3): which packing rule allocates more where CPU runs out before the GPUs,
and does ``best-of[fgd,kube-default]`` get the better one?

Constructed inventories (``bench/agent_quality.py``'s :func:`cpu_bound_inventory`: openb GPU nodes,
a share of them cut to one GPU, a share of CPU-only pods, every pod pinned to one GPU model), judged
on the test pods (the 30% of the hash range the packing table uses), the statistics part (50%) as
the pool FGD and the choice's simulations draw from; 130% of the GPU arrived; GPU allocation paired
with FGD seed by seed.

    python bench/results/attempts/cpu_bound_probe.py KIND [--cseed N] [--part test|val] [--seeds ...]
        --policies "kube-default;fgd;best-of[fgd,kube-default]"

KIND: ``cpubound-<one-GPU node share>-<CPU-only pod share>`` or ``default`` (openb default).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, as the script runs from the root
from agent_quality import GPU_NODES, cpu_bound_inventory

from fedsched.common.model.metrics import mean_ci95
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods, split_train_val_test
from fedsched.common.sim.evaluate import EvalSpec, evaluate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind")
    ap.add_argument("--policies", required=True, help="';'-separated scheduler names")
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--cseed", type=int, default=7)
    ap.add_argument("--part", choices=["val", "test"], default="val")
    ap.add_argument("--ref", default="fgd")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.kind == "default":
        nodes = load_nodes(builtin_trace(GPU_NODES))
        pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    else:
        _, one, share = a.kind.split("-")
        nodes, pods = cpu_bound_inventory(a.cseed, float(one), float(share))
    stats, val, test = split_train_val_test(pods, 0.3, 0.2)
    work = val if a.part == "val" else test
    policies = a.policies.split(";")
    spec = EvalSpec(nodes=nodes, pods=work, train_pods=stats, policies=policies,
                    seeds=[int(s) for s in a.seeds.split(",")], mode="packing", target_load=1.3,
                    reference=a.ref)
    t0 = time.time()
    print(a.kind, "cseed", a.cseed, a.part, len(work), "pods", flush=True)
    res = evaluate(spec, jobs=a.jobs, progress=lambda i, n, o: print(
        f"[{i}/{n}] {o.policy} seed {o.seed}: {o.metrics['alloc_gpu']:.2f} ({time.time() - t0:.0f} s)",
        file=sys.stderr, flush=True))
    runs = res["runs"]
    for p in policies:
        v = np.array([runs[p][s]["alloc_gpu"] for s in runs[p]])
        d = [runs[p][s]["alloc_gpu"] - runs[a.ref][s]["alloc_gpu"] for s in runs[p]]
        m, hw = mean_ci95(d)
        print(f"{p:50s} alloc_gpu {v.mean():.2f}  vs {a.ref} {m:+.2f} ± {hw:.2f}  "
              f"per seed {np.round(d, 2).tolist()}")
    if a.json:
        Path(a.json).write_text(json.dumps(runs, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
