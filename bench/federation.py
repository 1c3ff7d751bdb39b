"""Federation benchmarks: INT8 vs fp32, personalisation, FedProx vs FedAvg, scale, robustness.

Every run is Flower's own simulation runtime through ``flwr run`` (private FLWR_HOME), as
the main job runs it (``fedsched.coordinator.federate``). Experiments:

1. ``main``: the main job's comparison (FedAvg and FedProx; per cluster default, local-only,
   global, personalised on held-out pods) and bytes sent INT8 vs fp32;
2. ``fp32``: the same FedAvg federation with fp32 uploads: the INT8 run's final central
   evaluation must be within 1% of it;
3. ``fedprox_vs_fedavg``: rounds until the hub's held-out allocation first reaches a target
   (the better run's best value minus 0.1 pp);
4. ``robust``: 20% of members poisoned (one run per kind: NaN, huge norm, sign-flipped) and
   30% of members failing each round, against a clean run of the same size; and a hub killed
   after its first checkpoint (its SuperLink stopped) that resumes from that checkpoint;
5. ``scale`` (``--scale 50x10``): many small members for many rounds; wall time and peak RSS.

    python bench/federation.py [--quick] [--scale 50x10] --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from harness.provenance import write_json

from fedsched.coordinator.federate import FederateConfig, federate, run_flower, stop_local_superlink

APP_DIR = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def history(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "hub" / "rounds.json").read_text())


def final_central(run_dir: Path) -> float:
    return float(history(run_dir)[-1]["central"]["alloc_gpu"])


def rounds_to(run_dir: Path, target: float) -> int | None:
    for h in history(run_dir):
        if h["central"]["alloc_gpu"] >= target:
            return int(h["round"])
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench-federation")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--scale", default=None, help="CLUSTERSxROUNDS, e.g. 50x10 (omitted: skipped)")
    ap.add_argument("--skip", default="", help="comma-separated experiments to skip")
    ap.add_argument("--only-hub-kill", action="store_true", help="of the robustness runs, only the hub kill")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    cfg = FederateConfig.quick() if args.quick else FederateConfig()
    result: dict = {"config": {**cfg.__dict__, "strategies": list(cfg.strategies)}}

    def save() -> None:
        if args.json_out:
            write_json(args.json_out, result, default=float)

    if "main" not in skip:
        t0 = time.time()
        report = federate(out / "main", cfg, APP_DIR, log)
        clusters = {}
        for name, pols in report["clusters"].items():
            gpu = pols["default"]["alloc_gpu"]["mean"]
            metric = "alloc_gpu" if gpu is not None and gpu == gpu else "alloc_cpu"  # CPU-only clusters
            vals = {p: pols[p][metric]["mean"] for p in ("default", "local", "global", "personalised")}
            not_worse = vals["personalised"] >= max(vals["local"], vals["global"])
            clusters[name] = {"metric": metric, **vals, "personalised_not_worse": not_worse,
                              "gain_over_local": vals["personalised"] - vals["local"]}
        result["main"] = {"clusters": clusters, "bytes": report["bytes"],
                          "int8_over_fp32": report["bytes"]["int8"] / report["bytes"]["fp32"],
                          "wall_s": round(time.time() - t0, 1)}
        runs = {s: out / "main" / s for s in cfg.strategies}
        best = max(max(h["central"]["alloc_gpu"] for h in history(d)) for d in runs.values())
        target = best - 0.1
        result["fedprox_vs_fedavg"] = {"target_alloc_gpu": target,
                                       **{s: {"rounds_to_target": rounds_to(d, target),
                                              "final": final_central(d)} for s, d in runs.items()}}
        save()
        log(f"main: {json.dumps(result['main'], default=float)[:400]}")

    if "fp32" not in skip and "main" in result:
        fp32 = run_flower(APP_DIR, out, "fedavg", cfg, log, name="fedavg-fp32", extra={"codec": "fp32"})
        int8_final, fp32_final = final_central(out / "main" / "fedavg"), final_central(fp32)
        result["fp32"] = {"int8_final": int8_final, "fp32_final": fp32_final,
                          "relative_gap": abs(int8_final - fp32_final) / fp32_final}
        save()
        log(f"fp32: {result['fp32']}")

    if "robust" not in skip:
        rcfg = replace(cfg, clusters=5)
        robust: dict = {}
        kinds = () if args.only_hub_kill else ("nan", "huge", "flip")
        if kinds:
            clean = run_flower(APP_DIR, out, "fedavg", rcfg, log, name="robust-clean")
            base = final_central(clean)
            robust["clean_final"] = base
        for kind in kinds:
            d = run_flower(APP_DIR, out, "fedavg", rcfg, log, name=f"robust-poison-{kind}",
                           extra={"poison-members": "4", "poison-kind": kind})
            rejected = sum(len(h["rejected"]) for h in history(d))
            robust[f"poison_{kind}"] = {"final": final_central(d), "within_5pct": abs(final_central(d) - base)
                                        <= 0.05 * base, "rejected_updates": rejected}
        if not args.only_hub_kill:
            d = run_flower(APP_DIR, out, "fedavg", rcfg, log, name="robust-failures",
                           extra={"fail-rate": 0.3})
            robust["failures_30pct"] = {"completed_rounds": len(history(d)), "final": final_central(d)}
        # Hub killed after its first checkpoint: stop its SuperLink, then start again on the same directory.
        kcfg = replace(cfg, rounds=max(cfg.rounds, 6))
        run_dir = out / "robust-hub-kill"
        rounds_file = run_dir / "hub" / "rounds.json"

        def killer() -> None:
            deadline = time.time() + 600
            while time.time() < deadline:
                if rounds_file.exists() and len(json.loads(rounds_file.read_text() or "[]")) >= 1:
                    stop_local_superlink(out / "flwr-home", include_apps=True)
                    return
                time.sleep(0.5)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        try:
            run_flower(APP_DIR, out, "fedavg", kcfg, log, name="robust-hub-kill")
            first = "completed before the kill"
        except RuntimeError as e:
            first = f"killed: {str(e)[:120]}"
        t.join(timeout=5)
        done_before = len(history(run_dir))
        run_flower(APP_DIR, out, "fedavg", kcfg, log, name="robust-hub-kill", fresh=False)
        rounds = [h["round"] for h in history(run_dir)]
        robust["hub_kill"] = {"first_run": first, "rounds_before_restart": done_before, "rounds": rounds,
                              "no_round_lost_or_repeated": rounds == list(range(1, kcfg.rounds + 1))}
        result["robust"] = robust
        save()
        log(f"robust: {json.dumps(robust, default=float)}")

    if args.scale:
        n, r = (int(x) for x in args.scale.lower().split("x"))
        scfg = replace(cfg, clusters=n, rounds=r, local_steps=32, openb_nodes=30, eval_nodes=40)
        t0 = time.time()
        d = run_flower(APP_DIR, out, "fedavg", scfg, log, name=f"scale-{n}x{r}")
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        result["scale"] = {"clusters": n, "rounds": r, "completed_rounds": len(history(d)),
                           "wall_s": round(time.time() - t0, 1), "peak_rss_mib_largest_process": peak}
        save()
        log(f"scale: {result['scale']}")
    print(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
