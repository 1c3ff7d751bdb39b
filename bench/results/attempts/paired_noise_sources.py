"""Probe (the benchmark's resolution): where the paired trouble score's spread comes from.

The benchmark pairs two schedulers seed by seed: both replay the same pods, arrivals and usage
parameters. What still differs between the two runs of one seed is every random draw whose order
depends on the schedule: the usage noise (a block of the innovation table per tick, laid over the
running pods in the order they sit in the packed arrays), the start-up delays (drawn in the order
pods start) and the schedulers' own tie-breaks. This probe replays a validation cluster of the
roll-out gate with ``learned-online`` beside kube-default under replay options that switch such
draws off, and prints the paired trouble score's mean and 95% half-width under each: where the
half-width falls, that source is what widens the interval.

    python bench/results/attempts/paired_noise_sources.py --profile edge --seeds 40

``--spread FILE ...`` reads stored paired figures instead (``fedsched evidence --json`` files and
``heuristic_mixture.py --validate`` files) and prints, for each paired trouble score, the spread of
its per-seed values and the seeds a 95% half-width of 0.05 and of 0.10 would take
(``(1.96 sd / h)^2``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from fedsched.common.sim.evaluate import evaluate
from fedsched.common.sim.evidence import EVIDENCE_SEED, PROFILE_SCENARIO
from fedsched.common.sim.scenarios import SCENARIOS, build

VARIANTS = {
    "as benchmarked": {},
    "no usage noise": {"usage_noise_cpu": 0.0, "usage_noise_mem": 0.0},
    "no start-up delay": {"startup_mean_s": 0.0},
    "neither": {"usage_noise_cpu": 0.0, "usage_noise_mem": 0.0, "startup_mean_s": 0.0},
}


def spread(paths: list[str]) -> None:
    """Per-seed spread of each stored paired trouble score, and the seeds for a given half-width."""
    for path in paths:
        d = json.loads(Path(path).read_text())
        series: dict[str, list[float]] = {}
        for profile, e in d.get("profiles", {}).items():  # fedsched evidence
            series[f"{profile} vs kube-default"] = e["trouble_score"]["values"]
        for profile, per in d.get("validation", {}).items():  # heuristic_mixture.py --validate
            for mix, e in list(per.items())[1:]:
                series[f"{profile} {mix} minus the first"] = e["minus_first"]["values"]
        print(path)
        for name, values in series.items():
            v = np.asarray(values, dtype=float)
            sd = float(v.std(ddof=1))
            need = [(1.96 * sd / h) ** 2 for h in (0.05, 0.10)]
            print(f"  {name:80s} n {len(v):3d}  sd {sd:.3f}  seeds for ±0.05: {need[0]:4.0f}  "
                  f"±0.10: {need[1]:3.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="edge", choices=sorted(PROFILE_SCENARIO))
    ap.add_argument("--policy", default="learned-online")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--spread", nargs="+", default=None, metavar="FILE")
    a = ap.parse_args(argv)
    if a.spread:
        spread(a.spread)
        return 0
    out = {}
    for name in a.variants.split(","):
        spec = build(SCENARIOS[PROFILE_SCENARIO[a.profile]], seed=EVIDENCE_SEED)
        spec.seeds = list(range(100, 100 + a.seeds))
        spec.policies, spec.reference = ["kube-default", a.policy], "kube-default"
        spec.replay_options = {**spec.replay_options, **VARIANTS[name]}
        t0 = time.time()
        res = evaluate(spec, jobs=a.jobs)
        p = res["paired"][a.policy]
        out[name] = {"trouble_score": p["trouble_score"], "log_ratio": p["log_ratio"]}
        t = p["trouble_score"]
        rails = "  ".join(f"{m} {v['mean']:+.3f} ± {v['ci95']:.3f}" for m, v in p["log_ratio"].items())
        print(f"{name:18s} trouble {t['mean']:+.3f} ± {t['ci95']:.3f}   {rails}   ({time.time() - t0:.0f} s)",
              flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "variants": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
