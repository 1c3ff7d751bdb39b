"""What a policy closes of the oracle's gap to the best heuristic, from stored online-benchmark runs.

The learning issue asks each method to say how much of the room the oracle shows it takes. For a
scenario of ``bench/online_quality.py`` the oracle's gap is its paired trouble score against the
scenario's best heuristic (``online_quality.best_heuristic``), seed by seed; the policy's share of
it is the policy's own paired difference from that heuristic divided by the oracle's (1: as far
as the oracle, 0: no further than the heuristic, below 0: behind it), with a 95% interval from a
paired bootstrap over the seeds. The same for each of the trouble score's metrics (their log ratios: hot
CPU node-time, throttled CPU, OOM kills, failed pods), which says where the gap left lies. Where the
oracle is not better than the best heuristic, interval clear, there is no gap and no share: the line
says so.
The policy against the oracle itself, paired by seed, is printed beside it.

The oracle and the policy may come from different stored runs (the full benchmark runs every
scheduler; a later run may hold only kube-default, the best heuristic and a newer policy): each
``--pair ORACLE.json POLICY.json`` takes the oracle and the heuristics from the first file and the
policy from the second, for every scenario and seed both hold. Paired seeds must replay the same
workloads, so every scheduler the two files share, the policy aside (kube-default at least), must
have the same figures on every shared seed, to 1e-9 relative (a sum taken in another order moves
the last bits), or the pair is refused, naming the first difference. The heuristics' and the
oracle's figures are the same on every machine; a learned policy's may differ between machines
(floating-point kernels), so each file's machine is printed.

    python bench/oracle_gap.py --pair bench/results/online_quality_web60.json \\
        bench/results/online_quality_web60_kube2.json [--policy learned-online] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from harness.provenance import strict_json, write_json
from online_quality import HEURISTICS, best_heuristic

from fedsched.common.model.metrics import TROUBLE_SMOOTHING
from fedsched.common.schedulers import LEARNED_ONLINE
from fedsched.common.sim.paired import TROUBLE, paired_against, paired_difference
from fedsched.common.sim.replay.oracle import ORACLE

Runs = dict[str, dict[str, dict[str, float]]]
BOOTSTRAP = 10_000  # resamples of the seeds for the share's interval


def _numbers(x: Any) -> Any:
    """Stored JSON with its nulls back as NaN (the results write NaN as null)."""
    if isinstance(x, dict):
        return {k: _numbers(v) for k, v in x.items()}
    return math.nan if x is None else x


def load(path: str | Path) -> dict[str, Any]:
    """An ``online_quality.py --json`` file: ``{"machine": ..., "scenarios": {name: runs}}``."""
    d = json.loads(Path(path).read_text())
    if d.get("benchmark") != "online_quality" or not isinstance(d.get("scenarios"), dict):
        raise ValueError(f"{path}: not a bench/online_quality.py --json result")
    m = d.get("provenance", {}).get("machine") or {}
    return {"machine": f"{m.get('cpu_model', '?')}, {m.get('cpus', '?')} cores",
            "scenarios": {name: _numbers(s["result"]["runs"]) for name, s in d["scenarios"].items()}}


def _same(a: float, b: float) -> bool:
    """Equal up to the last bits a sum in another order moves (the same run on another machine)."""
    if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        return True
    return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, rel_tol=1e-9,
                                                                                      abs_tol=1e-12)


def merge(with_oracle: Runs, with_policy: Runs, policy: str, where: str = "") -> Runs:
    """The oracle's file's schedulers (policy aside) plus ``policy``'s runs from the other file,
    on the seeds both hold. Raises ``ValueError`` where a scheduler both files hold (the policy
    aside) differs on a shared seed: they did not replay the same workloads."""
    for name in (ORACLE, "kube-default"):
        if name not in with_oracle:
            raise ValueError(f"{where}the first file has no {name} runs")
    if policy not in with_policy:
        raise ValueError(f"{where}the second file has no {policy} runs (it has: {', '.join(with_policy)})")
    seeds = [s for s in with_oracle["kube-default"] if s in with_policy[policy]]
    if not seeds:
        raise ValueError(f"{where}the two files share no seed")
    for name in sorted(set(with_oracle) & set(with_policy) - {policy}):
        for s in seeds:
            a, b = with_oracle[name].get(s), with_policy[name].get(s)
            if a is None or b is None:
                continue
            bad = [m for m in a if m in b and not _same(a[m], b[m])]
            if bad:
                raise ValueError(f"{where}{name} seed {s}: {bad[0]} is {a[bad[0]]!r} in the first file and "
                                 f"{b[bad[0]]!r} in the second: not the same workloads")
    out = {name: {s: r[s] for s in seeds if s in r} for name, r in with_oracle.items() if name != policy}
    out[policy] = {s: with_policy[policy][s] for s in seeds}
    return out


def share(policy: list[float], oracle: list[float], rng: np.random.Generator) -> dict[str, float]:
    """mean(policy) / mean(oracle) with a 95% paired-bootstrap interval over the seeds."""
    p, o = np.asarray(policy, dtype=np.float64), np.asarray(oracle, dtype=np.float64)
    keep = np.isfinite(p) & np.isfinite(o)
    p, o = p[keep], o[keep]
    if len(p) < 2:  # no interval (gap() asks only where the oracle's own interval is clear)
        return {"share": float(p.mean() / o.mean()) if len(p) else math.nan, "lo": math.nan, "hi": math.nan,
                "n": len(p)}
    idx = rng.integers(0, len(p), size=(BOOTSTRAP, len(p)))
    den = o[idx].mean(axis=1)
    ratios = p[idx].mean(axis=1) / np.where(den != 0, den, np.nan)
    lo, hi = np.nanpercentile(ratios, [2.5, 97.5])
    return {"share": float(p.mean() / o.mean()), "lo": float(lo), "hi": float(hi), "n": len(p)}


def gap(runs: Runs, policy: str, seed: int = 0) -> dict[str, Any]:
    """The oracle's gap to the best heuristic and the policy's share of it (module docstring)."""
    reference = "kube-default"
    res = {"runs": runs, "reference": reference, "paired": paired_against(runs, reference)}
    best = best_heuristic(res)  # among HEURISTICS only
    against = paired_against(runs, best)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"best_heuristic": best, "seeds": len(against[policy]["seeds"])}
    out["figures"] = {}
    for key in (TROUBLE, *TROUBLE_SMOOTHING):
        o, p = ((f[TROUBLE] if key == TROUBLE else f["log_ratio"][key])
                for f in (against[ORACLE], against[policy]))
        fig: dict[str, Any] = {
            "oracle_vs_best": {k: o[k] for k in ("mean", "ci95", "verdict")},
            "policy_vs_best": {k: p[k] for k in ("mean", "ci95", "verdict")},
            "policy_vs_oracle": {k: v for k, v in paired_difference(p["values"], o["values"]).items()
                                 if k != "values"},
        }
        fig["share"] = share(p["values"], o["values"], rng) if o["verdict"] == "better" else None
        out["figures"][key] = fig
    return out


def line(name: str, g: dict[str, Any]) -> str:
    parts = []
    for key, f in g["figures"].items():
        o, p, d = f["oracle_vs_best"], f["policy_vs_best"], f["policy_vs_oracle"]
        s = f["share"]
        took = (f"closes {s['share']:.0%} [{s['lo']:.0%}, {s['hi']:.0%}] of the oracle's gap" if s
                else "the oracle is not better than the best heuristic: no gap to close")
        label = "trouble" if key == TROUBLE else f"log {key}"
        parts.append(f"{label}: oracle {o['mean']:+.3f} ± {o['ci95']:.3f}, policy {p['mean']:+.3f} ± "
                     f"{p['ci95']:.3f} against {g['best_heuristic']}; {took}; policy - oracle "
                     f"{d['mean']:+.3f} ± {d['ci95']:.3f} ({d['verdict']})")
    return f"{name} ({g['seeds']} seeds):\n  " + "\n  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", nargs=2, action="append", required=True, metavar=("ORACLE_JSON", "POLICY_JSON"),
                    help="the oracle and the heuristics from the first file, the policy from the second")
    ap.add_argument("--policy", default=LEARNED_ONLINE, help="the policy's name in the second file")
    ap.add_argument("--json", dest="json_out", help="write the figures here")
    args = ap.parse_args(argv)
    if args.policy in HEURISTICS or args.policy == ORACLE:
        ap.error(f"--policy {args.policy}: a heuristic or the oracle is what a policy is measured against")
    out: dict[str, Any] = {"policy": args.policy, "scenarios": {}}
    for first, second in args.pair:
        try:
            a, b = load(first), load(second)
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"--pair {first} {second}: {e}")
        print(f"oracle and heuristics: {first} (machine: {a['machine']})\n{args.policy}: {second} "
              f"(machine: {b['machine']})")
        for name in [n for n in a["scenarios"] if n in b["scenarios"]]:
            try:
                runs = merge(a["scenarios"][name], b["scenarios"][name], args.policy, f"{name}: ")
            except ValueError as e:
                ap.error(str(e))
            g = gap(runs, args.policy)
            out["scenarios"][name] = {"oracle_file": first, "policy_file": second, **g}
            print(line(name, g))
    if args.json_out:
        write_json(args.json_out, strict_json(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
