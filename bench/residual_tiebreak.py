"""Attempt 6 of the learning issue: a learned policy kept close to a heuristic, judged on the
roll-out gate's validation clusters.

``residual:BASE:MARGIN:POLICY`` scores a pod's nodes with the baseline ``BASE`` (e.g.
``kube-default``, whose scores are 50..200 points) and lets the learned ``POLICY`` (a shipped
name or a checkpoint path) choose among the nodes within ``MARGIN`` points of the baseline's
best; every other node keeps the baseline's score. ``MARGIN`` 0 uses the policy as the
baseline's tie-break only; a larger margin gives it more room. Each profile's validation
cluster (:mod:`fedsched.common.sim.evidence`: the gate's clusters, seeds and generator seed)
replays kube-default and every variant on the same seeds; the paired figures against
kube-default are printed and written as JSON.

    python bench/residual_tiebreak.py \
        --variants kube-default:0:learned-online,kube-default:10:learned-online \
        --json bench/results/attempts/residual_kube_default.json

The variants are registered as a scheduler resolver (``fedsched.common.schedulers.RESOLVERS``)
in this process; the evaluation's worker processes inherit it by fork (Linux).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.common.learning.scorers import scheduler_from_checkpoint
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.profiles import PROFILES
from fedsched.common.schedulers import RESOLVERS, SHIPPED, default_policy_path, make_scheduler
from fedsched.common.schedulers.base import Scheduler, SchedulerContext
from fedsched.common.sim.evaluate import RunOutput, evaluate
from fedsched.common.sim.evidence import EVIDENCE_SEED, PROFILE_SCENARIO, REFERENCE
from fedsched.common.sim.scenarios import SCENARIOS, build

PREFIX = "residual:"


class Residual(Scheduler):
    """``base``'s scores, with ``learned`` choosing among the nodes within ``margin`` of its best."""

    name = "residual"

    def __init__(self, ctx: SchedulerContext, base: Scheduler, learned: Scheduler, margin: float) -> None:
        super().__init__(ctx)
        self.base, self.learned, self.margin = base, learned, margin

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        b = np.asarray(self.base.score(state, pod, nodes), dtype=np.float64)
        if len(nodes) < 2:
            return b
        best = b.max()
        near = b >= best - self.margin
        if near.sum() < 2:
            return b
        learned = np.asarray(self.learned.score(state, pod, nodes), dtype=np.float64)
        lo, hi = learned[near].min(), learned[near].max()
        rel = (learned - lo) / (hi - lo) if hi > lo else np.zeros_like(learned)
        # the near nodes rank above every other node, ordered by the learned scores
        return np.where(near, best + self.margin + 1.0 + rel, b)

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        return self.base.select_gpus(state, pod, node)


def resolve(name: str, ctx: SchedulerContext) -> Scheduler | None:
    if not name.startswith(PREFIX):
        return None
    try:
        base, margin, policy = name[len(PREFIX):].split(":", 2)
        margin_points = float(margin)
    except ValueError:
        raise ValueError(f"{name!r}: expected {PREFIX}BASE:MARGIN:POLICY") from None
    if not margin_points >= 0:
        raise ValueError(f"{name!r}: the margin must be >= 0")
    path = default_policy_path(policy) if policy in SHIPPED else Path(policy)
    sched = Residual(ctx, make_scheduler(base, ctx), scheduler_from_checkpoint(path, ctx), margin_points)
    sched.name = name
    return sched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", required=True, help="comma-separated BASE:MARGIN:POLICY")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", dest="json_out", type=Path)
    args = ap.parse_args(argv)
    RESOLVERS.insert(0, resolve)
    variants = [PREFIX + v for v in args.variants.split(",") if v]
    out: dict[str, Any] = {"generator_seed": EVIDENCE_SEED, "reference": REFERENCE, "profiles": {}}
    t0 = time.time()
    for profile in [p for p in args.profiles.split(",") if p]:
        sc = SCENARIOS[PROFILE_SCENARIO[profile]]
        spec = build(sc, quick=False, seed=EVIDENCE_SEED)
        spec.seeds = list(range(100, 100 + sc.seeds))
        spec.policies = [REFERENCE, *variants]
        spec.reference = REFERENCE

        def progress(k: int, n: int, o: RunOutput, profile: str = profile) -> None:
            print(f"[{profile}] {k}/{n} {o.policy} seed {o.seed} ({time.time() - t0:.0f} s)", file=sys.stderr,
                  flush=True)

        paired = evaluate(spec, jobs=args.jobs, progress=progress)["paired"]
        out["profiles"][profile] = {"nodes": len(spec.nodes), "seeds": spec.seeds, "paired": paired}
        for p, pr in paired.items():
            t = pr["trouble_score"]
            print(f"{profile} ({len(spec.nodes)} nodes, {len(spec.seeds)} seeds) {p}: trouble score "
                  f"{t['mean']:+.3f} ± {t['ci95']:.3f}; "
                  + ", ".join(f"{m} {v['mean']:+.3f} ± {v['ci95']:.3f}" for m, v in pr["log_ratio"].items()),
                  flush=True)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(out, indent=1, default=float))
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
