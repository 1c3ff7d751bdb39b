"""Attempt (issue 25): could a data-scarce member gain from a rich member of its own kind where
the fleet has no shipped policy for its workload (the seeded random start)? The web-late member
(60 nodes) trained alone at the scarce budget (100 decisions per round, 8 rounds, from the random
start) against web-1's local-only models (100 nodes, same profile, from the random start, trained
by local_learning_curve.py at 1000/4000/16000 decisions per round), on web-late's VALIDATION pods,
30 replay seeds, trouble score vs kube-default, paired against web-late's scarce local-only.
Also from the shipped start. Writes runs/prof/sibling_transfer.json."""
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from local_learning_curve import OUT, SEEDS, train, val

from fedsched.agent.federation.round import MemberState
from fedsched.common.compute import single_threaded_worker
from fedsched.common.model.metrics import trouble_score
from fedsched.common.sim.paired import paired_difference
from fedsched.coordinator.server_app import initial_weights

SCARCE, SIBLING = 4, "web-1"

if __name__ == "__main__":
    with ProcessPoolExecutor(2, initializer=single_threaded_worker) as pool:
        own = {s: pool.submit(train, SCARCE, s, 100, 3e-4, "") for s in ("random", "shipped")}
        models = {"kube": "kube-default", **{f"start {s}": initial_weights(s, 1, "online") for s in own},
                  **{f"own {s} 100": f.result() for s, f in own.items()},
                  **{f"{SIBLING} {s} {b}": MemberState(OUT / f"{SIBLING}-{s}-{b}").load("local")
                     for s in ("random", "shipped") for b in (1000, 4000, 16000)}}
        jobs = {(p, sd): pool.submit(val, (SCARCE, spec, sd)) for p, spec in models.items() for sd in SEEDS}
        kube = [jobs[("kube", sd)].result() for sd in SEEDS]
        per = {p: [trouble_score(jobs[(p, sd)].result(), kube[k]) for k, sd in enumerate(SEEDS)]
               for p in models if p != "kube"}
    rows = {}
    for p, v in per.items():
        ref = "own random 100" if "random" in p else "own shipped 100"
        d, k = paired_difference(v, per[ref]), paired_difference(v, [0.0] * len(v))
        rows[p] = {"vs kube": [k["mean"], k["ci95"]], "minus own local-only": [d["mean"], d["ci95"]]}
        print(f"web-late-4 {p:24s} vs kube {k['mean']:+.3f} +- {k['ci95']:.3f}   "
              f"minus its own scarce local-only {d['mean']:+.3f} +- {d['ci95']:.3f}", flush=True)
    Path("runs/prof/sibling_transfer.json").write_text(json.dumps({"rows": rows, "per_seed": per}))
