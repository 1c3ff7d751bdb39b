"""Attempt (issue 25): does a member's own learning (local-only: the federation's round at eta 1)
grow with its data? Local-only on one member with D decisions per round for 8 rounds, from the
shipped start and from the seeded random start, the experience log holding all of them; each
final model on the member's VALIDATION pods (never the report's test pods), 30 replay seeds,
trouble score vs kube-default per seed, paired against its start.

    python bench/results/attempts/local_learning_curve.py [--members 0,1] [--budgets 1000,4000,16000]
        [--starts shipped,random] [--learning-rate 3e-4] [--tag NAME]

Writes runs/prof/local_learning_curve[_NAME].json.
"""
import argparse
import dataclasses
import json
import math
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from fedsched.agent.federation.learners import ReplayCreditLearner
from fedsched.agent.federation.round import MemberState, RoundInfo, member_round
from fedsched.agent.federation.validation import replay_metrics
from fedsched.common.compute import single_threaded_worker
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.scoring import member_scheduler
from fedsched.common.model.metrics import trouble_score
from fedsched.common.schedulers import SchedulerContext
from fedsched.common.sim.evaluate import make_policy
from fedsched.common.sim.paired import paired_difference
from fedsched.coordinator.server_app import initial_weights
from fedsched.experiment.baselines import _member
from fedsched.experiment.config import FederateConfig

SEEDS = list(range(1000, 1030))
OUT = Path("runs/learning_curve")


def train(member_id: int, start: str, budget: int, lr: float, tag: str, rounds: int = 8):
    t0 = time.time()
    cfg = FederateConfig(local_decisions=budget, scarce_decisions=budget, local_learning_rate=lr)
    member_cfg = dataclasses.replace(cfg.member_config(OUT), eta=1.0, upload_every=1, upload_norm=math.inf)
    member = member_cluster(member_id)
    learner = dataclasses.replace(ReplayCreditLearner.from_config(member, member_cfg), joins_at=1,
                                  max_experience=budget * rounds, validate=False)
    state = MemberState(OUT / f"{member.name}-{start}-{budget}{tag}")
    if state.dir.exists():
        shutil.rmtree(state.dir)
    init = initial_weights(start, 1, "online")
    for rnd in range(1, rounds + 1):
        member_round(learner, state, init, member_cfg, RoundInfo.for_member(rnd, member_id))
    print(f"trained {member.name} {start} {budget}: {time.time() - t0:.0f} s", flush=True)
    return state.load("local")


def val(args):
    member_id, spec, seed = args
    member = _member(member_id, "full")
    if isinstance(spec, str):
        sched = make_policy(spec, SchedulerContext(train_pods=member.train, rng=np.random.default_rng(seed)),
                            "replay")
    else:
        sched = member_scheduler(spec, 2.0)
    return replay_metrics(member, sched, member.val, seed=seed)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", default="0,1")
    ap.add_argument("--budgets", default="1000,4000,16000")
    ap.add_argument("--starts", default="shipped,random")
    ap.add_argument("--learning-rate", type=float, default=3e-4)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    starts = args.starts.split(",")
    tag = f"_{args.tag}" if args.tag else ""
    members = [int(x) for x in args.members.split(",")]
    budgets = [int(x) for x in args.budgets.split(",")]
    t0 = time.time()
    with ProcessPoolExecutor(2, initializer=single_threaded_worker) as pool:
        trained = {(m, s, b): pool.submit(train, m, s, b, args.learning_rate, tag)
                   for b in sorted(budgets, reverse=True) for m in members for s in starts}
        trained = {k: f.result() for k, f in trained.items()}
        print(f"all trained: {time.time() - t0:.0f} s", flush=True)
        jobs = {}
        for m in members:
            models = {"kube": "kube-default",
                      **{f"start {s}": initial_weights(s, 1, "online") for s in starts},
                      **{f"{s} {b}": trained[(m, s, b)] for (mm, s, b) in trained if mm == m}}
            for p, spec in models.items():
                for sd in SEEDS:
                    jobs[(m, p, sd)] = pool.submit(val, (m, spec, sd))
        result = {}
        for m in members:
            name = member_cluster(m).name
            kube = [jobs[(m, "kube", sd)].result() for sd in SEEDS]
            ps = sorted({p for (mm, p, _) in jobs if mm == m and p != "kube"})
            per = {p: [trouble_score(jobs[(m, p, sd)].result(), kube[k]) for k, sd in enumerate(SEEDS)]
                   for p in ps}
            rows = {}
            for p in ps:
                vs_kube = paired_difference(per[p], [0.0] * len(SEEDS))
                start = "start " + p.split()[0] if not p.startswith("start") else p
                d = paired_difference(per[p], per[start])
                rows[p] = {"vs kube": [vs_kube["mean"], vs_kube["ci95"]],
                           "minus start": [d["mean"], d["ci95"]]}
                print(f"{name:14s} {p:16s} vs kube {vs_kube['mean']:+.3f} +- {vs_kube['ci95']:.3f}   "
                      f"minus its start {d['mean']:+.3f} +- {d['ci95']:.3f}", flush=True)
            result[name] = {"rows": rows, "per_seed": per}
    print(f"total {time.time() - t0:.0f} s")
    Path("runs/prof").mkdir(parents=True, exist_ok=True)
    Path(f"runs/prof/local_learning_curve{tag}.json").write_text(json.dumps(result))
