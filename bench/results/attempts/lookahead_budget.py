"""Probe (issue 24, item 3): does a larger decision-time search budget pack more GPUs?

Chosen on *validation* pods, never the packing table's test pods: the same stable hash of pod
names that gives the table its test part (30%) gives a validation part (the next 20% of the hash
range) as the workload, and the rest (50%) is the search's arrival pool and FGD's typical pods.
Each ``lookahead[...]:fgd`` budget is paired with FGD seed by seed (GPU allocation at 130%
arrived, percentage points). ``lookahead_budget_gpu.*`` also tried the GPU of a sharing pod as a
searched choice (``gpu_choices=3``, commit 738d940; removed after this probe, as it gained nothing).

    python bench/results/attempts/lookahead_budget.py --seeds 3 --budgets 4x10x1,4x10x3,8x10x1,4x20x1
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from fedsched.common.model.metrics import mean_ci95
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods, split_train_val_test
from fedsched.common.sim.evaluate import EvalSpec, evaluate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budgets", default="4x10x1,4x20x1",
                    help="CANDIDATESxHORIZONxFUTURES, comma-separated")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    stats, val, _test = split_train_val_test(pods, 0.3, 0.2)
    names = []
    for b in a.budgets.split(","):
        c, h, f = (int(x) for x in b.split("x"))
        names.append(f"lookahead[candidates={c},horizon={h},futures={f}]:fgd")
    spec = EvalSpec(nodes=nodes, pods=val, train_pods=stats, policies=["fgd", *names],
                    seeds=list(range(42, 42 + a.seeds)), mode="packing", target_load=1.3, reference="fgd")
    t0 = time.time()
    res = evaluate(spec, jobs=a.jobs, progress=lambda i, n, o: print(
        f"[{i}/{n}] {o.policy} seed {o.seed}: {o.metrics['alloc_gpu']:.2f} ({time.time() - t0:.0f} s)",
        flush=True))
    runs = {(p, int(s)): m["alloc_gpu"] for p, per in res["runs"].items() for s, m in per.items()}
    print(f"validation pods: {len(val)}, arrival pool: {len(stats)}; {a.seeds} seeds; "
          f"{time.time() - t0:.0f} s")
    for name in spec.policies:
        v = np.array([runs[(name, s)] for s in spec.seeds])
        d = v - np.array([runs[("fgd", s)] for s in spec.seeds])
        _, hw = mean_ci95(d)
        print(f"{name:55s} alloc_gpu {v.mean():.2f}  vs fgd {d.mean():+.2f} ± {hw:.2f} pp  "
              f"per seed {np.round(d, 2).tolist()}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"runs": [[*k, v] for k, v in runs.items()]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
