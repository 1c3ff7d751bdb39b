"""Pair two ``fedsched evidence --json`` files seed by seed: for each profile, the difference of
the two policies' log ratios to kube-default (B minus A; kube-default's runs are the same seeds in
both, so this is B's log ratio to A's), trouble score and each of its metrics, mean +- 95% CI.
A or B may name several files joined by commas (``A1.json,A2.json``): the per-seed mean of their
log ratios, e.g. the mean of several single trainings against their ensemble.

    python bench/results/attempts/compare_evidence.py A.json B.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fedsched.common.sim.paired import paired_difference

METRICS = ("hot_cpu_node_s", "throttled_cpu_core_s", "oom_kills_per_1k_starts", "failed_pods")


def pair(pa: dict[str, Any], pb: dict[str, Any], seeds: list[str], sa: dict[str, Any],
         sb: dict[str, Any]) -> str:
    ia, ib = ({s: i for i, s in enumerate(p["seeds"])} for p in (pa, pb))
    d = paired_difference([sb["values"][ib[s]] for s in seeds], [sa["values"][ia[s]] for s in seeds])
    return f"{d['mean']:+.3f} ± {d['ci95']:.3f} ({d['verdict']})"


def _seed_mean(entries: list[dict[str, Any]], seeds: list[str]) -> dict[str, list[float]]:
    """Per-seed mean of several evidence entries ({"seeds": ..., "values": ...} each)."""
    rows = []
    for seed_list, e in entries:
        index = {s: i for i, s in enumerate(seed_list)}
        rows.append([e["values"][index[s]] for s in seeds])
    return {"values": [sum(col) / len(col) for col in zip(*rows, strict=True)]}


def load(spec: str) -> dict[str, Any]:
    """The profiles of one evidence file, or of several (comma-joined) as per-seed means."""
    files = [json.loads(Path(p).read_text())["profiles"] for p in spec.split(",")]
    if len(files) == 1:
        return files[0]
    out: dict[str, Any] = {}
    for profile in [p for p in files[0] if all(p in f for f in files)]:
        ps = [f[profile] for f in files]
        seeds = [s for s in ps[0]["seeds"] if all(s in p["seeds"] for p in ps)]
        out[profile] = {"seeds": seeds,
                        "trouble_score": _seed_mean([(p["seeds"], p["trouble_score"]) for p in ps], seeds),
                        "log_ratio": {m: _seed_mean([(p["seeds"], p["log_ratio"][m]) for p in ps], seeds)
                                      for m in METRICS}}
    return out


def main(a_path: str, b_path: str) -> None:
    a, b = load(a_path), load(b_path)
    print(f"B = {b_path} minus A = {a_path} (log ratios to kube-default, paired by seed)")
    for profile in [p for p in a if p in b]:
        pa, pb = a[profile], b[profile]
        seeds = [s for s in pa["seeds"] if s in pb["seeds"]]
        parts = [f"trouble {pair(pa, pb, seeds, pa['trouble_score'], pb['trouble_score'])}"]
        parts += [f"{m} {pair(pa, pb, seeds, pa['log_ratio'][m], pb['log_ratio'][m])}" for m in METRICS]
        print(f"{profile} ({len(seeds)} seeds): " + "; ".join(parts))


if __name__ == "__main__":
    main(*sys.argv[1:3])
