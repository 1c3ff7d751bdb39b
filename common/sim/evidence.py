"""The roll-out gate's evidence: a policy beside kube-default on a validation cluster of each
profile, replayed seed by seed at realistic size.

For each profile (``web``, ``gpu``, ``edge``) the validation cluster has the parameters of the
profile's scenario in :mod:`fedsched.common.sim.scenarios` (200, 100 and 40 nodes at 85% load)
but its own generator seed, :data:`EVIDENCE_SEED`: not the benchmark's (7), not a training
cluster's (``1000 * s + i``), not a federation member's (``1000 + i``). The policy and
kube-default replay the same held-out workload on the same seeds (the scenario's seed count) and
the comparison is :func:`fedsched.common.sim.paired.paired_against`'s, the one the benchmark
prints: the trouble score, each trouble metric's log ratio and every metric's difference, each
with its per-seed values, so the gate can take any bound it needs.

- :func:`paired_entry`: one cluster's figures (also a member's own validation pods: the
  federation's serving checkpoints carry evidence of the same form).
- :func:`collect`: every profile's, as::

    {"format": 1, "reference": "kube-default", "generator_seed": 31, "quick": False, "profiles": {
        PROFILE: {"scenario": NAME, "nodes": N, "pods": P, "seeds": [...],
                  "trouble_score": S, "log_ratio": {METRIC: S}, "diff": {METRIC: S},
                  "cached_runs": K}}}

with ``S`` a paired summary (``mean``, ``ci95``, ``n``, ``verdict``, ``values``) and ``K`` the runs
taken from the run cache (:mod:`fedsched.common.sim.run_cache`: kube-default's, and a baseline
policy's, checked by replaying one of them). ``fedsched evidence POLICY --write`` stores it in
the checkpoint's metadata under ``evidence``; for a baseline (which has no checkpoint) in a file
shipped with the package, ``common/data/evidence/NAME.json`` (:func:`baseline_evidence` reads it:
the packing check serves a baseline only where the gate admits it by this evidence).

May import: ``fedsched.common.model``, ``fedsched.common.schedulers`` (the baseline names) and
``fedsched.common.sim``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from fedsched.common.model.metrics import FAILED_REQUESTS, TROUBLE_SMOOTHING
from fedsched.common.model.profiles import PROFILES
from fedsched.common.sim.evaluate import EvalSpec, RunOutput, evaluate
from fedsched.common.sim.paired import TROUBLE
from fedsched.common.sim.run_cache import RunCache
from fedsched.common.sim.scenarios import SCENARIOS, build

log = logging.getLogger("fedsched.evidence")

EVIDENCE_FORMAT = 1
EVIDENCE_SEED = 31
"""The generator seed of every validation cluster (see the module docstring for the seeds it avoids)."""
REFERENCE = "kube-default"
PROFILE_SCENARIO = {"web": "web", "gpu": "gpu", "edge": "edge"}
"""The scenario whose parameters a profile's validation cluster takes."""
assert set(PROFILE_SCENARIO) == set(PROFILES)
KEPT_DIFFS = ("hot_cpu_node_s", "throttled_cpu_core_s", "oom_kills_per_1k_starts", "failed_pods",
              *FAILED_REQUESTS, "pending_p99_s", "pending_sla_misses", "contended_pod_share",
              "alloc_gpu", "gpu_frag_amount_avg", "stranded_cpu_avg", "util_mean")
"""The metrics whose plain differences the evidence keeps (the guardrails, what the failed pods
requested beside their count, and the objectives an operator may choose); the trouble metrics' log
ratios are always kept."""


def paired_entry(spec: EvalSpec, policy: str, jobs: int | None = None,
                 progress: Callable[[int, int, RunOutput], None] | None = None,
                 cache: RunCache | None = None) -> dict[str, Any]:
    """One cluster's evidence: ``policy`` beside kube-default on ``spec``'s cluster and seeds
    (``spec.policies`` and ``spec.reference`` are set here), the paired figures kept; with a
    ``cache``, kube-default's runs (and a baseline policy's) come from it where it has them
    (:func:`fedsched.common.sim.evaluate.evaluate`)."""
    spec.policies, spec.reference = [REFERENCE, policy], REFERENCE
    res = evaluate(spec, jobs=jobs, progress=progress, cache=cache)
    paired = res["paired"][policy]
    return {"nodes": len(spec.nodes), "pods": len(spec.pods), "seeds": paired["seeds"],
            TROUBLE: paired[TROUBLE], "log_ratio": {m: paired["log_ratio"][m] for m in TROUBLE_SMOOTHING},
            "diff": {m: v for m, v in paired["diff"].items() if m in KEPT_DIFFS},
            "cached_runs": int(res.get("cached_runs", 0))}


def collect(policy: str, profiles: Sequence[str] = PROFILES, seeds: int | None = None,
            jobs: int | None = None, quick: bool = False,
            progress: Callable[[str, int, int, RunOutput], None] | None = None,
            cache: RunCache | None = None) -> dict[str, Any]:
    """``policy`` (a scheduler name or a checkpoint path) against kube-default on each profile's
    validation cluster; ``seeds`` replaces each scenario's seed count; ``quick`` uses the small
    variants (for tests: too small to prove anything, the gate says so); ``cache`` as
    :func:`paired_entry`'s."""
    unknown = [p for p in profiles if p not in PROFILE_SCENARIO]
    if unknown:
        raise ValueError(f"unknown profile(s) {', '.join(unknown)}; expected some of {', '.join(PROFILES)}")
    if seeds is not None and seeds < 2:
        raise ValueError(f"evidence needs at least 2 seeds (one seed has no interval), got {seeds}")
    if policy == REFERENCE:
        raise ValueError("kube-default is the reference: there is nothing to compare it with")
    out: dict[str, Any] = {"format": EVIDENCE_FORMAT, "reference": REFERENCE, "generator_seed": EVIDENCE_SEED,
                           "quick": quick, "profiles": {}}
    for profile in profiles:
        sc = SCENARIOS[PROFILE_SCENARIO[profile]]
        spec = build(sc, quick=quick, seed=EVIDENCE_SEED)
        spec.seeds = list(range(100, 100 + (seeds if seeds is not None else 3 if quick else sc.seeds)))

        def step(k: int, total: int, o: RunOutput, profile: str = profile) -> None:
            if progress is not None:
                progress(profile, k, total, o)

        out["profiles"][profile] = {"scenario": sc.name, **paired_entry(spec, policy, jobs, step, cache)}
    return out


def baseline_evidence_path(name: str) -> Path:
    """Where a baseline's shipped evidence lives (``fedsched evidence NAME --write`` writes it)."""
    from fedsched.common.schedulers import BASELINES

    if name not in BASELINES or name == REFERENCE:
        raise ValueError(f"evidence files are for baselines other than {REFERENCE}, got {name!r}")
    return Path(str(resources.files("fedsched.common").joinpath("data", "evidence", f"{name}.json")))


def baseline_evidence(name: str) -> dict[str, Any] | None:
    """A baseline's shipped evidence, or None where there is none or it cannot be read (logged:
    no evidence, and the gate refuses)."""
    path = baseline_evidence_path(name)
    if not path.is_file():
        return None
    try:
        ev = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        log.warning("the evidence of %s (%s) cannot be read: %s", name, path, e)
        return None
    if not isinstance(ev, dict):
        log.warning("the evidence of %s (%s) is not an object", name, path)
        return None
    return ev
