"""The main job's HTML report: one self-contained file (the round plot inlined as a data URI, no
script, no external resource) with the per-member verdicts, every member's evaluation table and
the bytes sent and received (each beside its float32 equivalent), for a user who opens
``DIR/report.html`` in a browser.

May import: the standard library and :mod:`fedsched.experiment.report_text` (the member tables).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from fedsched.experiment.report_text import table_rows


def _table(header: list[str], rows: list[list[str]], cls: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _verdict_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    keys: list[str] = []
    for v in report["verdicts"].values():
        keys += [k for k, d in v.items() if isinstance(d, dict) and "verdict" in d and k not in keys]
    header = ["member", "verdict", *keys, "late member: rounds to local-only", "goals"]
    rows = []
    for name, v in report["verdicts"].items():
        cells = [name, "no worse" if v["no_worse"] else "worse"]
        for k in keys:
            d = v.get(k)
            cells.append(f"{d['verdict']} ({d['mean']:+.3g} ± {d['ci95']:.2g})" if d else "")
        late = (f"{v['rounds_to_local_only']} (goal <= {v['rounds_budget']})" if v.get("late") else "")
        cells.append(late)
        cells.append("; ".join(f"{g}: {'met' if ok else 'missed'}" for g, ok in v.get("goals", {}).items()))
        rows.append(cells)
    return header, rows


def render(report: dict[str, Any], plot: Path | None) -> str:
    """The report as one HTML document."""
    cfg = report["config"]
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>fedsched federation report</title>',
        "<style>body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;"
        "margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:0.25em 0.6em;text-align:right}"
        "td:first-child,th:first-child{text-align:left}th{background:#f4f4f4}img{max-width:100%}</style>",
        "</head><body>",
        "<h1>fedsched: federated training of member clusters</h1>",
        f"<p>{len(report['clusters'])} members, {cfg['rounds']} rounds per strategy "
        f"({html.escape(', '.join(cfg['strategies']))}), eta {cfg['eta']}, starting model "
        f"{html.escape(str(cfg['init']))}, every learned model scored with kube-weight "
        f"{html.escape(str(cfg.get('kube_weight', 0)))} (its logits plus that times kube-default's "
        "score / 100); "
        "evaluation on each member's held-out test pods in replay mode, "
        f"{cfg['eval_seeds']} seeds, mean ± 95% CI, lower is better. The trouble score is the mean log "
        "ratio of hot CPU node-seconds, throttled CPU, OOM kills and failed pods to kube-default's (below 0: "
        "better "
        f"than kube-default). Wall time {report.get('wall_s', 0)} s.</p>",
        "<h2>Verdicts</h2>",
        "<p>The personalised model of the first strategy's run against local-only and kube-default, "
        "seed by seed (difference ± 95% CI; better/worse only when the interval excludes 0). The intervals "
        "are over the evaluation seeds of one training run per model: they do not hold the training's own "
        "variation, and another training (<code>--training-seed</code>, or only another CPU's rounding) can "
        "change a verdict: <code>bench/federation_training_runs.py</code> pools several.</p>",
        _table(*_verdict_rows(report), "verdicts"),
    ]
    if report.get("fleet"):
        parts += ["<h2>Across the members</h2>",
                  "<p>Per seed the mean over the members of each one's trouble score, then paired over the "
                  "seeds: whether the average member gains (not any one member's verdict).</p>",
                  _table(["comparison", "verdict", "difference ± 95% CI", "seeds"],
                         [[k, d["verdict"], f"{d['mean']:+.3g} ± {d['ci95']:.2g}", str(d["n"])]
                          for k, d in report["fleet"].items()], "fleet")]
    if plot is not None and plot.exists():
        data = base64.b64encode(plot.read_bytes()).decode()
        parts += ["<h2>Rounds</h2>", f'<img alt="round curves" src="data:image/png;base64,{data}">']
    parts.append("<h2>Members</h2>")
    for name in report["clusters"]:
        info = report["members"][name]
        parts.append(f"<h3>{html.escape(name)}</h3><p>{html.escape(info['why'])}: {info['nodes']} nodes, "
                     f"{info['decisions_per_round']} decisions per round, joins at round {info['joins_at']}; "
                     f"best heuristic on validation: {html.escape(info['best_heuristic'])}.</p>")
        parts.append(_table(*table_rows(report, name), "member"))
    parts.append("<h2>Bytes</h2>")
    rows = [[s, f"{b['int8']:,}", f"{b['fp32']:,}", f"{b['int8'] / max(b['fp32'], 1):.3f}", f"{b['down']:,}",
             f"{b.get('down-fp32', b['down']):,}", f"{b['down'] / max(b.get('down-fp32', b['down']), 1):.3f}"]
            for s, b in report["bytes"].items()]
    parts.append(_table(["strategy", "sent (int8)", "fp32 equivalent", "ratio", "received", "fp32 equivalent",
                         "ratio"], rows, "bytes"))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(report: dict[str, Any], plot: Path | None, path: Path, text: str | None = None) -> Path:
    """Write :func:`render`'s document to ``path``; ``text`` (the console report) is kept as a
    ``<pre>`` at the end for copy and paste."""
    doc = render(report, plot)
    if text:
        printed = f"<h2>As printed</h2><pre>{html.escape(text)}</pre>"
        doc = doc.replace("</body></html>", printed + "</body></html>")
    path.write_text(doc, encoding="utf-8")
    return path
