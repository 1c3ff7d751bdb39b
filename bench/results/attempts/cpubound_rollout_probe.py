"""Probe (issue 24, items 3 and 4): can the shipped packing policy's own improvement recipe learn
where CPU runs out before the GPUs?

The rollout-based improvement of ``agent/learning/rollout_improve.py`` (the shipped recipe's
arguments), started from the shipped ``default.pt``, with kube-default's choice as the extra
look-ahead candidate, on slices of CPU-bound inventories built from the openb parts
(``bench/agent_quality.py``'s :func:`cpu_bound_inventory`) with *training* construction seeds
(100 + i; the packing table judges seeds 1 and 7), one-GPU node share and CPU-only pod share drawn
from [0.2, 0.7] and [0.4, 0.7]. It trains on the train part of the hash split, validates on a
slice of another construction with the validation part, and prints the validation allocation per
iteration beside kube-default's and FGD's on the same runs. The test part is never touched.

    python bench/results/attempts/cpubound_rollout_probe.py [--iterations 3] [--out runs/cpubound-ri]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, as the script runs from the root
from agent_quality import cpu_bound_inventory

from fedsched.agent.learning.rollout_improve import Args, Problem, evaluate_baseline, train
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.traces import fits_somewhere, slice_cluster, split_train_val_test
from fedsched.common.schedulers import default_policy_path


def construction(cseed: int) -> tuple:
    rng = np.random.default_rng(cseed)
    return cpu_bound_inventory(cseed, one_gpu=float(rng.uniform(0.2, 0.7)),
                               cpu_only_share=float(rng.uniform(0.4, 0.7)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--clusters", type=int, default=4)
    ap.add_argument("--slice-nodes", type=int, default=100)
    ap.add_argument("--val-nodes", type=int, default=200)
    ap.add_argument("--val-seeds", type=int, default=4)
    ap.add_argument("--teacher", default="kube-default")
    ap.add_argument("--decisions", type=int, default=300)
    ap.add_argument("--out", default="runs/cpubound-ri")
    a = ap.parse_args(argv)
    # One construction per training slice, all from the train part; pods are per construction, so
    # the probe trains on one construction's pods over several slices of its nodes (Problem has one pool).
    nodes, pods = construction(100)
    train_pods, _, _ = split_train_val_test(pods)
    slices = [slice_cluster(nodes, a.slice_nodes, 1000 + i) for i in range(a.clusters)]
    vnodes, vpods = construction(200)
    _, val_pods, _ = split_train_val_test(vpods)
    val_nodes = slice_cluster(vnodes, a.val_nodes, 2024)
    problem = Problem(slices, train_pods, val_nodes, fits_somewhere(val_pods, val_nodes))
    args = Args(out=a.out, init=str(default_policy_path()), slice_nodes=a.slice_nodes,
                num_clusters=a.clusters, val_nodes=a.val_nodes, val_seeds=a.val_seeds, top_k=3,
                teacher=a.teacher, horizon=300, decisions_per_iter=a.decisions, sample_prob=0.05,
                iterations=a.iterations, distill_epochs=4, learning_rate=3e-4, margin=0.3)
    summary = train(args, problem)
    typical = TypicalPods.from_pods(train_pods)
    seeds = summary["val_seeds"]
    fgd = evaluate_baseline("fgd", problem.val_nodes, problem.val_pods, train_pods, typical, seeds)
    per_iteration = [round(r["val_alloc_gpu"], 2) for r in summary["iterations"]]
    print(f"validation ({len(seeds)} seeds): start {summary['start_val_alloc_gpu']:.2f}, per iteration "
          f"{per_iteration}, reference {summary['reference']}, fgd {np.mean(fgd):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
