"""Verdicts of the main job over several training runs.

One report of ``fedsched federate`` judges its models over evaluation seeds only, and its
intervals do not hold the training's own variation: between two trainings that differ only by
INT8 rounding a global model's mean trouble score moved by up to 0.26 on one member. Given the
reports of K trainings of one configuration (``fedsched federate --training-seed k`` for k = 1..K,
the same evaluation seeds), this prints for every trouble-score comparison of the report (per
member and across the members) each run's mean, the mean over the runs and a 95% interval that
holds both sources of variation: the runs x seeds table's standard error
``sqrt(var(run means) / K + var(seed means) / S)`` with Welch-Satterthwaite's degrees of
freedom (conservative: each term also carries the residual). A verdict is better or worse only
where that interval clears 0; ``flips`` counts the runs whose own verdict (the report's,
evaluation seeds only) disagrees with the pooled one.

    python bench/federation_training_runs.py runs/fed/report.json runs/fed_ts2/report.json ...
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fedsched.common.sim.paired import paired_difference, verdict

# FederateConfig fields that may differ between runs of one configuration (how the job ran, not
# what it trained)
RUN_ONLY = {"training_seed", "workers", "beside_flower", "reused_training"}


def comparisons(report: dict[str, Any]) -> dict[tuple[str, str], list[float]]:
    """``{(member or "across the members", comparison): per-seed differences}`` for every
    trouble-score comparison of a main-job report that carries its per-seed values."""
    found: dict[tuple[str, str], Any] = {}
    for name, verdicts in report.get("verdicts", {}).items():
        for key, d in (verdicts.items() if isinstance(verdicts, dict) else ()):
            if isinstance(d, dict) and "values" in d and (key.startswith("trouble_score")
                                                          or key == "local-only against its start"):
                found[(name, key.removeprefix("trouble_score "))] = d["values"]
    for key, d in report.get("fleet", {}).items():
        if isinstance(d, dict) and "values" in d and key.startswith("trouble_score"):
            found[("across the members", key.removeprefix("trouble_score "))] = d["values"]
    out = {}
    for (member, comparison), values in found.items():
        try:
            out[(member, comparison)] = [float(x) for x in values]
        except (TypeError, ValueError):
            raise ValueError(f"{member}: {comparison}: per-seed values must be numbers") from None
    return out


def pooled(table: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Mean and 95% half-width of a runs x seeds table of paired differences (module docstring);
    ``run_means`` and the verdict (``better``/``worse``/``tie``, lower is better)."""
    a = np.asarray(table, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2 or a.shape[1] < 2 or not np.isfinite(a).all():
        raise ValueError(f"need at least 2 runs x 2 seeds of finite values, got shape {a.shape}")
    k, s = a.shape
    run_means, seed_means = a.mean(axis=1), a.mean(axis=0)
    v_run, v_seed = run_means.var(ddof=1) / k, seed_means.var(ddof=1) / s
    se = math.sqrt(v_run + v_seed)
    if se == 0:
        df, half = math.inf, 0.0
    else:
        df = (v_run + v_seed) ** 2 / (v_run**2 / (k - 1) + v_seed**2 / (s - 1))
        half = float(stats.t.ppf(0.975, df) * se)
    mean = float(a.mean())
    return {"mean": mean, "ci95": half, "df": df, "run_means": [float(x) for x in run_means],
            "verdict": verdict(mean, half, k * s)}


def run_verdict(values: Sequence[float]) -> str:
    """One run's own verdict over its evaluation seeds, as the report computes it."""
    return paired_difference(values, [0.0] * len(values))["verdict"]


def check_same_configuration(reports: dict[str, dict[str, Any]]) -> None:
    """Refuse reports of different configurations, of one training seed twice, or of other
    evaluation seeds."""
    configs = {p: {k: v for k, v in r.get("config", {}).items() if k not in RUN_ONLY}
               for p, r in reports.items()}
    first = next(iter(configs))
    for p, c in configs.items():
        diff = sorted(k for k in set(c) | set(configs[first]) if c.get(k) != configs[first].get(k))
        if diff:
            raise ValueError(f"{p} and {first} are not runs of one configuration: they differ in "
                             f"{', '.join(diff)}")
    seeds = [r.get("config", {}).get("training_seed", 1) for r in reports.values()]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"two reports share a training seed ({seeds}): they are the same training")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path, help="report.json of each training run")
    ap.add_argument("--json", type=Path, default=None, help="also write the pooled verdicts here")
    args = ap.parse_args(argv)
    if len(args.reports) < 2:
        ap.error("need the reports of at least 2 training runs")
    try:
        reports = {str(p): json.loads(p.read_text()) for p in args.reports}
        for path, report in reports.items():
            if not isinstance(report, dict) or not all(
                    isinstance(report.get(k, {}), dict) for k in ("config", "verdicts", "fleet")):
                raise ValueError(f"{path}: not a main-job report (a JSON object of config, verdicts, fleet)")
        check_same_configuration(reports)
        tables = [comparisons(r) for r in reports.values()]
        keys = [k for k in tables[0] if all(k in t for t in tables)]
        if not keys:
            raise ValueError("the reports have no trouble-score comparison in common "
                             "(are they main-job reports?)")
        rows = {k: pooled([t[k] for t in tables]) for k in keys}
    except (OSError, ValueError) as e:
        print(f"federation_training_runs: {e}", file=sys.stderr)
        return 2
    k = len(tables)
    print(f"{k} training runs x {len(tables[0][keys[0]])} evaluation seeds; trouble score differences, "
          "below 0 is better; the interval holds the training's variation and the seeds'")
    width = max(len(f"{m}: {c}") for m, c in keys)
    print(f"{'member: comparison'.ljust(width)}  {'run means':>{8 * k}}   pooled mean ± 95%"
          "    verdict  flips")
    for (member, comparison), r in rows.items():
        flips = sum(run_verdict(t[(member, comparison)]) != r["verdict"] for t in tables)
        runs = "".join(f"{m:+8.3f}" for m in r["run_means"])
        print(f"{f'{member}: {comparison}'.ljust(width)}  {runs}   {r['mean']:+.3f} ± {r['ci95']:.3f}"
              f"{'':6s}{r['verdict']:>7s}  {flips}/{k}")
        r["flips"] = flips
    if args.json:
        args.json.write_text(json.dumps({"reports": list(reports), "rows": [
            {"member": m, "comparison": c, **r} for (m, c), r in rows.items()]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
