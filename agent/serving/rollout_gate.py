"""The roll-out gate: serve a policy actively only where its evidence proves it, shadow elsewhere.

Evidence is what ``fedsched evidence POLICY --write`` stores in a checkpoint's metadata
(:mod:`fedsched.common.sim.evidence`): for each profile, the policy beside kube-default on a
validation cluster of realistic size (web 200 nodes, gpu 100, edge 40, at 85% load), replayed
on several seeds, with every seed's paired difference. The gate reads it for each profile of the
cluster (:func:`fedsched.common.model.profiles.cluster_profiles`: a mixed cluster is judged on
each profile it holds and must pass all) and answers active only when, for every one of them:

- **the objective is better**, one-sided at 95% (Student t over the seeds): by default the
  trouble score (the mean log ratio of hot CPU node-time, throttled CPU, OOM kills and failed
  pods to kube-default's; its upper bound must be below 0); an operator may state another
  (:data:`OBJECTIVES`: ``gpu-alloc`` for a batch training cluster that packs GPUs first, ...);
- **no guardrail is worse**, one-sided at 95% (:data:`GUARDRAILS`: OOM kills, throttled CPU and
  failed pods as log ratios, pending p99 as a difference; a lower bound above 0 is worse),
  whatever the objective.

A model served with the decision-time search (``fedsched serve --search``) is judged by the
evidence of the search itself (``fedsched evidence POLICY --search ARGS --write``, stored under
``search_evidence`` with the search's arguments), since the search places pods the model alone
would not: the model's own evidence never admits it.

Anything else is shadow, with the reason and the figures: no evidence for the profile (a
checkpoint without it, such as one trained before the evidence existed, or figures of the old
single-run kind: a packing figure or one validation run never admits a policy into an online
cluster), evidence from the ``quick`` clusters (8-10 nodes: nothing happens there), fewer than
:data:`MIN_SEEDS` seeds, an objective not proven, or a guardrail that is worse.

May import ``fedsched.common`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedsched.common.model.metrics import FAILED_REQUESTS
from fedsched.common.model.profiles import PROFILES
from fedsched.common.sim.paired import one_sided_bounds

CONFIDENCE = 0.95
MIN_SEEDS = 3  # fewer paired seeds than this prove nothing, whatever their mean


@dataclass(frozen=True)
class Figure:
    """Where a figure lives in a profile's evidence, and which way is better."""

    section: str  # "trouble_score" (top level), "log_ratio" or "diff"
    metric: str
    lower_is_better: bool = True

    def values(self, entry: dict[str, Any]) -> list[float] | None:
        node = entry.get(self.section) if self.section == "trouble_score" else \
            (entry.get(self.section) or {}).get(self.metric)
        vals = node.get("values") if isinstance(node, dict) else None
        if not isinstance(vals, list) or not all(isinstance(v, int | float) for v in vals):
            return None
        return [float(v) for v in vals]

    def label(self) -> str:
        return "trouble score" if self.section == "trouble_score" else \
            f"log ratio of {self.metric}" if self.section == "log_ratio" else f"{self.metric} difference"


OBJECTIVES = {
    "trouble": Figure("trouble_score", "trouble_score"),
    "hot-cpu": Figure("log_ratio", "hot_cpu_node_s"),
    "gpu-alloc": Figure("diff", "alloc_gpu", lower_is_better=False),
    "gpu-frag": Figure("diff", "gpu_frag_amount_avg"),
}
"""The objectives an operator may state (``--gate-objective``); ``trouble`` (online health) by default."""
PACKING_OBJECTIVES = ("gpu-alloc", "gpu-frag")
"""The objectives of a packing cluster (``fedsched serve --packing-check auto`` checks those models)."""
GUARDRAILS = (
    Figure("log_ratio", "oom_kills_per_1k_starts"),
    Figure("log_ratio", "throttled_cpu_core_s"),
    Figure("log_ratio", "failed_pods"),
    Figure("diff", "pending_p99_s"),
)


@dataclass(frozen=True)
class GateVerdict:
    active: bool
    reason: str
    profile: str  # the profiles judged, joined with "+" ("web", "gpu+web")


REQUESTED = tuple(Figure("diff", m) for m in FAILED_REQUESTS)
"""Said beside a worse failed-pods guardrail where the evidence holds them (not a guardrail): what
the failed pods requested, since a policy that lets large pods in fails more pods and no more work."""


def _requested(entry: dict[str, Any], guardrail: Figure) -> str:
    if guardrail.metric != "failed_pods":
        return ""
    said = []
    for f in REQUESTED:
        vals = f.values(entry)
        if vals and any(vals):
            mean, lo, hi, _ = one_sided_bounds(vals, CONFIDENCE)
            said.append(f"{f.metric} {mean:+.3g} (one-sided 95% bounds {lo:+.3g}, {hi:+.3g})")
    return f", what they requested: {', '.join(said)}" if said else ""


def _judge(entry: dict[str, Any], profile: str, objective: str) -> tuple[bool, str]:
    """One profile's evidence: (proven, reason with the figures)."""
    where = f"{entry.get('nodes', '?')}-node {profile} validation cluster"
    obj = OBJECTIVES[objective]
    vals = obj.values(entry)
    if vals is None:
        return False, f"the {profile} evidence has no per-seed {obj.label()}"
    mean, lo, hi, n = one_sided_bounds(vals, CONFIDENCE)
    if n < MIN_SEEDS:
        return False, f"{n} seeds on the {where} (at least {MIN_SEEDS} needed)"
    bound = hi if obj.lower_is_better else lo
    figure = f"{obj.label()} {mean:+.3g} (one-sided 95% bound {bound:+.3g}, {n} seeds, {where})"
    proven = hi < 0 if obj.lower_is_better else lo > 0
    if not proven:
        return False, f"not proven better than kube-default: {figure}"
    worse = []
    for g in GUARDRAILS:
        gv = g.values(entry)
        if gv is None:
            return False, f"the {profile} evidence has no per-seed {g.label()} (a guardrail)"
        gm, glo, ghi, _ = one_sided_bounds(gv, CONFIDENCE)
        bound = glo if g.lower_is_better else ghi
        if (glo > 0) if g.lower_is_better else (ghi < 0):
            worse.append(f"{g.label()} {gm:+.3g} (one-sided 95% bound {bound:+.3g})" + _requested(entry, g))
    if worse:
        return False, f"worse than kube-default on a guardrail: {'; '.join(worse)} ({where}; {figure})"
    return True, f"better than kube-default: {figure}; no guardrail worse"


def gate(meta: dict[str, Any], profiles: str | Sequence[str], objective: str = "trouble",
         search: str | None = None) -> GateVerdict:
    """Active or shadow for a checkpoint's metadata on a cluster of ``profiles`` (one name, or
    every profile of a mixed cluster). ``search`` (a :meth:`LookaheadArgs.spec`) judges the
    decision-time search over the checkpoint instead: by the evidence of that very search
    (``search_evidence``), never by the checkpoint's own."""
    names = (profiles,) if isinstance(profiles, str) else tuple(profiles)
    for p in names:
        if p not in PROFILES:
            raise ValueError(f"unknown profile {p!r}: expected one of {', '.join(PROFILES)}")
    if not names:
        raise ValueError("no profile to judge")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown gate objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    label = "+".join(names)
    if search is not None:
        evidence = meta.get("search_evidence")
        if not isinstance(evidence, dict) or evidence.get("search") != search:
            return GateVerdict(False, f"no paired evidence of the search {search} in the checkpoint "
                                      f"(fedsched evidence POLICY --search {search} --write replays it "
                                      f"beside kube-default at realistic size)", label)
    else:
        evidence = meta.get("evidence")
    if not isinstance(evidence, dict) or not isinstance(evidence.get("profiles"), dict):
        return GateVerdict(False, "no paired evidence in the checkpoint (fedsched evidence POLICY --write "
                                  "replays it beside kube-default at realistic size)", label)
    if evidence.get("quick"):
        return GateVerdict(False, "the checkpoint's evidence comes from the quick 8-10-node clusters, "
                                  "which prove nothing", label)
    reasons = []
    for p in names:
        entry = evidence["profiles"].get(p)
        if not isinstance(entry, dict):
            return GateVerdict(False, f"no paired evidence for the {p} profile in the checkpoint", label)
        ok, why = _judge(entry, p, objective)
        if not ok:
            return GateVerdict(False, why if len(names) == 1 else f"{p}: {why}", label)
        reasons.append(why if len(names) == 1 else f"{p}: {why}")
    return GateVerdict(True, "; ".join(reasons), label)

