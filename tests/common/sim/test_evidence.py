"""The roll-out gate's evidence: paired replays on each profile's validation cluster (never the
benchmark's), stored in a checkpoint by ``fedsched evidence --write`` without touching its weights."""

from __future__ import annotations

import shutil

import pytest
import torch

from fedsched.agent.serving.rollout_gate import gate
from fedsched.common.learning.checkpoint import CheckpointError, load_checkpoint, update_metadata
from fedsched.common.model.metrics import TROUBLE_SMOOTHING
from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path
from fedsched.common.sim.evidence import EVIDENCE_SEED, collect
from fedsched.common.sim.scenarios import SCENARIOS, build


def test_validation_clusters_are_not_the_benchmarks():
    for name in ("web", "gpu", "edge"):
        sc = SCENARIOS[name]
        bench, val = build(sc, quick=True), build(sc, quick=True, seed=EVIDENCE_SEED)
        assert len(bench.nodes) == len(val.nodes)  # the same parameters ...
        drawn_anew = list(bench.pods.names) != list(val.pods.names) or (bench.pods.cpu != val.pods.cpu).any()
        assert drawn_anew and sc.seed != EVIDENCE_SEED


def test_collect_pairs_every_seed_and_the_gate_refuses_quick_evidence():
    ev = collect("prefer-hot", ["edge"], seeds=2, jobs=1, quick=True)
    assert ev["quick"] is True and ev["reference"] == "kube-default" and set(ev["profiles"]) == {"edge"}
    e = ev["profiles"]["edge"]
    assert e["scenario"] == "edge" and e["nodes"] == 8 and e["seeds"] == ["100", "101"]
    assert len(e["trouble_score"]["values"]) == 2
    assert set(e["log_ratio"]) == set(TROUBLE_SMOOTHING)
    assert {"pending_p99_s", "stranded_cpu_avg"} <= set(e["diff"])
    assert "alloc_gpu" not in e["diff"]  # NaN on a cluster without GPUs: no figure rather than a NaN one
    v = gate({"evidence": ev}, "edge")
    assert not v.active and "quick" in v.reason


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"profiles": ["mainframe"]}, "unknown profile"),
    ({"seeds": 1}, "at least 2 seeds"),
    ({"policy": "kube-default"}, "reference"),
])
def test_collect_refuses_what_cannot_be_evidence(kwargs, message):
    args = {"policy": "prefer-hot", "profiles": ["edge"], "quick": True, **kwargs}
    with pytest.raises(ValueError, match=message):
        collect(**args)


def test_update_metadata_keeps_the_weights_and_refuses_a_file_it_cannot_serve(tmp_path):
    path = tmp_path / "p.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), path)
    before, meta0, _ = load_checkpoint(path)
    update_metadata(path, {"evidence": {"format": 1, "profiles": {}}})
    after, meta, _ = load_checkpoint(path)
    assert meta["evidence"] == {"format": 1, "profiles": {}}
    assert {k: v for k, v in meta.items() if k != "evidence"} == {k: v for k, v in meta0.items()
                                                                   if k != "evidence"}
    for (k, a), (_, b) in zip(before.state_dict().items(), after.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        update_metadata(bad, {"evidence": {}})
    assert bad.read_bytes() == b"not a checkpoint"


def test_fgds_shipped_evidence_is_realistic_and_refused_on_gpu_clusters_by_a_guardrail():
    """FGD, the packing check's alternative, carries evidence of the kind the gate reads (every
    profile, realistic sizes, the scenarios' seeds); it packs more GPU on the gpu validation
    cluster but with more OOM kills than kube-default, so a gated agent never serves it there."""
    from fedsched.common.model.profiles import PROFILES
    from fedsched.common.sim.evidence import baseline_evidence, baseline_evidence_path

    ev = baseline_evidence("fgd")
    assert ev is not None and ev["quick"] is False and set(ev["profiles"]) == set(PROFILES)
    assert all(len(e["seeds"]) >= 20 and e["nodes"] >= 40 for e in ev["profiles"].values())
    v = gate({"evidence": ev}, "gpu", "gpu-alloc")
    assert not v.active and "oom_kills_per_1k_starts" in v.reason
    assert ev["profiles"]["gpu"]["diff"]["alloc_gpu"]["mean"] > 0
    for name in ("kube-default", "../policies/default", "learned"):
        with pytest.raises(ValueError, match="baselines other than kube-default"):
            baseline_evidence_path(name)
