"""Probe (issue 24, item 3): two changes to the decision-time search's value, on *validation* pods.

``lam<W>:fgd``: ``value = given - W * (fragmentation added)`` (the search's value with its
fragmentation term weighted ``W``; ``W = 1`` is the shipped search). ``margin<M>:fgd``: the base's
first choice keeps the pod unless another candidate's value is higher by more than ``M`` milli-GPU
(the shipped search: any strictly higher value). Both over FGD with the default budget, on the
protocol of ``lookahead_budget.py`` (the next 20% of the hash range after the test part as the
workload, the rest of the statistics part as the arrival pool and FGD's typical pods, 130%
arrived), paired with FGD by seed; ``evaluate``'s progress lines as they come, then the table.

    python bench/results/attempts/search_value_probe.py 4 lam1,lam0.5,lam2 1
"""

from __future__ import annotations

import sys
import time

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.metrics import mean_ci95
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods, split_train_val_test
from fedsched.common.schedulers import RESOLVERS, Lookahead, LookaheadArgs, Scheduler, make_scheduler
from fedsched.common.schedulers.base import SchedulerContext
from fedsched.common.sim.evaluate import EvalSpec, evaluate


class Weighted(Lookahead):
    """The search with its fragmentation term weighted and a margin on switching."""

    frag_weight = 1.0
    margin = 0.0

    def _frag(self, state: ClusterState, nodes: list[int]) -> float:
        return self.frag_weight * super()._frag(state, nodes)

    def _values(self, state: ClusterState, pod: Pod, cands: list[int]) -> np.ndarray:
        values = super()._values(state, pod, cands)
        values[0] += self.margin  # the base's first choice
        return values


def resolve(name: str, ctx: SchedulerContext) -> Scheduler | None:
    for prefix, attr in (("lam", "frag_weight"), ("margin", "margin")):
        if name.startswith(prefix) and name.endswith(":fgd"):
            s = Weighted(ctx, lambda: make_scheduler("fgd", ctx), LookaheadArgs())
            setattr(s, attr, float(name[len(prefix):-len(":fgd")]))
            s.name = name
            return s
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: search_value_probe.py SEEDS NAME[,NAME...] JOBS (names: lam<W>, margin<M>)")
    seeds, names, jobs = int(argv[0]), [f"{n}:fgd" for n in argv[1].split(",")], int(argv[2])
    RESOLVERS.insert(0, resolve)  # evaluate's workers inherit it by fork
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    stats, val, _ = split_train_val_test(pods, 0.3, 0.2)
    spec = EvalSpec(nodes=nodes, pods=val, train_pods=stats, policies=["fgd", *names],
                    seeds=list(range(42, 42 + seeds)), mode="packing", target_load=1.3, reference="fgd")
    t0 = time.time()
    res = evaluate(spec, jobs=jobs, progress=lambda i, n, o: print(
        f"[{i}/{n}] {o.policy} seed {o.seed}: {o.metrics['alloc_gpu']:.2f} ({time.time() - t0:.0f} s)",
        flush=True))
    runs = {(p, int(s)): m["alloc_gpu"] for p, per in res["runs"].items() for s, m in per.items()}
    for name in spec.policies:
        v = np.array([runs[(name, s)] for s in spec.seeds])
        d = v - np.array([runs[("fgd", s)] for s in spec.seeds])
        print(f"{name:16s} {v.mean():.2f} vs fgd {d.mean():+.3f} ± {mean_ci95(d)[1]:.3f} "
              f"{np.round(d, 2).tolist()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
