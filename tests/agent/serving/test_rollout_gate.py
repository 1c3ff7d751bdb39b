"""The roll-out gate: active only where paired evidence at realistic size proves the policy better
than kube-default on the objective, one-sided at 95%, with no guardrail worse; shadow otherwise,
with the reason and the figures."""

from __future__ import annotations

import math

import pytest

from fedsched.agent.serving.rollout_gate import GUARDRAILS, OBJECTIVES, gate
from fedsched.common.model.metrics import TROUBLE_SMOOTHING
from fedsched.common.model.profiles import cluster_profile, cluster_profiles
from fedsched.common.schedulers import LEARNED, LEARNED_ONLINE, LEARNED_TD3
from tests.builders import make_nodes

CALM = [0.0] * 8


def _s(values: list[float]) -> dict:
    return {"values": values}


def _entry(trouble: list[float] | None = None, nodes: int = 200, **figures: list[float]) -> dict:
    """One profile's evidence: per-seed values (8 seeds of 0 unless given)."""
    log_ratio = {m: _s(figures.get(m, CALM)) for m in TROUBLE_SMOOTHING}
    diff = {m: _s(figures.get(m, CALM)) for m in ("pending_p99_s", "alloc_gpu", "gpu_frag_amount_avg")}
    diff["hot_cpu_node_s"] = _s(figures.get("hot_cpu_node_s", CALM))
    return {"nodes": nodes, "seeds": list(range(8)), "log_ratio": log_ratio, "diff": diff,
            "trouble_score": _s(trouble if trouble is not None else CALM)}


def _meta(quick: bool = False, **profiles: dict) -> dict:
    return {"evidence": {"format": 1, "reference": "kube-default", "quick": quick, "profiles": profiles}}


PACKS = [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.1]  # GPU allocation gained, in points
BETTER = [-0.30, -0.25, -0.35, -0.28, -0.31, -0.22, -0.40, -0.27]  # clearly below 0
NOISY = [-0.9, 0.6, -0.7, 0.5, -0.8, 0.7, -0.6, 0.4]  # mean below 0, interval across it
WORSE = [0.40, 0.35, 0.50, 0.45, 0.38, 0.42, 0.55, 0.47]  # clearly above 0


@pytest.mark.parametrize(("meta", "profiles", "objective", "active", "says"), [
    # proven better on the objective, no guardrail worse -> active, with the figure and its bound
    (_meta(web=_entry(BETTER)), "web", "trouble", True,
     "better than kube-default: trouble score -0.298 (one-sided 95% bound -0.259, 8 seeds, 200-node"),
    # a mean below 0 whose interval crosses it proves nothing
    (_meta(web=_entry(NOISY)), "web", "trouble", False, "not proven better"),
    (_meta(web=_entry(WORSE)), "web", "trouble", False, "not proven better"),
    # better on the objective but OOM kills rise past the guardrail -> shadow, the guardrail named
    (_meta(gpu=_entry(BETTER, oom_kills_per_1k_starts=WORSE)), "gpu", "trouble", False,
     "guardrail: log ratio of oom_kills_per_1k_starts +0.44"),
    (_meta(gpu=_entry(BETTER, pending_p99_s=[30.0 + k for k in range(8)])), "gpu", "trouble", False,
     "pending_p99_s difference"),
    # a noisy guardrail is not "worse": only a significant rise blocks
    (_meta(gpu=_entry(BETTER, throttled_cpu_core_s=NOISY)), "gpu", "trouble", True, "no guardrail worse"),
    # the operator's objective: GPU allocation (higher is better) on a batch training cluster
    (_meta(gpu=_entry(WORSE, alloc_gpu=PACKS)), "gpu", "gpu-alloc", True,
     "alloc_gpu difference +1.05"),
    # ... whose guardrails still hold: a packing policy that packs GPUs but kills pods stays in shadow
    (_meta(gpu=_entry(WORSE, alloc_gpu=PACKS, oom_kills_per_1k_starts=WORSE)),
     "gpu", "gpu-alloc", False, "guardrail"),
    # ... and on online health the same packing policy is not proven
    (_meta(gpu=_entry(WORSE, alloc_gpu=PACKS)), "gpu", "trouble", False,
     "not proven"),
    # evidence for other profiles only
    (_meta(web=_entry(BETTER)), "edge", "trouble", False, "no paired evidence for the edge profile"),
    # a mixed cluster must pass every profile it holds
    (_meta(web=_entry(BETTER), gpu=_entry(BETTER)), ("web", "gpu"), "trouble", True, "gpu: better"),
    (_meta(web=_entry(BETTER), gpu=_entry(NOISY)), ("web", "gpu"), "trouble", False, "gpu: not proven"),
    # the quick 8-10-node clusters prove nothing, whatever they say
    (_meta(quick=True, web=_entry(BETTER)), "web", "trouble", False, "quick"),
    # too few seeds
    (_meta(web={**_entry(BETTER), "trouble_score": _s([-0.5, -0.4])}), "web", "trouble", False, "2 seeds"),
    # figures of the old single-run kind, or none at all -> shadow: only paired evidence admits
    ({"operating_mode": "online", "validation": {"web-0": {"policy": {}, "kube-default": {}}}}, "web",
     "trouble", False, "no paired evidence"),
    ({"eval_metric": "alloc_gpu", "best_eval": {"value": 95.79}, "reference": {"kube-default": 94.52}}, "gpu",
     "trouble", False, "no paired evidence"),
    ({}, "gpu", "trouble", False, "no paired evidence"),
    # malformed evidence is no evidence
    (_meta(web={**_entry(BETTER), "trouble_score": {"values": "lots"}}), "web", "trouble", False,
     "no per-seed trouble score"),
    (_meta(web={**_entry(BETTER), "log_ratio": {}}), "web", "trouble", False, "guardrail"),
    ({"evidence": ["not", "a", "mapping"]}, "web", "trouble", False, "no paired evidence"),
])
def test_gate_verdicts(meta, profiles, objective, active, says):
    v = gate(meta, profiles, objective)
    assert v.active is active, v.reason
    assert says in v.reason, v.reason
    assert v.profile == (profiles if isinstance(profiles, str) else "+".join(profiles))


def test_every_guardrail_blocks_on_its_own():
    for g in GUARDRAILS:
        entry = _entry(BETTER)
        section = entry["log_ratio"] if g.section == "log_ratio" else entry["diff"]
        section[g.metric] = _s(WORSE)
        v = gate(_meta(web=entry), "web")
        assert not v.active and g.metric in v.reason, (g, v.reason)


def test_a_worse_failed_pods_guardrail_says_what_the_failed_pods_requested():
    """More failed pods but fewer requested cores (large pods let in): still shadow, the count is
    the guardrail, and the reason gives the requested cores' difference with its bounds."""
    entry = _entry(BETTER, failed_pods=[0.006, 0.004, 0.007, 0.005, 0.006, 0.008, 0.005, 0.006])
    entry["diff"]["failed_cpu_cores"] = _s([-9.0, -7.0, -10.0, -8.0, -9.5, -6.0, -11.0, -8.5])
    entry["diff"]["failed_gpus"] = _s(CALM)  # nothing requested GPUs: not said
    v = gate(_meta(edge=entry), "edge")
    assert not v.active
    assert "log ratio of failed_pods +0.00588" in v.reason
    assert ", what they requested: failed_cpu_cores -8.62 (one-sided 95% bounds -9." in v.reason
    assert "failed_gpus" not in v.reason
    plain = gate(_meta(edge=_entry(BETTER, failed_pods=WORSE)), "edge")  # evidence written before them
    assert "what they requested" not in plain.reason and "failed_pods" in plain.reason


def test_unknown_profile_or_objective_is_refused():
    with pytest.raises(ValueError, match="unknown profile"):
        gate({}, "mainframe")
    with pytest.raises(ValueError, match="unknown gate objective"):
        gate({}, "web", "fastest")
    assert set(OBJECTIVES) >= {"trouble", "gpu-alloc"}


@pytest.mark.parametrize(("cpu", "gpu", "profile", "profiles"), [
    ([4000, 8000], [0, 0], "edge", ("edge",)),
    ([4000, 32000], [0, 0], "web", ("web",)),
    ([4000, 32000], [0, 2], "gpu", ("gpu",)),  # a GPU cluster's small CPU-only share
    ([32000] * 3 + [64000], [0, 0, 0, 8], "gpu", ("web", "gpu")),  # mixed: most cores on CPU-only nodes
    ([8000] * 6 + [64000], [0] * 6 + [4], "gpu", ("gpu", "edge")),
    ([64000, 64000], [8, 8], "gpu", ("gpu",)),
])
def test_cluster_profiles(cpu, gpu, profile, profiles):
    nodes = make_nodes(cpu, [8192] * len(cpu), gpu)
    assert cluster_profile(nodes) == profile
    assert cluster_profiles(nodes) == profiles


@pytest.mark.parametrize("name", [LEARNED, LEARNED_TD3, LEARNED_ONLINE])
def test_the_shipped_policies_carry_realistic_evidence_for_every_profile(name):
    """Each shipped checkpoint carries ``fedsched evidence NAME --write``'s figures: every profile
    at realistic size, every seed paired, and the gate's verdicts follow from them alone."""
    from fedsched.agent.serving.model_store import load_model, resolve_policy_path

    meta = load_model(resolve_policy_path(name)).meta
    ev = meta["evidence"]
    assert ev["quick"] is False and set(ev["profiles"]) == {"web", "gpu", "edge"}
    sizes = {p: e["nodes"] for p, e in ev["profiles"].items()}
    assert sizes["web"] >= 200 and sizes["gpu"] >= 100 and sizes["edge"] >= 40
    for p, e in ev["profiles"].items():
        t = e["trouble_score"]["values"]
        assert len(t) == len(e["seeds"]) >= 8 and all(math.isfinite(x) for x in t)
        v = gate(meta, p)
        assert v.reason.startswith("better than kube-default") == v.active


@pytest.mark.parametrize(("name", "profiles", "objective", "active", "says"), [
    # a loaded GPU cluster: the packing and TD3 policies run hotter and kill more pods -> shadow,
    # whether the objective is online health or GPU allocation (the OOM guardrail holds either way)
    (LEARNED, "gpu", "trouble", False, "not proven better"),
    (LEARNED, "gpu", "gpu-alloc", False, "guardrail: log ratio of oom_kills_per_1k_starts"),
    (LEARNED_TD3, "gpu", "trouble", False, "not proven better"),
    (LEARNED_TD3, "gpu", "gpu-alloc", False, "guardrail: log ratio of oom_kills_per_1k_starts"),
    # the online policy, scored with kube-default beside it, is proven on loaded GPU and web
    # clusters (60 seeds, no guardrail worse), whatever the objective there; on edge it ties
    (LEARNED_ONLINE, "gpu", "trouble", True, "better than kube-default: trouble score"),
    (LEARNED_ONLINE, "web", "trouble", True, "better than kube-default: trouble score"),
    (LEARNED_ONLINE, "web", "hot-cpu", True, "better than kube-default: log ratio of hot_cpu_node_s"),
    (LEARNED_ONLINE, "edge", "trouble", False, "not proven better"),
    (LEARNED_ONLINE, ("web", "gpu"), "trouble", True, "gpu: better"),
    (LEARNED_ONLINE, ("web", "edge"), "trouble", False, "edge: not proven better"),
])
def test_the_shipped_policies_verdicts(name, profiles, objective, active, says):
    """The verdicts ``common/data/policies/README.md`` documents, from the shipped evidence."""
    from fedsched.agent.serving.model_store import load_model, resolve_policy_path

    v = gate(load_model(resolve_policy_path(name)).meta, profiles, objective)
    assert v.active is active and says in v.reason, v.reason


def test_a_searched_policy_is_judged_by_the_searchs_own_evidence_only():
    """``fedsched serve --search``: the model's own evidence never admits the search over it; the
    search's evidence does, and only for the arguments it was replayed with."""
    spec = "candidates=4,horizon=10,futures=1,seed=0"
    own = _meta(gpu=_entry(BETTER))
    assert gate(own, "gpu").active
    v = gate(own, "gpu", search=spec)
    assert not v.active and f"no paired evidence of the search {spec}" in v.reason
    assert f"--search {spec} --write" in v.reason
    searched = {**own, "search_evidence": {**_meta(gpu=_entry(WORSE, alloc_gpu=PACKS))["evidence"],
                                           "search": spec}}
    assert gate(searched, "gpu", "gpu-alloc", search=spec).active
    assert not gate(searched, "gpu", "trouble", search=spec).active  # judged on its own figures
    assert gate(searched, "gpu", "trouble").active  # ... the model alone still on the model's
    other = "candidates=8,horizon=10,futures=1,seed=0"
    assert not gate(searched, "gpu", "gpu-alloc", search=other).active
    broken = {"search_evidence": "not a mapping"}
    assert "no paired evidence of the search" in gate(broken, "gpu", search=spec).reason
