"""Tiny clusters built directly from arrays (shared by the tests)."""

from __future__ import annotations

import numpy as np

from fedsched.common.model.cluster import ClusterState, NodeTable, Pod, PodTable


def make_nodes(cpu, mem, gpu, model=None, models=("A", "B")) -> NodeTable:
    n = len(cpu)
    gpu = np.asarray(gpu, dtype=np.int64)
    model = np.asarray(model if model is not None else [0 if g > 0 else -1 for g in gpu], dtype=np.int64)
    return NodeTable(names=tuple(f"n{i}" for i in range(n)), cpu=np.asarray(cpu, dtype=np.int64),
                     mem=np.asarray(mem, dtype=np.int64), gpu=gpu, model=model, models=tuple(models),
                     disk_io=np.full(n, 1000.0), net=np.full(n, 10000.0))


def make_pods(cpu, mem, num_gpu, gpu_milli, spec_mask=None, qos=None) -> PodTable:
    n = len(cpu)
    return PodTable(
        names=tuple(f"p{i}" for i in range(n)), cpu=np.asarray(cpu, dtype=np.int64),
        mem=np.asarray(mem, dtype=np.int64), num_gpu=np.asarray(num_gpu, dtype=np.int64),
        gpu_milli=np.asarray(gpu_milli, dtype=np.int64),
        spec_mask=np.asarray(spec_mask if spec_mask is not None else [0] * n, dtype=np.int64),
        qos=np.asarray(qos if qos is not None else [1] * n, dtype=np.int64),
        creation=np.full(n, np.nan), deletion=np.full(n, np.nan))


def first_fit_state(nodes: NodeTable, pods: PodTable, n_pods: int) -> ClusterState:
    """A state with the first ``n_pods`` pods bound where they fit (the last feasible node,
    kube's default GPU choice); pods that fit nowhere are skipped."""
    from fedsched.common.schedulers.base import default_gpu_choice

    state = ClusterState(nodes)
    for i in range(n_pods):
        pod = Pod.from_table(pods, i)
        fits = np.flatnonzero(state.feasible(pod))
        if len(fits):
            state.allocate(int(fits[-1]), pod, default_gpu_choice(state, pod, int(fits[-1])))
    return state


CROWDED = 0.5  # a node whose requested CPU share (its windowed peak without telemetry) is above this


def crowded(decision) -> np.ndarray:
    """Per candidate of a logged decision: True where the node is crowded (see CROWDED)."""
    from fedsched.common.learning.features import NODE_FEATURES

    return np.asarray(decision.nodes[:, NODE_FEATURES.index("cpu_peak_w")], dtype=np.float64) > CROWDED


def log_with_outcomes(log_dir, nodes: NodeTable, pods: PodTable, n: int,
                      behaviours: tuple[str, ...] = ("best-fit", "kube-default"), hot_s: float = 1800.0):
    """A decision log as a deployed member's outcome recorder writes it: ``n`` decisions in
    packing mode, each with its outcome, where a pod put on a crowded node was followed by
    ``hot_s`` seconds of that node running hot and any other by none. The binds alternate
    between ``behaviours`` (by default the member's packing policy where it served actively,
    kube-default where it was in shadow mode)."""
    from fedsched.agent.learning.bc import collect
    from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
    from fedsched.common.learning.decision_log import DecisionLog
    from fedsched.common.schedulers import make_scheduler

    log = DecisionLog(log_dir)
    per = -(-n // len(behaviours))
    decisions = [(b, d) for k, b in enumerate(behaviours)
                 for d in collect([SchedulingEnv(nodes, pods, config=EnvConfig(target_load=1.0), seed=k)],
                                  make_scheduler(b), per)]
    order = np.random.default_rng(0).permutation(len(decisions))[:n]
    for b, d in (decisions[i] for i in order):
        chosen = int(d.best[0])
        hot = hot_s if crowded(d)[chosen] else 0.0
        log.append(d, chosen, model_version=b,
                   reward={"pending_s": 1.0, "overload": float(hot > 0), "oom": 0.0, "hot_s": hot,
                           "observed_s": 300.0})
    log.flush()
    return log
