"""Sim-to-real: the same pods through a real member cluster and through its twin.

The real loop is one member of the kwok fleet (``fedsched.experiment.fleet``): etcd,
kube-apiserver, kube-scheduler with the agent's extender profile, kwok's nodes and pod
lifecycles, a real Prometheus, ``fedsched serve`` in shadow (it answers kube-default's scores,
so the real scheduler decides as kube-default plus its own plugins) and ``fedsched record``
beside it. The twin is what the member's validation replays: the recorder's ``nodes.csv`` and
``pods.csv`` through the simulator, as recorded (arrivals, lifetimes without the recorded waits
for a node as the member's twin takes them, and measured use; no jitter, no node failures).

Figures (printed, and with ``--json``):

- **bindings consistent with the simulator's kube-default**: the real cluster's bindings are
  replayed in order (the simulator binds each pod where the real scheduler did), and at each
  decision the real node is checked against the simulator's kube-default on the same state:
  the same node as its pick, and among its best-scored nodes (kube-scheduler breaks ties at
  random, so the tie set is the fair test); each pod once, when the real node has room for it
  in the replay (until then it waits: the attempts are counted);
- **free replay**: the simulator's kube-default schedules the twin itself (with kwok's constant
  use per pod, and with the usage model's daily cycle and noise as the gate's twin runs it); the
  share of pods on the same node as in reality, and pending time (creation to scheduling) and hot
  CPU node-time (1-minute CPU above 85%) beside the real run's (the recording's times; the
  member's Prometheus).

    python bench/sim_to_real.py --nodes 40 --pods 600 --minutes 4 --json bench/results/sim_to_real.json

Needs what the fleet needs: ``bash scripts/build_k8s.sh`` (kwok included) and Prometheus.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedsched.common.federation.members import without_recorded_waits
from fedsched.common.model.traces import load_nodes, load_pods
from fedsched.common.schedulers import place
from fedsched.common.schedulers.base import Placement
from fedsched.common.schedulers.kube_default import KubeDefault
from fedsched.common.sim.replay import ReplayConfig, ReplaySimulator
from fedsched.experiment import fleet

# The twin as recorded, measured as the fleet's Prometheus measures (5 s samples, hot = a 1-minute
# CPU rate above 85%): no jitter, no start-up delay, no node failures, the run until idle.
AS_RECORDED = dict(arrival_jitter_s=0.0, duration_jitter=0.0, startup_mean_s=0.0,
                   failure_rate_per_node_hour=0.0, horizon_s=float("inf"), usage_tick_s=5.0,
                   hot_window_s=60.0)
# kwok runs each pod at one constant use: the usage model without its daily cycle and noise
CONSTANT_USE = dict(usage_amp_cpu=(0.0,) * 4, usage_amp_mem=(0.0,) * 4, usage_noise_cpu=0.0,
                    usage_noise_mem=0.0)


def recorded_bindings(pods_csv: Path) -> dict[str, tuple[str, float]]:
    """Pod name -> (node, seconds from creation to scheduling), for the pods the real scheduler bound."""
    out = {}
    with pods_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            node, created = row.get("node", ""), row.get("creation_time", "")
            sched = row.get("scheduled_time", "")
            if node and created and sched:
                out[row["name"]] = (node, max(0.0, float(sched) - float(created)))
    return out


def replay(nodes, pods, real: dict[str, tuple[str, float]], cfg: ReplayConfig, *,
           forced: bool) -> tuple[dict[str, float], dict[str, float]]:
    """The twin through the simulator's kube-default. ``forced``: each pod is bound where the real
    scheduler bound it (the states stay the real ones) and each real binding is checked against the
    simulator's pick and its best-scored (tied) nodes; else the simulator schedules freely and its
    picks are compared with the real nodes. Returns (agreement, the run's metrics)."""
    sim = ReplaySimulator(nodes, pods, config=cfg, seed=0)
    kd = KubeDefault()
    node_id = {n: i for i, n in enumerate(nodes.names)}
    same = tied = checked = waits = 0
    judged: set[int] = set()
    while (d := sim.next_pod()) is not None:
        pod, state = d
        target = real.get(pods.names[pod.index])
        rid = node_id.get(target[0], -1) if target is not None else -1
        if forced and rid >= 0:
            put = place(kd, state, pod, sim.rng, candidates=np.array([rid]))
            if put.node != rid:  # the real node has no room yet here: the pod waits, not judged
                waits += 1
                sim.bind(Placement(-1))
                continue
        best = kd.top_nodes(state, pod)
        pick = place(kd, state, pod, sim.rng)
        if rid >= 0 and pod.index not in judged:  # each pod once: its binding (forced) or first pick
            judged.add(pod.index)
            checked += 1
            same += int(pick.node == rid)
            tied += int(rid in {int(b) for b in best})
        sim.bind(put if forced and rid >= 0 else pick)
    m = sim.finish().metrics
    agree = {"decisions": checked, "same_node": same / max(checked, 1), "among_best": tied / max(checked, 1)}
    if forced:
        agree["attempts_waiting_for_the_real_node"] = waits
    keys = ("hot_cpu_node_s", "pending_mean_s", "pending_p99_s", "failed_pods")
    return agree, {k: float(m[k]) for k in keys}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--profile", default="web")
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--pods", type=int, default=600)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--lifetime-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None,
                    help="keep the member's directory (its recording in OUT/m/twin, its logs) here")
    a = ap.parse_args(argv)
    nodes, pods = fleet.load_inventory(a.profile, a.nodes, a.pods, a.seed)
    creation = np.nan_to_num(pods.creation.astype(float), nan=0.0)
    span = float(creation.max(initial=0.0) - creation.min(initial=0.0))
    speed = max(1.0, span / (0.8 * a.minutes * 60))
    work = fleet.Workload.from_trace(nodes, pods, speed, a.seed)
    work.lifetime *= a.lifetime_scale
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        root = a.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        member = stack.enter_context(fleet.member_cluster(root / "m", "member-0", nodes))
        tally = fleet.run_workload(member, work, a.minutes * 60 + 120, report_every=30)
        ran = time.monotonic() - t0
        real_trouble = fleet.trouble(member, ran)
        time.sleep(7)  # the recorder's last flush (every 5 s in the fleet)
        twin_nodes = load_nodes(member.twin / "nodes.csv")
        recorded = load_pods(member.twin / "pods.csv", twin_nodes, allow_oversized=True)
        twin_pods = without_recorded_waits(recorded, member.twin / "pods.csv")  # as the member's twin
        real = recorded_bindings(member.twin / "pods.csv")
    cfg = ReplayConfig(**AS_RECORDED, **CONSTANT_USE)
    bindings, _ = replay(twin_nodes, twin_pods, real, cfg, forced=True)
    free = {}
    for label, extra in (("constant use", CONSTANT_USE), ("usage model's cycle and noise", {})):
        cfg = ReplayConfig(**AS_RECORDED, **extra)
        agree, metrics = replay(twin_nodes, twin_pods, real, cfg, forced=False)
        free[label] = {**metrics, "same_node": agree["same_node"]}
    waits = np.array([w for _, w in real.values()])
    out = {
        "cluster": {"profile": a.profile, "nodes": len(nodes), "pods_submitted": tally.submitted,
                    "pods_bound": tally.bound, "recorded_pods": len(twin_pods),
                    "recorded_bindings": len(real)},
        "real": {"hot_cpu_node_s": real_trouble["hot_node_seconds"],
                 "mean_node_cpu": real_trouble["mean_node_cpu"],
                 "max_node_cpu": real_trouble["max_node_cpu"],
                 "pending_mean_s": float(waits.mean()) if len(waits) else float("nan"),
                 "pending_p99_s": float(np.quantile(waits, 0.99)) if len(waits) else float("nan")},
        "bindings": bindings, "twin": free, "wall_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
