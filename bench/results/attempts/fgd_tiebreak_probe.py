"""Probe (issue 24, item 3): FGD's integer score and its tie-break, on *validation* pods of openb default
(the protocol of ``lookahead_budget.py``), paired with FGD by seed.

``fgdv:raw``: the fragmentation change itself as the score (no sigmoid, no rounding: exact ties only);
``fgdv:q<K>``: FGD's score in buckets of K points (``trunc(sigmoid * 100 / K)``; FGD is ``q1``);
``fgdv:bf`` / ``fgdv:wf``: FGD's score with a tie-break toward the fuller / emptier node (half a
point at most, so only ties move); ``fgdv:rawbf``: both. Otherwise ties go to the fixed node
priority of the packing protocol, as for FGD.

    python bench/results/attempts/fgd_tiebreak_probe.py --seeds 6 \
        --policies fgdv:raw,fgdv:bf,fgdv:rawbf,fgdv:wf
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from fedsched.common.model.fragmentation import best_per_node
from fedsched.common.model.metrics import mean_ci95
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods, split_train_val_test
from fedsched.common.schedulers import RESOLVERS
from fedsched.common.schedulers.fgd import FGD
from fedsched.common.sim.evaluate import EvalSpec, evaluate


class FGDVariant(FGD):
    def __init__(self, ctx, variant):
        super().__init__(ctx)
        self.variant = variant
        self.name = "fgdv:" + variant

    def _scores(self, state, pod, nodes):
        rows, gpus, delta = self.deltas(state, pod, nodes)
        v = self.variant
        if v.startswith("raw"):
            vals = delta.astype(np.float64)
        elif v.startswith("q"):
            k = float(v[1:].split("_")[0])
            vals = np.trunc(100.0 / k / (1.0 + np.exp(-delta / 1000.0)))
        else:
            vals = np.trunc(100.0 / (1.0 + np.exp(-delta / 1000.0)))
        best, g = best_per_node(len(nodes), rows, gpus, vals)
        if v.endswith("bf") or v.endswith("wf"):
            nt = state.nodes
            gt = np.maximum(nt.gpu[nodes], 1)
            free_gpu = state.gpu_free[nodes].sum(axis=1) / (1000.0 * gt)
            free_cpu = (nt.cpu[nodes] - state.cpu_req[nodes]) / np.maximum(nt.cpu[nodes], 1)
            fit = 1.0 - 0.5 * (free_gpu + free_cpu)  # in [0, 1]: 1 = full
            if v.endswith("wf"):
                fit = 1.0 - fit
            scale = 1e-3 if v.startswith("raw") else 0.5
            best = best + scale * fit
        return best, g


def resolve(name, ctx):
    if name.startswith("fgdv:"):
        return FGDVariant(ctx, name[5:])
    return None


RESOLVERS.insert(0, resolve)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--policies", default="fgdv:raw,fgdv:bf,fgdv:rawbf,fgdv:wf")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--pods", default="openb_pod_list_default.csv")
    a = ap.parse_args(argv)
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    pods = load_pods(builtin_trace(a.pods), nodes, allow_oversized=True)
    stats, val, _test = split_train_val_test(pods, 0.3, 0.2)
    pols = ["fgd", *a.policies.split(",")]
    spec = EvalSpec(nodes=nodes, pods=val, train_pods=stats, policies=pols,
                    seeds=list(range(42, 42 + a.seeds)), mode="packing", target_load=1.3, reference="fgd")
    t0 = time.time()
    res = evaluate(spec, jobs=a.jobs, progress=lambda i, n, o: None)
    runs = {(p, int(s)): m["alloc_gpu"] for p, per in res["runs"].items() for s, m in per.items()}
    print(f"{a.pods} val {len(val)} pool {len(stats)}; {a.seeds} seeds; {time.time() - t0:.0f} s")
    for name in pols:
        v = np.array([runs[(name, s)] for s in spec.seeds])
        d = v - np.array([runs[("fgd", s)] for s in spec.seeds])
        _, hw = mean_ci95(d)
        print(f"{name:40s} {v.mean():.2f}  vs fgd {d.mean():+.3f} ± {hw:.3f}  {np.round(d, 2).tolist()}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
