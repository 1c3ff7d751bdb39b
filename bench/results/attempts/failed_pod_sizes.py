"""A probe (issue 24): which pods a scheduler fails, by CPU request and QoS class, on a gate
validation cluster (``fedsched evidence``'s clusters and seeds, never the benchmark's).

Failed pods are one of the trouble score's four metrics and a guardrail. This replays the
profile's validation cluster with each scheduler on the first seeds of the evidence and counts
the failed pods (``ReplaySimulator.status``) per CPU-request band, per QoS class and, where the
cluster has GPUs, per kind of GPU request (failed / all) and, for the GPU pods, what stopped each
at its last attempt: no node with the GPUs it asks free (and of its GPU model), or nodes with the
GPUs but too little CPU or memory left on every one of them. The application-history probe's
names (``app-history-now``, ``app_history_probe.py``) are accepted too. Run from the project root::

    python bench/results/attempts/failed_pod_sizes.py --profile web --seeds 3 \\
        --policies kube-default,learned-online,app-history-now
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

from fedsched.common.compute import single_threaded
from fedsched.common.model.cluster import MILLI_PER_GPU, QOS_CLASSES, ClusterState, Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.schedulers import RESOLVERS, place
from fedsched.common.sim.evaluate import make_policy, scheduler_context, split
from fedsched.common.sim.evidence import EVIDENCE_SEED, PROFILE_SCENARIO
from fedsched.common.sim.replay import ReplayConfig, ReplaySimulator
from fedsched.common.sim.replay.config import FAILED
from fedsched.common.sim.scenarios import SCENARIOS, build

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_history_probe import resolve

BANDS = (0, 300, 600, 1000, 2000, 4000, 10**9)  # CPU request bands, milli-CPU


def gpu_blocked(state: ClusterState, pod: Pod) -> bool:
    """Whether no alive node has the GPUs ``pod`` asks for free (of a model it accepts), whatever
    its CPU and memory: the GPUs block it, not the node's other resources."""
    ok = state.alive & state.model_ok(pod)
    if pod.is_gpu_share:
        ok &= (state.gpu_free >= pod.gpu_milli).any(axis=1)
    else:
        ok &= (state.gpu_free >= MILLI_PER_GPU).sum(axis=1) >= pod.num_gpu
    return not ok.any()


def failed_mask(profile: str, policy: str, seed: int) -> tuple[np.ndarray, ...]:
    """One replay: (failed?, CPU request, QoS class, GPU kind, GPU-blocked at the last attempt?) per
    workload pod (the last False for a pod that did not fail or asks for no GPU)."""
    spec = build(SCENARIOS[PROFILE_SCENARIO[profile]], seed=EVIDENCE_SEED)
    train, work = split(spec)
    sched = make_policy(policy, scheduler_context(train, seed), "replay")
    sim = ReplaySimulator(spec.nodes, work, config=ReplayConfig(**spec.replay_options), seed=seed,
                          typical=TypicalPods.from_pods(train))
    attach = getattr(sched, "attach_simulator", None)
    if attach is not None:
        attach(sim)
    blocked = np.zeros(len(work), dtype=bool)
    failed_attempt = sim._failed_attempt

    def record(p: int) -> None:  # the simulator's own step, then why the pod's last attempt failed
        failed_attempt(p)
        if sim.status[p] == FAILED and work.num_gpu[p] > 0:
            blocked[p] = gpu_blocked(sim.state, Pod.from_table(work, p))

    sim._failed_attempt = record
    while (d := sim.next_pod()) is not None:
        pod, state = d
        sim.bind(place(sched, state, pod, sim.rng))
    sim.finish()
    failed = np.asarray(sim.status) == FAILED
    return failed, np.asarray(work.cpu), np.asarray(work.qos), gpu_kind(work), blocked


GPU_KINDS = ("CPU-only", "GPU-sharing", "1 GPU", "2-3 GPUs", "4+ GPUs")


def gpu_kind(work) -> np.ndarray:
    """Each pod's index in :data:`GPU_KINDS`."""
    n, milli = np.asarray(work.num_gpu), np.asarray(work.gpu_milli)
    return np.select([n == 0, (n == 1) & (milli < 1000), n == 1, n < 4], [0, 1, 2, 3], 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="web", choices=sorted(PROFILE_SCENARIO))
    ap.add_argument("--seeds", type=int, default=3, help="the evidence's first N seeds (100, 101, ...)")
    ap.add_argument("--policies", default="kube-default,learned-online,app-history-now")
    args = ap.parse_args()
    RESOLVERS.insert(0, resolve)
    single_threaded()
    t0 = time.time()
    for policy in [p for p in args.policies.split(",") if p]:
        runs = [failed_mask(args.profile, policy, 100 + k) for k in range(args.seeds)]
        f = np.concatenate([r[0] for r in runs])
        cpu = np.concatenate([r[1] for r in runs])
        qos = np.concatenate([r[2] for r in runs])
        per_seed = [int(r[0].sum()) for r in runs]
        bands = ", ".join(f"[{lo / 1000:g}, {hi / 1000:g}) {int((f & (cpu >= lo) & (cpu < hi)).sum())}"
                          for lo, hi in itertools.pairwise(BANDS) if hi < 10**9) + \
            f", >= {BANDS[-2] / 1000:g} {int((f & (cpu >= BANDS[-2])).sum())}"
        by_qos = ", ".join(f"{QOS_CLASSES[q]} {int((f & (qos == q)).sum())}" for q in range(len(QOS_CLASSES)))
        kind = np.concatenate([r[3] for r in runs])
        if (kind > 0).any():
            by_qos += " | " + ", ".join(f"{k} {int((f & (kind == i)).sum())}/{int((kind == i).sum())}"
                                        for i, k in enumerate(GPU_KINDS))
            blocked = np.concatenate([r[4] for r in runs])
            by_qos += (f" | failed GPU pods with no node holding their GPUs {int(blocked.sum())}, with GPUs "
                       f"free somewhere but CPU or memory short {int((f & (kind > 0) & ~blocked).sum())}")
        print(f"{policy:18s} failed {int(f.sum())} over {args.seeds} seeds {per_seed} | "
              f"by CPU request (cores): {bands} | {by_qos} ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
