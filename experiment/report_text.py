"""The main job's report as text: every member's evaluation table (:func:`table_rows`, also the
HTML report's) and the console report (:func:`format_report`: the tables, the verdicts with the
issue's goals, the bytes sent and received, each beside its float32 equivalent, and the wall time
of each phase).

May import: the standard library only (it reads the report's plain dictionary).
"""

from __future__ import annotations

from typing import Any


def _cell(v: dict[str, float]) -> str:
    mean, ci = v["mean"], v["ci95"]
    if abs(mean) >= 1000:
        return f"{mean:,.0f} ± {ci:,.0f}"
    return f"{mean:.3g} ± {ci:.2g}"


def table_rows(report: dict[str, Any], name: str) -> tuple[list[str], list[list[str]]]:
    """The member's evaluation table: a header and one row per policy (metrics that apply)."""
    pols = report["clusters"][name]
    metrics = [m for m in next(iter(pols.values())) if m != "runs"]
    return ["policy", *metrics], [[p, *(_cell(ms[m]) for m in metrics)] for p, ms in pols.items()]


def format_report(report: dict[str, Any]) -> str:
    lines = []
    cfg = report.get("config", {})
    if "kube_weight" in cfg:
        weight = cfg["kube_weight"]
        how = (f"its logits plus {weight:g} x kube-default's score / 100" if weight else "its logits alone")
        seed = cfg.get("training_seed", 1)
        lines.append(f"every learned model scores nodes with {how} (kube-weight); "
                     f"start: {cfg.get('init', '?')}" + (f"; training seed {seed}" if seed != 1 else ""))
    for name in report["clusters"]:
        info = report["members"][name]
        tags = ", ".join(t for t, on in (("data-scarce", info["scarce"]),
                                         (f"joins at round {info['joins_at']}", info["late"])) if on)
        lines.append(f"\n{name}: {info['why']} ({info['nodes']} nodes, "
                     f"{info['decisions_per_round']} decisions per round{', ' + tags if tags else ''}); "
                     f"held-out test pods, replay, "
                     f"{report['config']['eval_seeds']} seeds, mean ± 95% CI, lower is better")
        header, rows = table_rows(report, name)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(
                zip(r, widths, strict=True))))
    lines.append("\nverdicts (personalised vs local-only and kube-default, seed-by-seed differences):")
    lines.append("  (over the evaluation seeds of one training run per model: the intervals do not hold the "
                 "training's own variation; another training (--training-seed, or only another CPU's "
                 "rounding) can change a verdict: bench/federation_training_runs.py pools several)")
    for name, v in report["verdicts"].items():
        parts = [f"{k}: {d['verdict']} ({d['mean']:+.3g} ± {d['ci95']:.2g})" for k, d in v.items()
                 if isinstance(d, dict) and "verdict" in d]
        extra = ""
        if v.get("late"):
            extra = (f"; rounds to local-only's final validation score: {v['rounds_to_local_only']} "
                     f"(goal <= {v['rounds_budget']})")
        lines.append(f"  {name}: {'no worse' if v['no_worse'] else 'WORSE'}; " + "; ".join(parts) + extra)
        lines.append("    goals: " + "; ".join(f"{g}: {'met' if ok else 'MISSED'}"
                                             for g, ok in v["goals"].items()))
    if report.get("fleet"):
        lines.append("\nacross the members (per seed the mean over members, then paired over the seeds):")
        for k, d in report["fleet"].items():
            lines.append(f"  {k}: {d['verdict']} ({d['mean']:+.3g} ± {d['ci95']:.2g}, {d['n']} seeds)")
    for s, b in report["bytes"].items():
        down_fp32 = b.get("down-fp32", b["down"])
        lines.append(f"\nbytes sent ({s}, summed over each member's own reports): int8 {b['int8']:,} vs fp32 "
                     f"{b['fp32']:,} ({b['int8'] / max(b['fp32'], 1):.3f}x); received {b['down']:,} vs fp32 "
                     f"{down_fp32:,} ({b['down'] / max(down_fp32, 1):.3f}x)")
    if "wall_s" in report:
        phases = ", ".join(f"{k} {v:.0f} s" for k, v in report.get("phases_s", {}).items())
        lines.append(f"\nwall time {report['wall_s']:.0f} s" + (f" ({phases})" if phases else ""))
    return "\n".join(lines)
