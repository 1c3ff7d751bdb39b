"""The roll-out gate: active only where the checkpoint's validation beats kube-default."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.agent.serving.rollout_gate import gate
from fedsched.common.model.profiles import cluster_profile
from tests.builders import make_nodes


def _rows(policy: dict[str, float], kube: dict[str, float]) -> dict[str, dict[str, float]]:
    base = {"hot_cpu_node_s": 0.0, "throttled_cpu_core_s": 0.0, "oom_kills_per_1k_starts": 0.0}
    return {"policy": {**base, **policy}, "kube-default": {**base, **kube}}


def _online(**clusters: dict[str, dict[str, float]]) -> dict:
    return {"operating_mode": "online", "validation": {k.replace("_", "-"): v for k, v in clusters.items()}}


PACKING = {"eval_metric": "alloc_gpu", "best_eval": {"value": 95.99}, "reference": {"kube-default": 94.70}}


@pytest.mark.parametrize(("meta", "profile", "active", "says"), [
    # online: better on one metric, no worse on the others -> active
    (_online(web_0=_rows({"hot_cpu_node_s": 100.0}, {"hot_cpu_node_s": 900.0})), "web", True, "beats"),
    # online: better on hot time but worse on throttling -> shadow, and the losing metric is named
    (_online(web_0=_rows({"hot_cpu_node_s": 100.0, "throttled_cpu_core_s": 50.0},
                         {"hot_cpu_node_s": 900.0, "throttled_cpu_core_s": 10.0})),
     "web", False, "throttled_cpu_core_s 50 vs kube-default 10"),
    # online: a policy that loses gets shadow even where it wins on another cluster of the profile
    (_online(gpu_0=_rows({"oom_kills_per_1k_starts": 0.0}, {"oom_kills_per_1k_starts": 5.0}),
             openb_0=_rows({"oom_kills_per_1k_starts": 9.0}, {"oom_kills_per_1k_starts": 1.0})),
     "gpu", False, "oom_kills_per_1k_starts"),
    # online: ties everywhere (calm clusters) -> shadow: nothing to gain
    (_online(edge_0=_rows({}, {})), "edge", False, "no better"),
    # online: figures only for other profiles -> shadow
    (_online(web_0=_rows({"hot_cpu_node_s": 1.0}, {"hot_cpu_node_s": 9.0})), "edge", False,
     "no validation figures"),
    # online: within the tolerance is not worse
    (_online(web_0=_rows({"hot_cpu_node_s": 100.0, "throttled_cpu_core_s": 1000.0},
                         {"hot_cpu_node_s": 900.0, "throttled_cpu_core_s": 990.0})), "web", True, "beats"),
    # packing: a GPU-packing policy that beats kube-default serves a GPU cluster, not a CPU-only one
    (PACKING, "gpu", True, "beats kube-default's 94.7"),
    (PACKING, "web", False, "validated on a GPU cluster"),
    (PACKING, "edge", False, "validated on a GPU cluster"),
    # a replay-trained policy (lower is better) on a CPU cluster it was trained on
    ({"eval_metric": "hot_cpu_node_s", "best_eval": {"value": 10.0}, "reference": {"kube-default": 30.0},
      "trained_on_gpus": False}, "web", True, "beats"),
    ({"eval_metric": "hot_cpu_node_s", "best_eval": {"value": 40.0}, "reference": {"kube-default": 30.0},
      "trained_on_gpus": False}, "web", False, "does not beat"),
    ({**PACKING, "best_eval": {"value": 94.0}}, "gpu", False, "does not beat"),
    # no figures at all
    ({}, "gpu", False, "no validation figures"),
])
def test_gate_verdicts(meta, profile, active, says):
    v = gate(meta, profile)
    assert v.active is active
    assert says in v.reason
    assert v.profile == profile


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="unknown profile"):
        gate({}, "mainframe")


@pytest.mark.parametrize(("cpu", "gpu", "profile"), [
    ([4000, 8000], [0, 0], "edge"),
    ([4000, 32000], [0, 0], "web"),
    ([4000, 32000], [0, 2], "gpu"),
])
def test_cluster_profile(cpu, gpu, profile):
    nodes = make_nodes(cpu, [8192] * len(cpu), gpu)
    assert cluster_profile(nodes) == profile


def test_the_shipped_policies_are_gated_as_documented():
    """default.pt (batch packing, FGD-like) serves GPU clusters only; its metadata carries the
    validation figures the gate reads."""
    from fedsched.agent.serving.model_store import load_model, resolve_policy_path

    m = load_model(resolve_policy_path("learned"))
    assert gate(m.meta, "gpu").active, gate(m.meta, "gpu").reason
    assert not gate(m.meta, "web").active
    assert np.isfinite(m.meta["reference"]["kube-default"])
