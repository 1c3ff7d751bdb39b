"""Training curves of the shipped policies' recipes, as a plot beside a JSON of the same points.

Reads the run directories the reproduce scripts write (``runs/`` by default) and draws, per
recipe, what its trainer logs:

- rollout improvement (``agent/learning/rollout_improve.py``, ``progress.csv``): validation GPU
  allocation, the share of look-ahead decisions that overrode the policy (improvement rate) and
  the distilled policy's agreement with its targets, per iteration; a run without the margin,
  when present, beside the shipped one (it shows why the margin is there);
- TD3 in replay (``agent/learning/td3.py``, ``progress.csv``): critic loss, mean reward and the
  held-out hot CPU node-seconds per update;
- PPO (``fedsched train --algo ppo``, ``progress.csv``): mean reward, approx_kl, explained
  variance and the held-out metric per update, for any run directory given with ``--ppo``;
- the online policy's credit regression (``agent/learning/online.py``, ``summary.json``): MSE and
  R^2 per epoch, and the PPO fine-tuning's updates when the run logged them.

    python bench/training_curves.py [--runs runs] [--ppo DIR ...] --out bench/results/training_curves

writes ``OUT.png`` and ``OUT.json``. A recipe whose run directory is missing is listed as missing
(run its script first), never drawn from made-up points.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any


def _csv(path: Path) -> list[dict[str, float]]:
    rows = []
    with path.open() as f:
        for r in csv.DictReader(f):
            rows.append({k: (float(v) if v not in ("", None) else math.nan) for k, v in r.items()})
    return rows


def _series(rows: list[dict[str, float]], x: str, ys: tuple[str, ...]) -> dict[str, list[float]]:
    keep = [r for r in rows if x in r]
    present = [y for y in ys if any(y in r for r in keep)]
    return {x: [r[x] for r in keep], **{y: [r.get(y, math.nan) for r in keep] for y in present}}


def collect(runs: Path, ppo_dirs: list[Path]) -> dict[str, Any]:
    """Every curve found under ``runs`` (and the given PPO run directories); missing ones named."""
    out: dict[str, Any] = {"curves": {}, "missing": []}
    rollout = ("val_alloc_gpu", "improvement_rate", "target_agreement", "distill_loss")
    specs = [
        ("rollout-improve (shipped recipe)", runs / "rollout-improve/openb-default/progress.csv",
         "iteration", rollout),
        ("rollout-improve without margin", runs / "rollout-improve/openb-v1-nomargin/progress.csv",
         "iteration", rollout),
        ("td3 replay", runs / "td3-replay/td3/progress.csv", "update",
         ("critic_loss", "mean_reward", "eval_hot_cpu_node_s")),
    ]
    specs += [(f"ppo {d.name}", d / "progress.csv", "update",
               ("mean_reward", "approx_kl", "explained_variance", "clipfrac", "eval")) for d in ppo_dirs]
    for name, path, x, ys in specs:
        if path.exists():
            out["curves"][name] = _series(_csv(path), x, ys)
        else:
            out["missing"].append(f"{name}: {path}")
    online = runs / "online-final" / "summary.json"
    if online.exists():
        s = json.loads(online.read_text())
        epochs = [e for e in s.get("epochs", []) if "mse" in e]
        if epochs:
            out["curves"]["online credit regression"] = {"epoch": [e["epoch"] for e in epochs],
                                                         "mse": [e["mse"] for e in epochs],
                                                         "r2": [e["r2"] for e in epochs]}
        ppo = (s.get("stages", {}).get("ppo") or {}).get("curve")
        if ppo:
            out["curves"]["online ppo fine-tuning"] = _series(ppo, "update", (
                "mean_reward", "approx_kl", "explained_variance"))
    else:
        out["missing"].append(f"online credit regression: {online}")
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = data["curves"]
    panels = [(name, c) for name, c in curves.items()]
    if not panels:
        raise SystemExit("no training curves found: run the reproduce scripts first (" +
                         "; ".join(data["missing"]) + ")")
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), squeeze=False)
    for ax, (name, c) in zip(axes[:, 0], panels, strict=True):
        x_key = next(iter(c))
        twin = None
        for k, y in c.items():
            if k == x_key:
                continue
            target = ax
            if k.startswith("val_") or k.startswith("eval"):
                twin = twin or ax.twinx()
                target = twin
            target.plot(c[x_key], y, marker=".", label=k, ls="--" if target is twin else "-")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(x_key)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if twin is not None:
            h2, l2 = twin.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels, fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--runs", type=Path, default=Path("runs"),
                    help="where the reproduce scripts wrote their runs")
    ap.add_argument("--ppo", type=Path, action="append", default=[],
                    help="a fedsched train --algo ppo run directory")
    ap.add_argument("--out", type=Path, default=Path("bench/results/training_curves"),
                    help="output path without suffix (.png and .json are written)")
    a = ap.parse_args(argv)
    data = collect(a.runs, a.ppo)
    for m in data["missing"]:
        print(f"missing (not drawn): {m}", file=sys.stderr)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    plot(data, a.out.with_suffix(".png"))
    a.out.with_suffix(".json").write_text(json.dumps(data, indent=1, default=float))
    print(f"wrote {a.out.with_suffix('.png')} and {a.out.with_suffix('.json')} "
          f"({len(data['curves'])} curves, {len(data['missing'])} missing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
