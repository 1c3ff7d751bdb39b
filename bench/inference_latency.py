"""Scoring latency of the node-scoring policy on one core: p50/p99 per candidate count.

For each node count (slices of the openb cluster, half-loaded by kube-default so the
states are realistic) this times, over ``--calls`` pods after a warm-up:

- ``torch``: the policy's forward pass in torch (inference mode, one thread);
- ``numpy``: the same function on the numpy path the scorer uses (``score_numpy``);
- ``onnx``: the same function exported to ONNX, in onnxruntime (one thread, sequential);
- ``score``: the whole scorer-interface call (feature building + numpy forward, plus
  kube-default's score where the checkpoint's scoring options keep it beside the logits, as
  ``learned-online``'s do), what the simulator, the evaluation and the extender pay per pod;
- ``search`` (with ``--search NAME``, e.g. ``lookahead:fgd``): the decision-time search's whole
  scorer call over the pod's feasible nodes (base scores, candidates, rollouts), its arrivals
  drawn from the openb pods, over ``--search-calls`` pods;
- ``served`` (with ``--served-search ARGS``, e.g. ``default``): the path a serving agent runs
  with ``fedsched serve --search ARGS``: the decider's prioritize (in process, no HTTP) over every
  node of the cluster, mirrored pod by pod into the agent's cache, the search over ``--policy``
  (early ranking off, so the whole search is inside the call; the roll-out gate off), its
  arrivals drawn from the pods the agent was asked to place (64 prioritize calls before the
  timed ones), over ``--search-calls`` pods.

Goal (agent issue): 500 candidate nodes in at most 1 ms at p99.

    python bench/inference_latency.py [--policy CKPT] [--search lookahead:fgd] [--served-search default]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from harness.cpu import pin_to_core
from harness.provenance import write_json
from harness.stats import timing_stats
from threadpoolctl import threadpool_limits

from fedsched.common.learning.checkpoint import load_checkpoint, typical_from_dict
from fedsched.common.learning.kinds import NODE_SCORING
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.learning.onnx import OnnxScorer, export_onnx
from fedsched.common.learning.scorers import PolicyScheduler, scoring_options
from fedsched.common.model.cluster import ClusterState, NodeTable, Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.schedulers import (
    KubeDefault,
    SchedulerContext,
    default_policy_path,
    make_scheduler,
    place,
)

DEFAULT_POLICY = default_policy_path()
POINTS = (50, 99)  # the percentiles recorded


def cluster_of(nodes: NodeTable, n: int, rng: np.random.Generator) -> NodeTable:
    idx = rng.choice(len(nodes), n, replace=n > len(nodes))
    t = nodes.select(np.sort(idx))
    return NodeTable(names=tuple(f"n{i}" for i in range(n)), cpu=t.cpu, mem=t.mem, gpu=t.gpu,
                     model=t.model, models=t.models, disk_io=t.disk_io, net=t.net)


def loaded_state(nodes: NodeTable, pods, rng: np.random.Generator,
                 placed: list | None = None) -> ClusterState:
    """Fill to about half the GPUs (or CPU) with kube-default, like a busy cluster (each
    placement ``(pod, node, gpus)`` appended to ``placed`` when given)."""
    state = ClusterState(nodes)
    sched = KubeDefault()
    target = 0.5 * (nodes.total_gpu_milli or nodes.cpu.sum())
    used = 0.0
    while used < target:
        pod = Pod.from_table(pods, int(rng.integers(len(pods))))
        p = place(sched, state, pod, rng)
        if p.node < 0:
            break
        state.allocate(p.node, pod, p.gpus)
        if placed is not None:
            placed.append((pod, p.node, p.gpus))
        used += pod.gpu_request if nodes.total_gpu_milli else pod.cpu
    return state


def search_times(name: str, state: ClusterState, pods, calls: list, n_calls: int) -> list[float]:
    """Seconds per scorer call of the search ``name`` over each pod's feasible nodes (after a
    warm-up of 5 calls, which also builds its shadow state)."""
    search = make_scheduler(name, SchedulerContext(train_pods=pods))
    todo = [(pod, np.flatnonzero(state.feasible(pod))) for pod, _ in calls]
    todo = [(pod, cand) for pod, cand in todo if len(cand)][: n_calls + 5]
    times = []
    for i, (pod, cand) in enumerate(todo):
        t0 = time.perf_counter()
        search.score(state, pod, cand)
        if i >= 5:
            times.append(time.perf_counter() - t0)
    return times


def served_times(search: str, policy: str, nodes: NodeTable, placed: list, calls: list,
                 n_calls: int) -> list[float]:
    """Seconds per prioritize call of a serving agent running ``fedsched serve --search search``
    over ``policy`` on ``nodes`` holding the pods ``placed``, each call over every node."""
    from fedsched.agent.cluster.cache import ClusterCache
    from fedsched.agent.cluster.k8s_objects import pod_to_json
    from fedsched.agent.serving.decider import Decider, DeciderConfig
    from fedsched.agent.serving.model_store import ModelStore
    from fedsched.cli.serve import search_args

    cache = ClusterCache.from_table(nodes)
    for i, (pod, node, gpus) in enumerate(placed):
        cache.bind(f"bound-{i}", pod, nodes.names[node], gpus)
    cfg = DeciderConfig(gate=None, budget_ms=60_000.0, early_rank=False, search=search_args(search))
    decider = Decider(cache, ModelStore(policy), cfg)
    names = list(nodes.names)
    times = []
    try:
        for i, (pod, _) in enumerate(calls[: 64 + n_calls]):
            obj = pod_to_json(pod, f"p-{i}", nodes.models, uid=f"u-{i}")
            t0 = time.perf_counter()
            d = decider.prioritize(obj, names)
            if i >= 64:
                times.append(time.perf_counter() - t0)
            if d.source != "policy":
                raise RuntimeError(f"the agent answered {d.source} ({d.reason}), not the searched policy")
    finally:
        decider.close()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default=str(DEFAULT_POLICY) if DEFAULT_POLICY.exists() else None,
                    help="checkpoint (default: the shipped policy, else random weights)")
    ap.add_argument("--sizes", default="10,100,500,2000")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--search", help="also time this decision-time search (e.g. lookahead:fgd)")
    ap.add_argument("--search-calls", type=int, default=100)
    ap.add_argument("--served-search", help="also time a serving agent's prioritize with fedsched serve "
                                            "--search ARGS over --policy (e.g. default)")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    pin_to_core()
    torch.set_num_threads(1)
    threadpool_limits(1)  # BLAS threads fighting over one pinned core inflate the tail
    base = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), base)
    if args.policy:
        policy, meta, _ = load_checkpoint(args.policy)
        typical = typical_from_dict(meta.get("typical_pods"))
    else:
        torch.manual_seed(0)
        policy, typical, meta = NodeScoringPolicy(), TypicalPods.from_pods(pods), {}
    sched = PolicyScheduler(policy, typical, **scoring_options(meta, NODE_SCORING))  # as served
    with tempfile.TemporaryDirectory() as d:  # onnxruntime keeps the model in memory
        onnx_scorer = OnnxScorer(export_onnx(policy, Path(d) / "policy.onnx"))
    rng = np.random.default_rng(0)
    out: dict[str, dict] = {"policy": {"path": args.policy or "random-init",
                                       "kube_weight": sched.kube_weight}}
    print(f"{'nodes':>6} {'what':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for n in [int(x) for x in args.sizes.split(",")]:
        nodes = cluster_of(base, n, rng)
        placed: list = []
        state = loaded_state(nodes, pods, rng, placed)
        calls = []
        for _ in range(args.calls * 3):
            pod = Pod.from_table(pods, int(rng.integers(len(pods))))
            cand = np.flatnonzero(state.feasible(pod))
            if len(cand) >= max(1, int(0.5 * n)) or len(calls) < 5:
                calls.append((pod, np.arange(n)))  # score every node, the worst case
            if len(calls) >= args.calls:
                break
        net_t, np_t, onnx_t, score_t = [], [], [], []
        for pod, cand in calls[:20]:  # warm-up
            f = sched.features.build(state, pod, cand)
            onnx_scorer.logits(f.nodes, f.pod, f.context)
            sched.score(state, pod, cand)
        for pod, cand in calls:
            f = sched.features.build(state, pod, cand)
            x = (torch.from_numpy(f.nodes)[None], torch.from_numpy(f.pod)[None],
                 torch.from_numpy(f.context)[None], torch.ones(1, len(cand), dtype=torch.bool))
            t0 = time.perf_counter()
            with torch.inference_mode():
                policy(*x)
            net_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            policy.score_numpy(f.nodes, f.pod, f.context)
            np_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            onnx_scorer.logits(f.nodes, f.pod, f.context)
            onnx_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sched.score(state, pod, cand)
            score_t.append(time.perf_counter() - t0)
        out[str(n)] = {"torch": timing_stats(net_t, POINTS), "numpy": timing_stats(np_t, POINTS),
                       "onnx": timing_stats(onnx_t, POINTS), "score": timing_stats(score_t, POINTS),
                       "calls": len(calls)}
        if args.search:
            out[str(n)]["search"] = {**timing_stats(search_times(args.search, state, pods, calls,
                                                                 args.search_calls), POINTS),
                                     "name": args.search}
        if args.served_search:
            if not args.policy:
                raise SystemExit("--served-search serves --policy: give a checkpoint")
            fits = [(pod, c) for pod, c in calls if state.feasible(pod).any()]
            served = served_times(args.served_search, args.policy, nodes, placed, fits, args.search_calls)
            out[str(n)]["served"] = {**timing_stats(served, POINTS), "search": args.served_search}
        for what in [w for w in ("torch", "numpy", "onnx", "score", "search", "served")
                     if w in out[str(n)]]:
            r = out[str(n)][what]
            print(f"{n:>6} {what:>8} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f}")
    p99 = out.get("500", {}).get("score", {}).get("p99_ms")
    if p99 is not None:
        print(f"goal: 500 nodes scored in <= 1 ms at p99: {p99:.3f} ms -> {'met' if p99 <= 1 else 'MISSED'}")
    if args.json_out:
        write_json(args.json_out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
