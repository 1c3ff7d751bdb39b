"""A member's model judged on its own validation pods, in its replay twin.

- :func:`replay_metrics`: the online metrics of one replay of some pods on the member's nodes
  at its load (its replay settings, the reference typical pods).
- :func:`validation_rows`: a policy beside kube-default on the member's validation pods
  (:data:`fedsched.agent.learning.online.VALIDATION_METRICS`); kube-default's figures do not
  depend on the policy and are kept in the member's state directory after the first time.
- :func:`validation_score`: their trouble score (``fedsched.common.model.metrics.trouble_score``:
  the mean log ratio of the policy's hot CPU node-seconds, throttled CPU, OOM kills and failed
  pods to kube-default's; below 0 is better than kube-default), reported every online round.
- :func:`member_evidence`: the roll-out gate's evidence for a deployed member's serving
  checkpoint, from its own validation pods: the policy beside kube-default seed by seed, the
  form ``fedsched evidence`` writes (:mod:`fedsched.common.sim.evidence`).
Every replay of a member's weights schedules with
:func:`fedsched.common.federation.scoring.member_scheduler`: the logits plus ``kube_weight``
times kube-default's score, as the served checkpoint does.

May import: ``fedsched.common`` and ``fedsched.agent.learning``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.agent.learning.online import VALIDATION_METRICS
from fedsched.common.federation.members import Member, reference_typical
from fedsched.common.federation.scoring import member_scheduler
from fedsched.common.model.cluster import PodTable
from fedsched.common.model.metrics import trouble_score
from fedsched.common.model.profiles import cluster_profile
from fedsched.common.schedulers import SchedulerContext
from fedsched.common.sim.evaluate import EvalSpec, make_policy
from fedsched.common.sim.evidence import EVIDENCE_FORMAT, paired_entry
from fedsched.common.sim.replay import ReplayConfig, run_replay

Weights = dict[str, np.ndarray]
VALIDATION_SEED = 2024  # the replay seed of every validation run (the first, for evidence)
MEMBER_EVIDENCE_SEEDS = 5  # paired seeds of a member's own evidence for its serving checkpoint


def replay_metrics(member: Member, scheduler: Any, pods: PodTable,
                   seed: int = VALIDATION_SEED) -> dict[str, float]:
    """The online metrics of one replay of ``pods`` on the member's nodes at its load."""
    cfg = ReplayConfig(**{**member.replay, "allow_unreachable_load": True})
    res = run_replay(member.nodes, pods, scheduler, config=cfg, seed=seed, typical=reference_typical())
    return {k: float(v) for k, v in res.metrics.items()
            if isinstance(v, int | float | np.floating | np.integer)}


def validation_rows(member: Member, weights: Weights, state_dir: str | Path | None = None,
                    kube_weight: float = 0.0) -> dict[str, dict[str, float]]:
    """The policy (scored with ``kube_weight``) beside kube-default on the member's validation
    pods (``VALIDATION_METRICS``; empty without validation pods): ``{"policy": {...},
    "kube-default": {...}}``. kube-default's
    figures do not depend on the policy: with ``state_dir`` they are computed once and kept there."""
    if member.val is None or not len(member.val):
        return {}
    ref_path = Path(state_dir) / "kube-validation.json" if state_dir is not None else None
    if ref_path is not None and ref_path.exists():
        ref = json.loads(ref_path.read_text())
    else:
        kube = make_policy("kube-default", SchedulerContext(rng=np.random.default_rng(0)), "replay")
        kube_metrics = replay_metrics(member, kube, member.val)  # one replay, not one per metric
        ref = {m: kube_metrics[m] for m in VALIDATION_METRICS}
        if ref_path is not None:
            ref_path.parent.mkdir(parents=True, exist_ok=True)
            ref_path.write_text(json.dumps(ref))
    got = replay_metrics(member, member_scheduler(weights, kube_weight), member.val)
    return {"policy": {m: got[m] for m in VALIDATION_METRICS}, "kube-default": ref}


def validation_score(member: Member, weights: Weights, state_dir: str | Path,
                     kube_weight: float = 0.0) -> float:
    """The trouble score of the policy (scored with ``kube_weight``) against kube-default on the
    member's validation pods (lower is better; NaN without them)."""
    rows = validation_rows(member, weights, state_dir, kube_weight)
    return trouble_score(rows["policy"], rows["kube-default"]) if rows else math.nan


def member_evidence(member: Member, checkpoint: str | Path, seeds: int = MEMBER_EVIDENCE_SEEDS,
                    jobs: int = 1) -> dict[str, Any]:
    """The roll-out gate's evidence from the member's own validation pods: the policy in
    ``checkpoint`` beside kube-default on the member's nodes at its load, seed by seed
    (:func:`fedsched.common.sim.evidence.paired_entry`, the form ``fedsched evidence`` writes),
    under the member's profile; ``{}`` without validation pods."""
    if member.val is None or not len(member.val):
        return {}
    spec = EvalSpec(nodes=member.nodes, pods=member.val, policies=[], mode="replay", train_pods=member.train,
                    seeds=[VALIDATION_SEED + k for k in range(seeds)],
                    replay_options={**member.replay, "allow_unreachable_load": True})
    entry = {"scenario": "own", **paired_entry(spec, str(checkpoint), jobs)}
    return {"format": EVIDENCE_FORMAT, "reference": "kube-default", "quick": False,
            "source": f"{member.name}'s own validation pods",
            "profiles": {cluster_profile(member.nodes): entry}}
