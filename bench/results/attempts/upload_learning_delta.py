"""Attempt (issue 25): the main job's FedAvg models trained with members uploading their round's
learning (``fedsched federate --out runs/fed_ld``) against the same job with members uploading
their offset from the global (the code before, ``runs/fed_base``): personalised eta=0.2 and
global, per member, 30 paired test seeds (those of the 30-seed report), trouble vs kube-default
per seed; paired differences ld - base. Writes runs/prof/upload_cmp.json (kept as
upload_learning_delta_30seeds.json)."""
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from fedsched.agent.federation.round import MemberState
from fedsched.common.compute import single_threaded_worker
from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.weights import load_npz
from fedsched.common.model.metrics import trouble_score
from fedsched.common.sim.paired import paired_difference
from fedsched.experiment.baselines import _replay

SEEDS = list(range(42, 72))
RUNS = {"ld": Path("runs/fed_ld"), "base": Path("runs/fed_base")}


def models(run: Path, name: str):
    glob = {k: v for k, v in load_npz(run / "fedavg/hub/global.npz").items() if k != "__round__"}
    local = MemberState(run / "fedavg/state" / name).load("local")
    return {"personalised": personalised_mix(local, glob, 0.2) if local is not None else glob, "global": glob}


if __name__ == "__main__":
    names = [member_cluster(i).name for i in range(5)]
    jobs = {}
    with ProcessPoolExecutor(2, initializer=single_threaded_worker) as pool:
        for i, n in enumerate(names):
            for sd in SEEDS:
                jobs[(n, "kube", sd)] = pool.submit(_replay, (i, "full", "kube-default", sd, "test", 2.0))
            for r, run in RUNS.items():
                for k, w in models(run, n).items():
                    for sd in SEEDS:
                        jobs[(n, f"{r} {k}", sd)] = pool.submit(_replay, (i, "full", w, sd, "test", 2.0))
        per = {}
        for n in names:
            kube = [jobs[(n, "kube", sd)].result() for sd in SEEDS]
            per[n] = {p: [trouble_score(jobs[(n, p, sd)].result(), kube[j]) for j, sd in enumerate(SEEDS)]
                      for p in ("ld personalised", "base personalised", "ld global", "base global")}
            out = {p: float(np.mean(v)) for p, v in per[n].items()}
            for k in ("personalised", "global"):
                d = paired_difference(per[n][f"ld {k}"], per[n][f"base {k}"])
                out[f"{k} ld-base"] = [d["mean"], d["ci95"]]
            print(n, json.dumps(out), flush=True)
    fleet = {p: [float(np.mean([per[n][p][j] for n in names])) for j in range(len(SEEDS))]
             for p in per[names[0]]}
    for k in ("personalised", "global"):
        d = paired_difference(fleet[f"ld {k}"], fleet[f"base {k}"])
        print("across members", k, "ld - base", d["mean"], d["ci95"],
              "means", np.mean(fleet[f"ld {k}"]), np.mean(fleet[f"base {k}"]))
    Path("runs/prof").mkdir(parents=True, exist_ok=True)
    Path("runs/prof/upload_cmp.json").write_text(json.dumps(per))
