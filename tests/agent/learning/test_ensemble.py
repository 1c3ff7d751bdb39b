"""Ensembles of trainings: ``average_policies`` is the exact mean of its members on every path
(forward, numpy, ONNX, the scorer with its kube-default term), and the checkpoint merge keeps
the members' scoring, lists them, drops their evidence and refuses what cannot be merged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.agent.learning.ensemble import main, merge_checkpoints
from fedsched.agent.serving.rollout_gate import gate
from fedsched.common.learning.checkpoint import (
    load_checkpoint,
    save_checkpoint,
    typical_to_dict,
)
from fedsched.common.learning.features import CONTEXT_FEATURES, NODE_FEATURES, POD_FEATURES
from fedsched.common.learning.nets import (
    NodeScoringPolicy,
    PolicyConfig,
    WeightPolicy,
    average_policies,
)
from fedsched.common.learning.scorers import PolicyScheduler, scheduler_from_checkpoint
from fedsched.common.model.cluster import Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.synthetic import generate_cluster
from tests.builders import first_fit_state

N_F, N_P, N_C = len(NODE_FEATURES), len(POD_FEATURES), len(CONTEXT_FEATURES)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def member(seed: int, hidden: int = 8) -> NodeScoringPolicy:
    """A policy with weights of order one everywhere (a fresh head_out is 0.01-scaled, which
    would hide a wrongly merged encoder)."""
    torch.manual_seed(seed)
    policy = NodeScoringPolicy(PolicyConfig(hidden=hidden))
    with torch.no_grad():
        for p in policy.parameters():
            p.normal_(0.0, 0.5)
    return policy.eval()


@settings(max_examples=20, deadline=None)
@given(k=st.integers(1, 4), hidden=st.sampled_from([2, 8]), n=st.integers(1, 12),
       seed=st.integers(0, 2**16))
def test_merged_forward_is_the_members_mean(k, hidden, n, seed):
    policies = [member(seed + i, hidden) for i in range(k)]
    merged = average_policies(policies).eval()
    assert merged.cfg.hidden == k * hidden
    g = torch.Generator().manual_seed(seed)
    nodes, pod, ctx = torch.randn(3, n, N_F, generator=g), torch.rand(3, N_P, generator=g), torch.rand(3, N_C)
    mask = torch.rand(3, n, generator=g) < 0.6
    mask[0] = True
    mask[2] = False  # a row with no feasible node: the pooled max falls back to zeros alike
    with torch.no_grad():
        outs = [p(nodes, pod, ctx, mask) for p in policies]
        logits, value = merged(nodes, pod, ctx, mask)
    mean_logits = torch.stack([o[0] for o in outs]).mean(dim=0)
    torch.testing.assert_close(logits[mask], mean_logits[mask], atol=1e-5, rtol=1e-5)
    assert torch.all(logits[~mask] == -1e9)
    torch.testing.assert_close(value, torch.stack([o[1] for o in outs]).mean(dim=0), atol=1e-5, rtol=1e-5)
    x = nodes[0].numpy(), pod[0].numpy(), ctx[0].numpy()
    np.testing.assert_allclose(merged.score_numpy(*x), np.mean([p.score_numpy(*x) for p in policies], axis=0),
                               atol=1e-5, rtol=1e-5)


def test_average_refuses_nothing_and_mixed_shapes():
    with pytest.raises(ValueError, match="no policy"):
        average_policies([])
    with pytest.raises(ValueError, match="differ in shape"):
        average_policies([member(0, 8), member(1, 4)])


@pytest.fixture(scope="module")
def cluster():
    nodes, pods = generate_cluster("gpu", 4, n_nodes=16, n_pods=120, share_fraction=0.6)
    state = first_fit_state(nodes, pods, 40)
    return state, pods, TypicalPods.from_pods(pods)


def save(path, policy, typical, *, kube_weight=2.0, mode="online", evidence=True, data="d"):
    extra = {"operating_mode": mode, "scoring": {"kube_weight": kube_weight} if kube_weight else {},
             "recipe": f"train {path.name}", "fit": {"r2": 0.5}}
    if evidence:  # a member's own evidence, which must not pass to the ensemble
        extra["evidence"] = {"format": 1, "profiles": {}}
    return save_checkpoint(path, policy, algorithm="credit", hyperparameters={"seed": path.stem},
                           typical=typical, data=data, extra=extra)


def test_merged_checkpoint_scores_as_the_members_mean_on_every_backend(cluster, tmp_path):
    """The serving path: scorers built from the checkpoints (kube-default's term included)."""
    state, pods, typical = cluster
    paths = [save(tmp_path / f"m{i}.pt", member(10 + i), typical, data=f"h{i}+shared") for i in range(3)]
    out = merge_checkpoints(paths, tmp_path / "ens" / "checkpoint.pt")
    pod = Pod.from_table(pods, 60)
    cand = np.flatnonzero(state.feasible(pod))
    members = np.mean([scheduler_from_checkpoint(p).score(state, pod, cand) for p in paths], axis=0)
    merged = scheduler_from_checkpoint(out)
    assert merged.kube_weight == 2.0
    for backend in ("numpy", "torch", "onnx"):
        scorer = PolicyScheduler.from_checkpoint(out, backend=backend)
        np.testing.assert_allclose(scorer.score(state, pod, cand), members, atol=1e-4, rtol=0)
    _, meta, _ = load_checkpoint(out)
    assert "evidence" not in meta and not gate(meta, "web").active  # judged on its own evidence only
    assert meta["ensemble"]["size"] == 3
    assert [m["checkpoint"] for m in meta["ensemble"]["members"]] == [str(p) for p in paths]
    assert [m["recipe"] for m in meta["ensemble"]["members"]] == [f"train m{i}.pt" for i in range(3)]
    assert meta["data_hash"] == "h0+h1+h2+shared"
    assert meta["typical_pods"] == typical_to_dict(typical) and meta["operating_mode"] == "online"
    assert meta["algorithm"] == "credit-ensemble3" and meta["recipe"].endswith(" ".join(map(str, paths)))


def test_merge_refusals(cluster, tmp_path):
    _, _, typical = cluster
    a = save(tmp_path / "a.pt", member(1), typical)
    b = save(tmp_path / "b.pt", member(2), typical)
    copy = tmp_path / "copy.pt"
    copy.write_bytes(a.read_bytes())
    other_typical = TypicalPods(**{**typical.__dict__, "freq": typical.freq[::-1].copy()})
    cases = {
        "at least two": [a],
        "same weights as": [a, b, copy],
        "'scoring' differs": [a, save(tmp_path / "k.pt", member(3), typical, kube_weight=0)],
        "'typical_pods' differs": [a, save(tmp_path / "t.pt", member(4), other_typical)],
        "'operating_mode' differs": [a, save(tmp_path / "o.pt", member(5), typical, mode="packing")],
        "shape": [a, save(tmp_path / "w.pt", member(6, hidden=4), typical)],
        "only node-scoring": [a, save(tmp_path / "td3.pt", WeightPolicy(), typical)],
        "no such checkpoint": [a, tmp_path / "missing.pt"],
    }
    for match, paths in cases.items():
        with pytest.raises(ValueError, match=match):
            merge_checkpoints(paths, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def test_cli(cluster, tmp_path, capsys):
    _, _, typical = cluster
    a = save(tmp_path / "a.pt", member(1), typical)
    b = save(tmp_path / "b.pt", member(2), typical)
    assert main(["--out", str(tmp_path / "e.pt"), str(a), str(b)]) == 0
    assert "the mean of 2 policies" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "e.pt")[0].cfg.hidden == 16
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "f.pt"), str(a), str(a)])
    assert e.value.code == 2
    assert "same weights as" in capsys.readouterr().err and not (tmp_path / "f.pt").exists()
