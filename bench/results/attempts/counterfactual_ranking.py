"""Attempt (issue 24): how well do policies order the candidates of the counterfactually credited
decisions (``counterfactual_credit.py``'s ``credited.pkl``)? Over the decisions whose candidates'
costs differ, every pair of candidates with different costs: the share a policy's served score
(logits + 2 x kube-default / 100) orders right, and the share of decisions where its top candidate
is a least-cost one. In-sample for the counterfactual fit (these are its training decisions).

    python bench/results/attempts/counterfactual_ranking.py runs/cf30k/credited.pkl \\
        runs/cf30k/checkpoint.pt common/data/policies/online.pt
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np

from fedsched.common.learning.scorers import scheduler_from_checkpoint

KUBE_WEIGHT = 2.0  # both policies are served with it


def main(data_path: str, *checkpoints: str) -> None:
    data = pickle.loads(Path(data_path).read_bytes())["data"]
    groups: dict[int, list] = {}
    for c in data:
        groups.setdefault(id(c.decision), []).append(c)
    contrasted = [g for g in groups.values() if len({c.credit for c in g}) > 1]
    print(f"{len(groups)} decisions, {len(contrasted)} with candidates whose costs differ")
    scorers: list[tuple[str, object]] = [(p, scheduler_from_checkpoint(p)) for p in checkpoints]
    scorers += [("kube-default", "kube"), ("random", "random")]
    rng = np.random.default_rng(0)
    for name, pol in scorers:
        right = total = 0.0
        best = 0
        for g in contrasted:
            dec = g[0].decision
            idx = np.array([c.chosen for c in g])
            cost = np.array([-c.credit for c in g])
            tie = np.array([c.tie for c in g])
            if pol == "kube":
                s = tie
            elif pol == "random":
                s = rng.random(len(g))
            else:
                s = pol.logits(dec.nodes.astype(np.float32), dec.pod, dec.context)[idx] + KUBE_WEIGHT * tie
            for i in range(len(g)):
                for j in range(i + 1, len(g)):
                    if cost[i] != cost[j]:
                        total += 1
                        right += 0.5 if s[i] == s[j] else float((s[i] > s[j]) == (cost[i] < cost[j]))
            best += int(cost[int(np.argmax(s))] == cost.min())
        print(f"{name}: orders {right / total:.1%} of {int(total)} pairs right; its top candidate is a "
              f"least-cost one in {best / len(contrasted):.1%} of the decisions")


if __name__ == "__main__":
    main(*sys.argv[1:])
