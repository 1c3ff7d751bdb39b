"""How many evaluation seeds a main-job report would need to resolve its goals.

The per-member goals of the federation issue ask for differences of 0.10 on the trouble score
with the interval clear. Given a report of ``fedsched federate`` (``report.json``), this prints
for every member and comparison the mean paired difference, its per-seed standard deviation, the
report's 95% half-width and the seeds a paired interval of half-width ``--target`` (default 0.05:
a 0.10 effect then clears 0 with room) would need at that spread (normal approximation,
``(1.96 * sd / target)^2``), and the same across the members. It measures the evaluation's
resolution only: a second training run can move the mean by more (the report says so).

    python bench/federation_resolution.py out/federate/report.json [--target 0.05]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from federation_training_runs import comparisons

from fedsched.common.sim.paired import paired_difference

Z95 = 1.96


def resolution(values: list[float], target: float) -> dict[str, float]:
    """Mean, per-seed sd, the report's 95% half-width (``paired_difference``, as the job computes
    it) and the seeds for half-width ``target``."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return {"n": float(len(v)), "mean": math.nan, "sd": math.nan, "half_width": math.nan,
                "seeds_needed": math.nan}
    sd = float(v.std(ddof=1))
    half = paired_difference(list(v), [0.0] * len(v))["ci95"]
    return {"n": float(len(v)), "mean": float(v.mean()), "sd": sd, "half_width": float(half),
            "seeds_needed": float(math.ceil((Z95 * sd / target) ** 2))}


def rows(report: dict, target: float) -> list[tuple[str, str, dict[str, float]]]:
    """(member or "across the members", comparison, :func:`resolution`) for every trouble-score
    comparison that carries its per-seed values (:func:`federation_training_runs.comparisons`)."""
    return [(member, comparison, resolution(values, target))
            for (member, comparison), values in comparisons(report).items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="a report.json written by fedsched federate")
    ap.add_argument("--target", type=float, default=0.05, help="the 95%% half-width wanted (default 0.05)")
    args = ap.parse_args()
    if not args.target > 0:
        raise SystemExit("--target must be positive")
    report = json.loads(args.report.read_text())
    found = rows(report, args.target)
    if not found:
        raise SystemExit(f"{args.report}: no per-seed values of a trouble-score comparison "
                         "(is it a main-job report?)")
    width = max(len(f"{m}: {c}") for m, c, _ in found)
    print(f"{'member: comparison'.ljust(width)}  seeds     mean  sd/seed  ±95%  seeds for ±{args.target:g}")
    for member, comparison, r in found:
        print(f"{f'{member}: {comparison}'.ljust(width)}  {r['n']:5.0f}  {r['mean']:+7.3f}  {r['sd']:7.3f}  "
              f"{r['half_width']:4.2f}  {r['seeds_needed']:8.0f}")


if __name__ == "__main__":
    main()
