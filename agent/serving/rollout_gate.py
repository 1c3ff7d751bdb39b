"""The roll-out gate: serve a policy actively only where its validation beats kube-default.

A checkpoint carries its validation figures (``fedsched.common.learning.checkpoint`` metadata).
The gate reads them for the cluster's *profile* and answers active or shadow, with the reason
(``fedsched serve`` puts it in the log and in ``/metrics`` as ``fedsched_policy_active``):

- **online policies** (metadata ``operating_mode: online``, ``agent/learning/online.py``): the
  ``validation`` figures of the held-out clusters of the profile (``web-0``, ``gpu-1``, ... ;
  GPU clusters are judged on the ``gpu`` and ``openb`` ones). Active only when, summed over
  those clusters, the policy is no worse than kube-default on every primary metric
  (:data:`PRIMARY`: hot CPU node-seconds, throttled CPU, OOM kills per 1,000 starts; ``TOLERANCE``
  of slack) and strictly better on at least one. A policy that only ties kube-default (e.g.
  clusters where nothing ever runs hot) gains nothing by serving and stays in shadow.
- **policies of ``fedsched train``** (no operating mode: the shipped batch-packing ``default.pt``,
  the TD3 ``td3-replay.pt``): their held-out evaluation (``eval_metric``, ``best_eval``) beside
  kube-default's on the same run (``reference``). Active only when the policy beats kube-default
  on that metric and, for a policy trained on a GPU cluster (``trained_on_gpus``; a checkpoint
  without the flag counts as one, the cautious side), only on a GPU profile; a CPU-only cluster gets shadow (a
  GPU-packing policy has nothing to offer it: "a CPU-only web cluster gets a GPU-packing policy").
- anything else (no figures): shadow.

The profile is given (``web``, ``gpu``, ``edge``) or inferred from the node inventory
(:func:`fedsched.common.model.profiles.cluster_profile`: GPUs anywhere -> ``gpu``; every node
at most ``EDGE_MAX_CORES`` cores -> ``edge``; otherwise ``web``).

May import ``fedsched.common`` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedsched.common.model.metrics import HIGHER_IS_BETTER
from fedsched.common.model.profiles import PROFILES

PRIMARY = ("hot_cpu_node_s", "throttled_cpu_core_s", "oom_kills_per_1k_starts")
VALIDATION_GROUPS = {"web": ("web",), "edge": ("edge",), "gpu": ("gpu", "openb")}
TOLERANCE = 0.02  # relative slack before "worse" (validation runs are single seeds)


@dataclass(frozen=True)
class GateVerdict:
    active: bool
    reason: str
    profile: str


def _online(meta: dict[str, Any], profile: str) -> GateVerdict:
    groups = VALIDATION_GROUPS[profile]
    rows = [r for k, r in (meta.get("validation") or {}).items() if str(k).rsplit("-", 1)[0] in groups]
    if not rows:
        return GateVerdict(False, f"no validation figures for the {profile} profile", profile)
    worse, better = [], []
    for m in PRIMARY:
        p = sum(float(r["policy"].get(m, math.nan)) for r in rows)
        k = sum(float(r["kube-default"].get(m, math.nan)) for r in rows)
        if not (math.isfinite(p) and math.isfinite(k)):
            return GateVerdict(False, f"validation figures for {profile} lack {m}", profile)
        if p > k * (1 + TOLERANCE) + 1e-9:
            worse.append(f"{m} {p:.4g} vs kube-default {k:.4g}")
        elif p < k * (1 - TOLERANCE) - 1e-9:
            better.append(f"{m} {p:.4g} vs {k:.4g}")
    n = len(rows)
    if worse:
        return GateVerdict(False, f"loses to kube-default on {n} {profile} validation clusters: "
                                  + "; ".join(worse), profile)
    if not better:
        return GateVerdict(False, f"no better than kube-default on {n} {profile} validation clusters",
                           profile)
    return GateVerdict(True, f"beats kube-default on {n} {profile} validation clusters: " + "; ".join(better),
                       profile)


def _trained(meta: dict[str, Any], profile: str) -> GateVerdict:
    metric = meta.get("eval_metric")
    value = (meta.get("best_eval") or {}).get("value")
    kube = (meta.get("reference") or {}).get("kube-default")
    if metric is None or value is None or kube is None or not math.isfinite(float(value)):
        return GateVerdict(False, "no validation figures against kube-default in the checkpoint", profile)
    on_gpus = bool(meta.get("trained_on_gpus", True))  # unknown: assume a GPU cluster (the cautious side)
    if on_gpus and profile != "gpu":
        return GateVerdict(False, f"validated on a GPU cluster ({metric}); this cluster is {profile}",
                           profile)
    value, kube = float(value), float(kube)
    better = value > kube if metric in HIGHER_IS_BETTER else value < kube
    if not better:
        return GateVerdict(False, f"{metric} {value:.4g} does not beat kube-default's {kube:.4g}", profile)
    return GateVerdict(True, f"{metric} {value:.4g} beats kube-default's {kube:.4g}", profile)


def gate(meta: dict[str, Any], profile: str) -> GateVerdict:
    """Active or shadow for a checkpoint's metadata on a cluster of ``profile``."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: expected one of {', '.join(PROFILES)}")
    if meta.get("operating_mode") == "online":
        return _online(meta, profile)
    return _trained(meta, profile)
