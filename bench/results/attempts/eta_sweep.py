"""Attempt (issue 25): the personalised mix ``eta * W_local + (1 - eta) * W_global`` of the main
job's FedAvg run (shipped start, kube weight 2; trained by ``fedsched federate --out
runs/fed_kw2_shipped``) at etas 0-1: each member's validation score (one replay of its own
validation pods, what a member could choose eta on) and its test trouble score on the 30 seeds of
``federate_main_job_kube2_shipped_start_30seeds_report.json``, paired with local-only's.

    python bench/results/attempts/eta_sweep.py   # writes runs/prof/eta_sweep.json
"""

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from fedsched.agent.federation.round import MemberState
from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.weights import load_npz
from fedsched.common.model.metrics import trouble_score
from fedsched.common.sim.paired import paired_difference
from fedsched.experiment.baselines import _replay

OUT = Path("runs/fed_kw2_shipped")
REPORT = Path("bench/results/federate_main_job_kube2_shipped_start_30seeds_report.json")
ETAS = [0.0, 0.2, 0.5, 0.8, 1.0]
TEST_ETAS = [0.5, 0.8, 1.0]  # 0 (global fedavg) and 0.2 (the run's) are in the report
SEEDS = list(range(42, 72))  # the report's evaluation seeds
KUBE_WEIGHT = 2.0


def paired(a: list[float], b: list[float]) -> list[float]:
    d = paired_difference(a, b)
    return [d["mean"], d["ci95"]]


def main() -> None:
    report = json.loads(REPORT.read_text())
    glob = {k: v for k, v in load_npz(OUT / "fedavg/hub/global.npz").items() if k != "__round__"}
    names = [member_cluster(i).name for i in range(5)]
    res = {}
    with ProcessPoolExecutor(2) as pool:
        val_jobs, test_jobs = {}, {}
        for i, n in enumerate(names):
            local = MemberState(OUT / "fedavg/state" / n).load("local")
            specs = {f"eta={e:g}": personalised_mix(local, glob, e) for e in ETAS}
            specs["local-only"] = MemberState(OUT / "local-only" / n).load("local")
            specs["kube-default"] = "kube-default"
            for k, spec in specs.items():
                val_jobs[(n, k)] = pool.submit(_replay, (i, "full", spec, 0, "val", KUBE_WEIGHT))
            for e in TEST_ETAS:
                for sd in SEEDS:
                    job = (i, "full", specs[f"eta={e:g}"], sd, "test", KUBE_WEIGHT)
                    test_jobs[(n, e, sd)] = pool.submit(_replay, job)
        for n in names:
            ref = val_jobs[(n, "kube-default")].result()
            val = {k: trouble_score(val_jobs[(m, k)].result(), ref) for (m, k) in val_jobs if m == n}
            c = report["clusters"][n]
            kube_runs = c["kube-default"]["runs"]
            kube = [dict(zip(kube_runs, vals, strict=True)) for vals in zip(*kube_runs.values(), strict=True)]
            lo = c["local-only"]["runs"]["trouble_score"]
            row: dict = {"val": val, "test": {}}
            for e in TEST_ETAS:
                ts = [trouble_score(test_jobs[(n, e, sd)].result(), kube[j]) for j, sd in enumerate(SEEDS)]
                row["test"][f"eta={e:g}"] = {"mean": float(np.mean(ts)), "vs_local_only": paired(ts, lo)}
            p02 = c["personalised eta=0.2"]["runs"]["trouble_score"]
            row["test"]["eta=0.2"] = {"mean": float(np.mean(p02)), "vs_local_only": paired(p02, lo)}
            row["test"]["local-only"] = {"mean": float(np.mean(lo))}
            row["test"]["eta=0"] = {"mean": float(np.mean(c["global fedavg"]["runs"]["trouble_score"]))}
            res[n] = row
            print(n, json.dumps(row), flush=True)
    Path("runs/prof").mkdir(parents=True, exist_ok=True)
    Path("runs/prof/eta_sweep.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
