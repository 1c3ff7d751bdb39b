"""What the packing check (``fedsched serve --packing-check``) costs the requests it runs beside.

The check simulates the pods the agent was asked to place on the cluster's nodes, with the served
model and with the baseline, on a thread of its own. That thread shares the agent's process (and,
here, its one core) with the requests. This times a serving agent's prioritize (in process, no
HTTP, every node a candidate, the shipped packing policy, early ranking off) on the openb GPU
cluster, the process pinned to ``--cores`` cores (the check's child process inherits them):

- ``off``: an agent without the check;
- ``during``: an agent with ``--packing-check kube-default`` while its first simulation runs in a
  spawned process (as served; started by the requests themselves once ``--pool`` pods have been
  asked for);
- ``during-thread``: the same simulation run in the agent's own thread instead (the interpreter
  lock shared with the requests);
- ``after``: the agent once the verdict is in;

and prints the simulation's wall time and verdict. The pods are the openb default pods in a
seeded order; the cluster holds none (the check's simulation starts from an empty one anyway).

    python bench/packing_check_latency.py [--nodes 1213] [--pool 512] [--calls 200] [--cores 1]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from harness.provenance import git_commit, machine, write_json
from harness.stats import timing_stats
from threadpoolctl import threadpool_limits

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods

POINTS = (50, 99)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1213, help="the first N nodes of the openb GPU cluster")
    ap.add_argument("--pool", type=int, default=512, help="pods asked for before the check simulates")
    ap.add_argument("--calls", type=int, default=200, help="timed prioritize calls per phase (at most)")
    ap.add_argument("--policy", default="learned")
    ap.add_argument("--cores", type=int, default=1, help="cores the process (and the check's child) may use")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not 1 <= a.nodes <= 1213 or a.pool < 32 or a.calls < 10 or a.cores < 1:
        ap.error("need 1 <= --nodes <= 1213, --pool >= 32, --calls >= 10 and --cores >= 1")
    cores = sorted(os.sched_getaffinity(0))[:a.cores] if hasattr(os, "sched_setaffinity") else []
    if cores:
        os.sched_setaffinity(0, set(cores))
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv")).select(np.arange(a.nodes))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    order = np.random.default_rng(0).permutation(len(pods))
    names = list(nodes.names)

    def request(i: int) -> dict:
        pod = Pod.from_table(pods, int(order[i % len(order)]))
        return pod_to_json(pod, f"p-{i}", nodes.models, uid=f"u-{i}")

    def agent(check: str | None) -> Decider:
        cfg = DeciderConfig(gate=None, budget_ms=60_000.0, early_rank=False, packing_check=check)
        return Decider(ClusterCache.from_table(nodes), ModelStore(a.policy), cfg)

    def timed(d: Decider, start: int, n: int, while_running: bool = False) -> list[float]:
        out = []
        for i in range(start, start + n):
            obj = request(i)
            d.filter(obj, names)
            t0 = time.perf_counter()
            d.prioritize(obj, names)
            out.append(time.perf_counter() - t0)
            if while_running and d.packing_check is not None and not d.packing_check.running:
                break
        return out

    with threadpool_limits(1):
        t_all = time.time()
        off = agent(None)
        timed(off, 0, 20)  # warm-up
        off_times = timed(off, 20, a.calls)
        off.close()

        during: dict[str, list[float]] = {}
        sim_s: dict[str, float] = {}
        verdicts = {}
        for label, use_child in (("during", True), ("during-thread", False)):
            on = agent("kube-default")
            check = on.packing_check
            assert check is not None
            check.min_pool, check.use_child = a.pool, use_child
            for i in range(a.pool):  # pods asked for: filter records them, nothing is bound
                on.filter(request(10_000 + i), names)
            timed(on, 0, 20)  # warm-up; the first prioritize starts the simulation
            t_sim = time.perf_counter()
            during[label] = timed(on, 20, 100_000, while_running=True)
            check.wait()
            sim_s[label] = time.perf_counter() - t_sim
            verdicts[label] = check.verdict(on.models.current, on.cache.table)
            if use_child:
                after = timed(on, 200_000, a.calls)
            on.close()
        verdict = verdicts["during"]

    phases = (("off", off_times), ("during", during["during"]), ("during-thread", during["during-thread"]),
              ("after", after))
    stats = {k: timing_stats(v, POINTS) for k, v in phases}
    print(f"{a.nodes} nodes, pool {a.pool} pods, policy {a.policy}, cores {cores or 'all'}:")
    for k, s in stats.items():
        print(f"  prioritize {k:13s} p50 {s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms  ({s['n']} calls)")
    for k in during:
        print(f"  {k}: p99 x{stats[k]['p99_ms'] / stats['off']['p99_ms']:.2f} of off; the simulation took "
              f"{sim_s[k]:.1f} s (both schedulers, 4 workloads each)")
    if verdicts["during"] != verdicts["during-thread"]:
        print("  WARNING: the child's and the thread's verdicts differ")
    if verdict is not None:
        print(f"  verdict: {'active' if verdict.active else 'shadow'}: {verdict.reason('kube-default')}")
    print(f"({time.time() - t_all:.0f} s)")
    if a.json:
        write_json(a.json, {"benchmark": "packing_check_latency", "args": vars(a), "stats": stats,
                            "simulation_s": sim_s, "cores": cores, "verdict": None if verdict is None else {
                                "active": verdict.active, "policy": verdict.policy,
                                "against": verdict.against, "lower": verdict.lower, "pods": verdict.pods},
                            "provenance": {**git_commit(), "machine": machine(), "argv": sys.argv[1:]}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
