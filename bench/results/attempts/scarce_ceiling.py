"""Attempt (issue 25): how much could a data-scarce member gain from more data like its own, or
from a rich member's model? Measured on the members' VALIDATION pods (never the test pods the
report judges on), 30 replay seeds, trouble score vs kube-default per seed.

For each scarce member (edge-2, gpu-cpuheavy-3) it compares, on the scarce member's own pods:
  - local-only at its scarce budget (100 decisions per round, the main job's, runs/fed_val),
  - its rich twin: local-only on the same member with the rich members' budget (1000 decisions per
    round, 8 rounds, the same learner and seeds): the most that ten times as much data from its
    own distribution gives this learner (a ceiling on what data from similar members can give),
  - each rich member's local-only model (gpu-train-0, web-1, web-late-4) transferred as it is,
  - the FedAvg global and personalised eta=0.2 of the main job (runs/fed_val),
  - the shipped start.
Paired differences against the scarce local-only. Writes runs/prof/scarce_ceiling.json.

    PYTHONPATH=bench/results/attempts python bench/results/attempts/scarce_ceiling.py
"""
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from local_learning_curve import val

from fedsched.agent.federation.round import MemberState
from fedsched.common.compute import single_threaded_worker
from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.weights import load_npz
from fedsched.common.model.metrics import trouble_score
from fedsched.common.sim.paired import paired_difference
from fedsched.coordinator.server_app import initial_weights
from fedsched.experiment.baselines import local_only
from fedsched.experiment.config import FederateConfig

SEEDS = list(range(1000, 1030))
RUN = Path("runs/fed_val")
OUT = Path("runs/scarce_ceiling")
SCARCE = (2, 3)
RICH = (0, 1, 4)


def _twin(member_id):
    cfg = FederateConfig(scarce_decisions=FederateConfig().local_decisions)
    w, _ = local_only(member_id, cfg, initial_weights("shipped", 1, "online"), OUT)
    return w


if __name__ == "__main__":
    names = {i: member_cluster(i).name for i in range(5)}
    glob = {k: v for k, v in load_npz(RUN / "fedavg/hub/global.npz").items() if k != "__round__"}
    rich = {f"{names[i]} local-only": MemberState(RUN / "local-only" / names[i]).load("local") for i in RICH}
    with ProcessPoolExecutor(2, initializer=single_threaded_worker) as pool:
        twins = {i: pool.submit(_twin, i) for i in SCARCE}
        twins = {i: f.result() for i, f in twins.items()}
        print("twins trained", flush=True)
        jobs = {}
        for i in SCARCE:
            own_local = MemberState(RUN / "local-only" / names[i]).load("local")
            fed_local = MemberState(RUN / "fedavg/state" / names[i]).load("local")
            models = {"kube": "kube-default", "start": initial_weights("shipped", 1, "online"),
                      "local-only": own_local, "rich twin": twins[i], "global": glob,
                      "personalised": personalised_mix(fed_local, glob, 0.2), **rich}
            for p, spec in models.items():
                for sd in SEEDS:
                    jobs[(i, p, sd)] = pool.submit(val, (i, spec, sd))
        result = {}
        for i in SCARCE:
            kube = [jobs[(i, "kube", sd)].result() for sd in SEEDS]
            ps = sorted({p for (j, p, _) in jobs if j == i and p != "kube"})
            per = {p: [trouble_score(jobs[(i, p, sd)].result(), kube[k]) for k, sd in enumerate(SEEDS)]
                   for p in ps}
            rows = {}
            for p in ps:
                d = paired_difference(per[p], per["local-only"])
                rows[p] = {"vs kube": float(np.mean(per[p])), "minus local-only": [d["mean"], d["ci95"]]}
                print(f"{names[i]:16s} {p:28s} vs kube {np.mean(per[p]):+.3f}   minus local-only "
                      f"{d['mean']:+.3f} +- {d['ci95']:.3f}", flush=True)
            result[names[i]] = {"rows": rows, "per_seed": per}
    Path("runs/prof").mkdir(parents=True, exist_ok=True)
    Path("runs/prof/scarce_ceiling.json").write_text(json.dumps(result))
    sys.exit(0)
