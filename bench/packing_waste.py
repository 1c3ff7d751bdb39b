"""Where the GPU stays idle at the end of a packing run, per policy: what is left to win.

The packing table of record (``bench/agent_quality.py``: the openb GPU cluster, 130% of its GPU
capacity arrived, workload from the held-out test pods, seeds 42..) gives each policy's GPU
allocation; this splits the rest, the idle GPU at the end, by
:meth:`fedsched.common.sim.packing.PackingSimulator.idle_gpu_account`: whole idle GPUs, what is
left on GPUs that sharing pods use (by the largest pod on the GPU: next to an 810-milli pod only
190 is left, which only the pool's few pods of at most 190 milli can take), idle GPU on nodes
whose free CPU or memory no GPU pod of the pool fits in, and the failed pods by shape. Means
over the seeds, % of all GPU; the same seeds give every policy the same arrivals.

    python bench/packing_waste.py --policies fgd,lookahead:fgd,kube-default --seeds 3 --jobs 2 \\
        --json bench/results/packing_waste.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from agent_quality import scenario_spec  # bench/ is the script's directory: on sys.path

from fedsched.common.schedulers import split_names
from fedsched.common.sim.evaluate import RunOutput, evaluate

SEED0 = 42  # the packing table's first workload seed (bench/agent_quality.py)
PARTS = ("idle", "whole_idle", "shared_idle", "cpu_stranded", "mem_stranded")


def accounts(scenario: str, policies: list[str], seeds: list[int], jobs: int) -> list[dict[str, Any]]:
    """The benchmark's own runs (``fedsched.common.sim.evaluate``: its split, context and workload
    seeds) of every policy and seed, each as its idle-GPU account with its policy, seed and GPU
    allocation."""
    spec = scenario_spec(scenario)
    spec.policies, spec.seeds = policies, seeds
    runs: list[dict[str, Any]] = []

    def keep(k: int, n: int, o: RunOutput) -> None:
        if not o.idle_gpu:
            raise SystemExit(f"{scenario}: no idle-GPU account (a packing scenario with GPUs is needed)")
        alloc = float(o.metrics["alloc_gpu"])
        runs.append({**o.idle_gpu, "policy": o.policy, "seed": o.seed, "alloc_gpu": alloc})
        idle = o.idle_gpu["idle"]
        print(f"  {k}/{n} {o.policy} seed {o.seed}: alloc {alloc:.2f}, idle {idle:.2f}", flush=True)

    evaluate(spec, jobs=jobs, progress=keep)
    return runs


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy: the mean of every part over its seeds, the shared idle by largest pod and the
    failed shapes summed then divided by the seed count."""
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == policy]
        n = len(mine)
        row: dict[str, Any] = {"seeds": n, "alloc_gpu": float(np.mean([r["alloc_gpu"] for r in mine]))}
        row.update({p: float(np.mean([r[p] for r in mine])) for p in PARTS})
        by: Counter = Counter()
        failed: Counter = Counter()
        for r in mine:
            by.update({int(k): v / n for k, v in r["shared_idle_by_largest"].items()})
            failed.update({k: v / n for k, v in r["failed_by_shape"].items()})
        row["shared_idle_by_largest"] = dict(by.most_common(6))
        row["failed_by_shape"] = dict(failed.most_common(6))
        out[policy] = row
    return out


def format_summary(scenario: str, summary: dict[str, dict[str, Any]]) -> str:
    lines = [f"== {scenario}: idle GPU at the end, % of all GPU (mean over seeds) =="]
    head = f"{'policy':<16}{'alloc':>8}{'idle':>8}{'whole':>8}{'shared':>8}{'cpu-str':>9}{'mem-str':>9}  " \
           "shared idle by the GPU's largest pod (milli: %)"
    lines += [head, "-" * len(head)]
    for policy, r in summary.items():
        by = ", ".join(f"{k}: {v:.2f}" for k, v in r["shared_idle_by_largest"].items())
        lines.append(f"{policy:<16}{r['alloc_gpu']:8.2f}{r['idle']:8.2f}{r['whole_idle']:8.2f}"
                     f"{r['shared_idle']:8.2f}{r['cpu_stranded']:9.2f}{r['mem_stranded']:9.2f}  {by}")
    lines.append("failed arrivals by shape (GPUs x milli: mean count per run)")
    for policy, r in summary.items():
        lines.append(f"  {policy:<16}" + ", ".join(f"{k}: {v:.0f}" for k, v in r["failed_by_shape"].items()))
    lines.append("(cpu-str / mem-str: idle GPU on nodes whose free CPU / memory is below every GPU pod "
                 "of the pool; they overlap whole and shared)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="packing/openb-default",
                    help="packing/openb-VARIANT or inventory/openb-all-VARIANT (bench/agent_quality.py)")
    ap.add_argument("--policies", default="fgd,lookahead:fgd,kube-default",
                    help="comma-separated scheduler names, checkpoints or lookahead[key=value,...]:<base>")
    ap.add_argument("--seeds", type=int, default=3, help="workload seeds 42.. (the benchmark's)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--json", type=Path, help="write the runs and the summary here")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        ap.error("--seeds and --jobs must be at least 1")
    try:
        policies = split_names(args.policies)
    except ValueError as e:
        ap.error(f"--policies: {e}")
    if not policies:
        ap.error("--policies is empty")
    t0 = time.time()
    runs = accounts(args.scenario, policies, [SEED0 + s for s in range(args.seeds)], args.jobs)
    summary = summarise(runs)
    print(format_summary(args.scenario, summary))
    print(f"({time.time() - t0:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"argv": sys.argv, "scenario": args.scenario, "runs": runs,
                                         "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
