"""The policy shipped in common/data/policies/ loads with this feature schema and schedules."""

from __future__ import annotations

import numpy as np

from fedsched.common.learning.checkpoint import load_checkpoint
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import LEARNED, SchedulerContext, default_policy_path, make_scheduler


def test_shipped_policy_matches_the_feature_schema_and_records_its_recipe():
    policy, meta, _ = load_checkpoint(default_policy_path())  # raises on a schema mismatch
    # behaviour cloning of FGD improved by look-ahead (agent/learning/rollout_improve.py)
    assert meta["algorithm"] == "rollout-improve" and meta["hyperparameters"]["teacher"] == "fgd"
    assert "train_default_policy.sh" in meta["recipe"]
    assert meta["eval_metric"] == "alloc_gpu"
    assert meta["best_eval"]["value"] > meta["reference"]["kube-default"]  # what the roll-out gate reads
    assert meta["typical_pods"] is not None and len(meta["data_hash"]) == 16
    assert sum(p.numel() for p in policy.parameters()) < 100_000  # a small file


def test_learned_name_resolves_to_a_policy_that_places_pods():
    nodes, pods = generate_cluster("gpu", seed=3, n_nodes=30, n_pods=60)
    sched = make_scheduler(LEARNED, SchedulerContext(train_pods=pods))
    assert isinstance(sched, PolicyScheduler) and sched.name == LEARNED
    from fedsched.common.sim.packing import run_packing

    res = run_packing(nodes, pods, sched, target_load=0.8, seed=1)
    assert np.isfinite(res.metrics["alloc_gpu"]) and res.metrics["alloc_gpu"] > 0
