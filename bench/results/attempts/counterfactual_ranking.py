"""Attempt (issue 24): how well do policies order the candidates of the counterfactually credited
decisions (``counterfactual_credit.py``'s ``credited.pkl``)? Over the decisions whose candidates'
costs differ, every pair of candidates with different costs: the share a policy's served score
(logits + 2 x kube-default / 100) orders right, and the share of decisions where its top candidate
is a least-cost one. Intervals: 95% percentile bootstrap over decisions (pairs of one decision are
not independent); the first policy's paired difference with each other one the same way.

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
BOOTSTRAP = 2000


def per_decision(groups: list[list], pol: object, rng: np.random.Generator) -> np.ndarray:
    """[decisions, 3]: pairs ordered right, pairs with different costs, top candidate least-cost."""
    rows = np.zeros((len(groups), 3))
    for k, g in enumerate(groups):
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
                    rows[k, 1] += 1
                    rows[k, 0] += 0.5 if s[i] == s[j] else float((s[i] > s[j]) == (cost[i] < cost[j]))
        rows[k, 2] = float(cost[int(np.argmax(s))] == cost.min())
    return rows


def shares(rows: np.ndarray) -> tuple[float, float]:
    return rows[:, 0].sum() / rows[:, 1].sum(), rows[:, 2].mean()


def interval(rows: np.ndarray, boot: np.ndarray, other: np.ndarray | None = None) -> list[str]:
    est = np.array(shares(rows)) - (np.array(shares(other)) if other is not None else 0.0)
    draws = np.array([np.array(shares(rows[b])) - (np.array(shares(other[b])) if other is not None else 0.0)
                      for b in boot])
    lo, hi = np.percentile(draws, [2.5, 97.5], axis=0)
    sign = "+" if other is not None else ""
    return [f"{e:{sign}.1%} [{a:{sign}.1%}, {b:{sign}.1%}]" for e, a, b in zip(est, lo, hi, strict=True)]


def main(data_path: str, *checkpoints: str) -> None:
    data = pickle.loads(Path(data_path).read_bytes())["data"]
    groups: dict[int, list] = {}
    for c in data:
        groups.setdefault(id(c.decision), []).append(c)
    contrasted = [g for g in groups.values() if len({c.credit for c in g}) > 1]
    print(f"{len(groups)} decisions, {len(contrasted)} with candidates whose costs differ")
    rng = np.random.default_rng(0)
    boot = rng.integers(len(contrasted), size=(BOOTSTRAP, len(contrasted)))
    scorers: list[tuple[str, object]] = [(p, scheduler_from_checkpoint(p)) for p in checkpoints]
    scorers += [("kube-default", "kube"), ("random", "random")]
    table = {name: per_decision(contrasted, pol, rng) for name, pol in scorers}
    first = scorers[0][0]
    for name, rows in table.items():
        pairs, top = interval(rows, boot)
        print(f"{name}: orders {pairs} of {int(rows[:, 1].sum())} pairs right; its top candidate is a "
              f"least-cost one in {top} of the decisions")
    for name, rows in table.items():
        if name != first:
            pairs, top = interval(table[first], boot, rows)
            print(f"{first} minus {name}: pairs {pairs}, top {top}")


if __name__ == "__main__":
    main(*sys.argv[1:])
