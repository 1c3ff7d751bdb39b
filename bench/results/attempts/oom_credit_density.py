"""How many decisions an OOM charge reaches, per credit (chosen before the trained policies were
judged; what it measures does not depend on them): the shipped recipe's training clusters (16
replay environments, ``--scale small``, train pods), one episode each under kube-default, the node
credit with OOM kills alone priced at 1 over the recipe's horizon. For ``--oom-credit pod`` (the
placed pod's own kills) and ``node`` (every kill on the chosen node): the share of decisions
charged at least one kill, the kills charged per decision, and the clusters' mean share of memory
requested (``alloc_mem``). ``--profiles``, ``--scale``, ``--modes`` and ``--mem-median`` (one
memory level for every cluster) narrow or vary it. Run from the project root::

    python bench/results/attempts/oom_credit_density.py     # a few minutes
    python bench/results/attempts/oom_credit_density.py --profiles web --modes pod --mem-median 0.7
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from fedsched.agent.learning.env import OOM_CREDITS, RewardConfig
from fedsched.agent.learning.online import OnlineRecipe, build_envs, reference_typical
from fedsched.common.schedulers.base import SchedulerContext, place
from fedsched.common.schedulers.kube_default import KubeDefault


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--profiles", default="web,gpu,edge,openb")
    ap.add_argument("--scale", default="small", choices=("small", "realistic"))
    ap.add_argument("--modes", default=",".join(OOM_CREDITS))
    ap.add_argument("--mem-median", type=float, default=None,
                    help="the usage model's median memory use / request for every class (default: its own)")
    a = ap.parse_args()
    recipe = OnlineRecipe(profiles=tuple(a.profiles.split(",")), clusters_per_profile=4,
                          target_loads=(0.85, 0.95, 1.0), seed=1, scale=a.scale,
                          mem_use_range=None if a.mem_median is None else (a.mem_median, a.mem_median))
    typical = reference_typical(recipe)
    kube = KubeDefault(SchedulerContext())
    rng = np.random.default_rng(0)
    for mode in a.modes.split(","):
        t0 = time.time()
        reward = replace(RewardConfig(), node_horizon_s=1800.0, node_hot=0.0, node_throttled=0.0,
                         node_oom=1.0, oom_credit=mode)
        envs, _ = build_envs(recipe, typical, reward)
        per_profile: dict[str, list[float]] = {}
        for k, env in enumerate(envs):
            env.reset()
            credits: list[float] = []
            done = False
            while not done:
                pod, state, cand = env.pending
                _, _, done, _, info = env.step_placement(place(kube, state, pod, rng, cand), observe=False)
                credits.extend(c for _, c in info["credits"])
            row = per_profile.setdefault(recipe.profiles[k // recipe.clusters_per_profile], [0, 0, 0.0, 0.0])
            row[0] += len(credits)
            row[1] += sum(c < 0 for c in credits)
            row[2] += -sum(credits)
            row[3] += info["episode_metrics"]["alloc_mem"] / recipe.clusters_per_profile
        print(f"oom credit {mode}, scale {a.scale}, memory median {a.mem_median or 'default'} "
              f"({time.time() - t0:.0f} s): " + "; ".join(
            f"{p} {n:,} decisions, {hit / max(n, 1):.2%} charged, {kills / max(n, 1):.4f} kills each, "
            f"memory requested {mem:.1f}% (mean over clusters)"
            for p, (n, hit, kills, mem) in per_profile.items()), flush=True)


if __name__ == "__main__":
    main()
