"""The observable form of the oracle's rule (``app-history-now`` of ``app_history_probe.py``: each
application's use per request as its running pods show it, sampled every minute) on the roll-out
gate's validation clusters (``fedsched evidence``'s clusters and seeds, never the benchmark's), in
the evidence's form, so ``compare_evidence.py`` pairs it with a policy's evidence seed by seed.
kube-default's runs come from the run cache (``common/sim/run_cache.py``). A probe, not a scheduler
(it reads the replay's usage model through private attributes). Run from the project root::

    python bench/results/attempts/app_history_validation.py --profiles web --seeds 60 --jobs 2 \\
        --json bench/results/attempts/evidence_app_history_now.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fedsched.common.schedulers import RESOLVERS, Scheduler, SchedulerContext
from fedsched.common.sim.evidence import collect
from fedsched.common.sim.run_cache import RunCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_history_probe import resolve

Resolver = Callable[[str, SchedulerContext], Scheduler | None]


def main(*resolvers: Resolver, default: str = "app-history-now") -> int:
    """Parse the command line, register ``resolvers`` (the probe's by default) and write the evidence."""
    ap = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default=default)
    ap.add_argument("--profiles", default="web")
    ap.add_argument("--seeds", type=int, default=60)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", dest="json_out", required=True)
    args = ap.parse_args()
    for r in resolvers or (resolve,):
        RESOLVERS.insert(0, r)
    t0 = time.time()

    def progress(profile: str, k: int, n: int, o) -> None:
        print(f"[{profile}] {k}/{n} {o.policy} seed {o.seed} ({time.time() - t0:.0f} s)", file=sys.stderr,
              flush=True)

    ev = collect(args.policy, [p for p in args.profiles.split(",") if p], seeds=args.seeds, jobs=args.jobs,
                 progress=progress, cache=RunCache())
    ev |= {"policy": args.policy, "wall_s": time.time() - t0,
           "recipe": f"python bench/results/attempts/{Path(sys.argv[0]).name} " + " ".join(sys.argv[1:])}
    for profile, e in ev["profiles"].items():
        t = e["trouble_score"]
        print(f"{profile}: trouble {t['mean']:+.3f} ± {t['ci95']:.3f}; "
              + ", ".join(f"{m} {v['mean']:+.3f} ± {v['ci95']:.3f}" for m, v in e["log_ratio"].items())
              + f" ({e['cached_runs']} runs from the cache)")
    Path(args.json_out).write_text(json.dumps(ev, indent=1, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
