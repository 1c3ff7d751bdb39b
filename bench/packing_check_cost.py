"""What one packing check (``fedsched serve --packing-check``) costs in simulation time, with and
without the decision-time search.

A check simulates, on the cluster's node table, the pods the agent was asked to place: each of its
candidates (the served policy, the baseline it replaces, each alternative) runs the packing
protocol's workloads (arrivals until 130% of the GPU, ``SEEDS`` workloads by default). With
``fedsched serve --search`` the served policy is the search over the model, so the check simulates
that search. This times one workload per candidate, on one core, through the check's own
simulation (:func:`fedsched.agent.serving.packing_check._simulate`'s pieces), on the first
``--nodes`` nodes of the openb GPU cluster with ``--pool`` openb default pods as the pool (a
seeded sample), and prints each candidate's seconds and what a whole check takes.

    python bench/packing_check_cost.py [--nodes 1213] [--pool 512] [--policy learned]
        [--search default|candidates=4,horizon=10,...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from harness.provenance import git_commit, machine, write_json

from fedsched.agent.serving.model_store import ModelStore
from fedsched.agent.serving.packing_check import SEEDS
from fedsched.cli.serve import search_args
from fedsched.common.compute import single_threaded
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.schedulers import Lookahead, make_scheduler
from fedsched.common.sim.portfolio import simulated_allocations


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1213, help="the first N nodes of the openb GPU cluster")
    ap.add_argument("--pool", type=int, default=512, help="pods in the check's pool")
    ap.add_argument("--policy", default="learned", help="the served checkpoint or shipped policy name")
    ap.add_argument("--search", default="default", help="fedsched serve --search's arguments ('': off)")
    ap.add_argument("--alternatives", default="fgd", help="comma-separated baselines ('': none)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not 1 <= a.nodes <= 1213 or a.pool < 32:
        ap.error("need 1 <= --nodes <= 1213 and --pool >= 32")
    single_threaded()
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv")).select(np.arange(a.nodes))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    pool = pods.select(np.sort(np.random.default_rng(0).permutation(len(pods))[:a.pool]))
    model = ModelStore(a.policy).current
    make = model.make_scheduler
    if make is None:
        ap.error(f"{a.policy} cannot make a second scorer: the check cannot simulate it")
    search = search_args(a.search or None)
    candidates: list[tuple[str, Any]] = [("model", lambda _c: make())]
    if search is not None:
        candidates.append((f"search over the model ({search.spec()})", lambda c: Lookahead(c, make, search)))
    candidates.append(("kube-default", lambda c: make_scheduler("kube-default", c)))
    alternatives = [x for x in a.alternatives.split(",") if x]
    candidates += [(x, lambda c, x=x: make_scheduler(x, c)) for x in alternatives]
    seconds, allocs = {}, {}
    t_all = time.time()
    print(f"{a.nodes} nodes, pool {a.pool} pods, policy {a.policy}, one workload per candidate, one core:")
    for name, factory in candidates:
        t0 = time.perf_counter()
        allocs[name] = simulated_allocations(nodes, pool, factory, 1)[0]
        seconds[name] = time.perf_counter() - t0
        print(f"  {name:55s} {seconds[name]:8.1f} s   allocation {allocs[name]:.2f}%", flush=True)
    others = sum(s for n, s in seconds.items() if n != "model" and not n.startswith("search"))
    whole = {"model alone": SEEDS * (seconds["model"] + others)}
    if search is not None:
        whole["search"] = SEEDS * (seconds[candidates[1][0]] + others)
    for k, v in whole.items():
        print(f"  one check ({SEEDS} workloads per candidate), policy = {k}: {v / 60:.1f} min")
    print(f"({time.time() - t_all:.0f} s)")
    if a.json:
        write_json(a.json, {"benchmark": "packing_check_cost", "args": vars(a), "seconds": seconds,
                            "allocation_pct": allocs, "check_s": whole, "workloads_per_check": SEEDS,
                            "provenance": {**git_commit(), "machine": machine(), "argv": sys.argv[1:]}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
