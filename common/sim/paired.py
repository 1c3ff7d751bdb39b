"""Paired comparisons of schedulers: seed by seed against a reference, mean and 95% interval.

Every run of one seed replays the same workload (arrivals, durations, usage levels and noise are
drawn from the seed before any placement), so two schedulers on one seed differ only by their
decisions. The difference taken seed by seed removes the workload's own variance, which dominates
the spread of each scheduler's figures; this is the one comparison the benchmarks, the roll-out
gate's evidence and the federation's verdicts use, so a verdict means the same everywhere.

- :func:`one_sided_bounds`: one-sided bounds of a mean (the roll-out gate's test).
- :func:`paired_difference`: ``a - b`` seed by seed: mean, 95% half-width (Student t; NaN with
  fewer than two seeds), verdict.
- :func:`log_ratios`: per seed and trouble metric, ``log((policy + s) / (reference + s))`` with
  :data:`fedsched.common.model.metrics.TROUBLE_SMOOTHING`'s ``s``; their mean over metrics is the
  trouble score (:func:`fedsched.common.model.metrics.trouble_score`).
- :func:`paired_against`: every policy of an evaluation against the reference's runs: the trouble
  score, each trouble metric's log ratio and every metric's plain difference, each with its
  per-seed values.

A verdict is ``better`` or ``worse`` only where the 95% interval excludes 0; ``tie`` otherwise,
and with fewer than two seeds (no interval), whatever the difference.

May import: numpy and :mod:`fedsched.common.model.metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedsched.common.model.metrics import HIGHER_IS_BETTER, METRICS, TROUBLE_SMOOTHING, mean_ci95

TROUBLE = "trouble_score"
"""The key of the trouble score among a policy's paired figures."""


def verdict(mean: float, ci95: float, n: int, lower_is_better: bool = True) -> str:
    """``better``/``worse`` where the interval ``mean ± ci95`` of ``n`` seeds excludes 0."""
    if n < 2 or not (math.isfinite(mean) and math.isfinite(ci95)):
        return "tie"
    if mean + ci95 < 0:
        return "better" if lower_is_better else "worse"
    if mean - ci95 > 0:
        return "worse" if lower_is_better else "better"
    return "tie"


def one_sided_bounds(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float, int]:
    """``(mean, lower, upper, n)`` of the finite ``values``: ``lower`` and ``upper`` are the
    one-sided ``level`` confidence bounds of the mean (Student t, each on its own: the mean is
    above ``lower`` with confidence ``level``); NaN bounds with fewer than two values."""
    a = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if len(a) == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(a.mean())
    if len(a) < 2:
        return mean, math.nan, math.nan, len(a)
    from scipy import stats

    half = float(stats.t.ppf(level, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return mean, mean - half, mean + half, len(a)


def paired_difference(a: Sequence[float], b: Sequence[float], lower_is_better: bool = True) -> dict[str, Any]:
    """``a - b`` seed by seed (``a[i]`` and ``b[i]`` from one seed): ``mean``, ``ci95`` (the 95%
    half-width), ``n`` (seeds with both values finite), ``verdict`` and the per-seed ``values``."""
    if len(a) != len(b):
        raise ValueError(f"paired values need one per seed on both sides: {len(a)} against {len(b)}")
    return _summary([float(x) - float(y) for x, y in zip(a, b, strict=True)], lower_is_better)


def log_ratios(policy: Mapping[str, float], reference: Mapping[str, float]) -> dict[str, float]:
    """Per trouble metric, ``log((policy + s) / (reference + s))``; their mean is the trouble score."""
    return {m: math.log((float(policy.get(m, math.nan)) + s) / (float(reference.get(m, math.nan)) + s))
            for m, s in TROUBLE_SMOOTHING.items()}


def _summary(values: list[float], lower_is_better: bool = True) -> dict[str, Any]:
    ok = [x for x in values if math.isfinite(x)]
    mean, ci = mean_ci95(ok)
    if len(ok) < 2:
        ci = math.nan  # one seed has no interval (mean_ci95 says 0: a width no check may pass)
    return {"mean": mean, "ci95": ci, "n": len(ok), "verdict": verdict(mean, ci, len(ok), lower_is_better),
            "values": values}


def paired_against(runs: Mapping[str, Mapping[str, Mapping[str, float]]], reference: str,
                   metrics: Sequence[str] = METRICS) -> dict[str, dict[str, Any]]:
    """Every policy of ``runs`` (``{policy: {seed: metrics}}``, as :func:`fedsched.common.sim.
    evaluate.evaluate` keeps them) against ``reference`` on the seeds both ran:

    ``{policy: {"seeds": [...], "trouble_score": S, "log_ratio": {metric: S}, "diff": {metric: S}}}``
    where each ``S`` is a :func:`paired_difference`-shaped summary (``diff`` oriented by
    :data:`~fedsched.common.model.metrics.HIGHER_IS_BETTER`; the others lower is better). The
    reference itself is left out; a policy that shares no seed with it gets ``n = 0`` and ties.
    """
    if reference not in runs:
        raise ValueError(f"the reference {reference!r} has no runs (policies: {', '.join(runs)})")
    ref = runs[reference]
    out: dict[str, dict[str, Any]] = {}
    for p, per_seed in runs.items():
        if p == reference:
            continue
        seeds = [s for s in per_seed if s in ref]
        ratios = [log_ratios(per_seed[s], ref[s]) for s in seeds]
        trouble = [float(np.mean(list(r.values()))) for r in ratios]  # = trouble_score, term by term
        diff = {}
        for m in metrics:
            a = [float(per_seed[s].get(m, math.nan)) for s in seeds]
            b = [float(ref[s].get(m, math.nan)) for s in seeds]
            if any(math.isfinite(x - y) for x, y in zip(a, b, strict=True)):
                diff[m] = paired_difference(a, b, lower_is_better=m not in HIGHER_IS_BETTER)
        out[p] = {
            "seeds": list(seeds),
            TROUBLE: _summary(trouble),
            "log_ratio": {m: _summary([r[m] for r in ratios]) for m in TROUBLE_SMOOTHING},
            "diff": diff,
        }
    return out
