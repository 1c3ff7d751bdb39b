"""Probe (issue 24, the throttling guardrail): does a guard in front of a node-scoring policy, or
kube-default's score beside it, stop the throttling it adds on web and edge clusters?

``guard[M]:POLICY`` scores with POLICY (a checkpoint path or a shipped name) and then demotes,
below every other candidate, each node whose windowed CPU peak plus the pod's expected use
would pass M of its capacity (``cpu_peak_headroom_after`` is that headroom against the hot-node
threshold, 0.85), as long as some candidate stays under: the policy keeps its order among the
nodes that stay under, and chooses as before where none does. ``rguard[M]:POLICY`` demotes
instead each node whose requested CPU share after the pod passes the cluster's by more than M.
``mix[W]:POLICY`` adds W times kube-default's score / 100 to the logits
(``PolicyScheduler.kube_weight``, what ``learned-online`` now ships with, W = 2). Each starts
from the policy's logits alone (a checkpoint's own ``kube_weight`` is not applied). The gate's
evidence for each (``fedsched.common.sim.evidence.collect``: the validation clusters and seeds
of ``fedsched evidence``) is written as JSON, to pair with another by ``compare_evidence.py``.

    python bench/results/attempts/throttle_guard.py --guard 1.0 --policy learned-online \
        --profiles web,gpu,edge --jobs 2 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import re
import time

import numpy as np

from fedsched.common.learning.features import CONTEXT_FEATURES, HOT_THRESHOLD, NODE_FEATURES
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.schedulers import RESOLVERS, SHIPPED, SchedulerContext, default_policy_path
from fedsched.common.sim.evidence import collect

_PEAK = NODE_FEATURES.index("cpu_peak_headroom_after")
_CPU_AFTER = NODE_FEATURES.index("cpu_after")
_ALLOC_CPU = CONTEXT_FEATURES.index("alloc_cpu")
_NAME = re.compile(r"^(?P<kind>r?guard|mix)\[(?P<m>[0-9.]+)\]:(?P<policy>.+)$")


class Guarded(PolicyScheduler):
    def __init__(self, base: PolicyScheduler, margin: float, name: str, requests: bool = False) -> None:
        super().__init__(base.policy, base.features.typical, base.ctx, name=name)
        self.margin = margin
        self.requests = requests

    def _over(self) -> np.ndarray:
        f = self.last_features
        if self.requests:  # the node's requested CPU share after the pod above the cluster's + margin
            requested = 1.0 - f.nodes[:, _CPU_AFTER].astype(np.float64)
            return requested > float(f.context[_ALLOC_CPU]) + self.margin
        # peak + expected use as a share of capacity = HOT_THRESHOLD - headroom
        return (HOT_THRESHOLD - f.nodes[:, _PEAK].astype(np.float64)) > self.margin

    def score(self, state, pod, nodes) -> np.ndarray:  # type: ignore[no-untyped-def]
        s = super().score(state, pod, nodes)
        over = self._over()
        if over.any() and not over.all():
            s = s.copy()
            s[over] = s.min() - 1.0 - (s.max() - s[over])  # below every node under, order kept
        return s


def _resolve(name: str, ctx: SchedulerContext) -> PolicyScheduler | None:
    m = _NAME.match(name)
    if m is None:
        return None
    policy = m["policy"]
    path = default_policy_path(policy) if policy in SHIPPED else policy
    base = PolicyScheduler.from_checkpoint(path, ctx)
    if m["kind"] == "mix":  # kube-default beside the policy: the scorer's own kube_weight
        return PolicyScheduler(base.policy, base.features.typical, ctx, name=name, kube_weight=float(m["m"]))
    return Guarded(base, float(m["m"]), name, m["kind"] == "rguard")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--guard", type=float, default=1.0, help="share of capacity the peak may reach")
    ap.add_argument("--requests", action="store_true",
                    help="guard on requests instead: the node's requested CPU share after the pod "
                         "may pass the cluster's by at most --guard")
    ap.add_argument("--mix", action="store_true",
                    help="no guard: add --guard times kube-default's score / 100 to the policy's logits")
    ap.add_argument("--policy", default="learned-online")
    ap.add_argument("--profiles", default="web,gpu,edge")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", dest="json_out", required=True)
    a = ap.parse_args()
    RESOLVERS.insert(0, _resolve)  # the pool's workers fork from here and keep it
    t0 = time.time()
    kind = "mix" if a.mix else "rguard" if a.requests else "guard"
    ev = collect(f"{kind}[{a.guard:g}]:{a.policy}", a.profiles.split(","), a.seeds, a.jobs)
    for profile, e in ev["profiles"].items():
        t = e["trouble_score"]
        parts = ", ".join(f"{m} {v['mean']:+.3f} ± {v['ci95']:.3f}" for m, v in e["log_ratio"].items())
        print(f"{profile}: trouble {t['mean']:+.3f} ± {t['ci95']:.3f} ({t['verdict']}); {parts}")
    with open(a.json_out, "w") as f:
        json.dump(ev, f)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
