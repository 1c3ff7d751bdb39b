"""The node-scoring policy: size independence, equivariance, masking, scorer adapter, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.learning.checkpoint import (
    CheckpointError,
    data_hash,
    load_checkpoint,
    save_checkpoint,
    typical_from_dict,
)
from fedsched.common.learning.features import (
    CONTEXT_FEATURES,
    FEATURE_SCHEMA_VERSION,
    NODE_FEATURES,
    POD_FEATURES,
    FeatureBuilder,
)
from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.cluster import MILLI_PER_GPU, ClusterState, Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import make_scheduler
from fedsched.common.schedulers.base import default_gpu_choice
from tests.builders import first_fit_state

N_F, N_P, N_C = len(NODE_FEATURES), len(POD_FEATURES), len(CONTEXT_FEATURES)


def make_policy(seed: int = 0, hidden: int = 32) -> NodeScoringPolicy:
    torch.manual_seed(seed)
    return NodeScoringPolicy(PolicyConfig(hidden=hidden)).eval()


def random_inputs(n: int, seed: int, batch: int = 1, p_mask: float = 0.7):
    g = torch.Generator().manual_seed(seed)
    nodes = torch.randn(batch, n, N_F, generator=g)
    pod = torch.rand(batch, N_P, generator=g)
    ctx = torch.rand(batch, N_C, generator=g)
    mask = torch.rand(batch, n, generator=g) < p_mask
    mask[:, 0] = True  # at least one feasible node
    return nodes, pod, ctx, mask


def run(policy, nodes, pod, ctx, mask):
    with torch.no_grad():
        return policy(nodes, pod, ctx, mask)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def gpu_cluster():
    nodes, pods = generate_cluster("gpu", 4, n_nodes=16, n_pods=120, share_fraction=0.6)
    return nodes, pods, TypicalPods.from_pods(pods)


# ---- size independence ------------------------------------------------------------------------

def n_params(policy: NodeScoringPolicy) -> int:
    return sum(p.numel() for p in policy.parameters())


def test_parameters_do_not_depend_on_cluster_size():
    policy = make_policy()
    before = {k: v.shape for k, v in policy.state_dict().items()}
    count = n_params(policy)
    for n in (1, 10, 1500):
        logits, value = run(policy, *random_inputs(n, seed=n))
        assert logits.shape == (1, n) and value.shape == (1,)
    assert n_params(policy) == count
    assert {k: v.shape for k, v in policy.state_dict().items()} == before
    # The network's only shape inputs are the feature counts and the width.
    assert n_params(NodeScoringPolicy(PolicyConfig(hidden=32))) == count


def test_same_weights_score_10_and_1500_node_clusters():
    policy = make_policy()
    for n_nodes, seed in ((10, 1), (1500, 2)):
        nodes, pods = generate_cluster("gpu", seed, n_nodes=n_nodes, n_pods=max(50, n_nodes // 10))
        fb = FeatureBuilder(TypicalPods.from_pods(pods))
        state = ClusterState(nodes)
        pod = Pod.from_table(pods, 0)
        cand = np.flatnonzero(state.feasible(pod))
        assert len(cand) > 0
        f = fb.build(state, pod, cand)
        logits, value = run(policy, torch.from_numpy(f.nodes)[None], torch.from_numpy(f.pod)[None],
                            torch.from_numpy(f.context)[None], torch.ones(1, len(cand), dtype=torch.bool))
        assert logits.shape == (1, len(cand))
        assert torch.isfinite(logits).all() and torch.isfinite(value).all()


# ---- equivariance, masking, padding ------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3))
def test_permutation_equivariance(n, seed, batch):
    policy = make_policy(seed % 7)
    nodes, pod, ctx, mask = random_inputs(n, seed, batch)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    logits, value = run(policy, nodes, pod, ctx, mask)
    logits_p, value_p = run(policy, nodes[:, perm], pod, ctx, mask[:, perm])
    torch.testing.assert_close(logits_p, logits[:, perm], atol=1e-5, rtol=0)
    torch.testing.assert_close(value_p, value, atol=1e-5, rtol=0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), pad=st.integers(1, 30), seed=st.integers(0, 2**31 - 1),
       garbage=st.booleans())
def test_masking_and_padding(n, pad, seed, garbage):
    policy = make_policy(seed % 5)
    nodes, pod, ctx, mask = random_inputs(n, seed)
    logits, value = run(policy, nodes, pod, ctx, mask)
    assert (logits[~mask] <= -1e8).all()
    assert torch.isfinite(logits[mask]).all() and (logits[mask] > -1e8).all()
    # Padding rows (masked) must not change anything, whatever they contain.
    g = torch.Generator().manual_seed(seed + 1)
    extra = 50 * torch.randn(1, pad, N_F, generator=g) if garbage else torch.zeros(1, pad, N_F)
    nodes_p = torch.cat([nodes, extra], dim=1)
    mask_p = torch.cat([mask, torch.zeros(1, pad, dtype=torch.bool)], dim=1)
    logits_p, value_p = run(policy, nodes_p, pod, ctx, mask_p)
    torch.testing.assert_close(logits_p[:, :n], logits, atol=1e-5, rtol=0)
    assert (logits_p[:, n:] <= -1e8).all()
    torch.testing.assert_close(value_p, value, atol=1e-5, rtol=0)


def test_masked_node_features_do_not_matter():
    policy = make_policy()
    nodes, pod, ctx, mask = random_inputs(12, 3)
    mask[0, 5] = False
    changed = nodes.clone()
    changed[0, 5] = 1000.0
    torch.testing.assert_close(run(policy, changed, pod, ctx, mask), run(policy, nodes, pod, ctx, mask))


def test_all_masked_input_stays_finite():
    policy = make_policy()
    nodes, pod, ctx, _ = random_inputs(6, 4)
    logits, value = run(policy, nodes, pod, ctx, torch.zeros(1, 6, dtype=torch.bool))
    assert not torch.isnan(logits).any() and torch.isfinite(value).all()


# ---- the scorer adapter ----------------------------------------------------------------------

def test_policy_scheduler_scores_every_candidate(gpu_cluster):
    nodes, pods, typical = gpu_cluster
    sched = PolicyScheduler(make_policy(), typical)
    state = first_fit_state(nodes, pods, 40)
    n_scored = 0
    for i in range(40, 80):
        pod = Pod.from_table(pods, i)
        cand = np.flatnonzero(state.feasible(pod))
        if len(cand) == 0:
            continue
        scores = sched.score(state, pod, cand)
        assert isinstance(scores, np.ndarray) and scores.shape == (len(cand),)
        assert np.isfinite(scores).all()
        n_scored += 1
    assert n_scored > 10


def test_policy_scheduler_scores_are_the_policy_logits(gpu_cluster):
    """The scorer's inference path computes the same function as ``forward``, also after the
    weights change in place (a training step)."""
    nodes, pods, typical = gpu_cluster
    policy = make_policy(2)
    sched = PolicyScheduler(policy, typical)
    state = first_fit_state(nodes, pods, 40)
    pod = Pod.from_table(pods, 60)
    cand = np.flatnonzero(state.feasible(pod))
    f = FeatureBuilder(typical).build(state, pod, cand)

    def forward_logits() -> np.ndarray:
        logits, _ = run(policy, torch.from_numpy(f.nodes)[None], torch.from_numpy(f.pod)[None],
                        torch.from_numpy(f.context)[None], torch.ones(1, len(cand), dtype=torch.bool))
        return logits[0].double().numpy()

    before = sched.score(state, pod, cand)
    np.testing.assert_allclose(before, forward_logits(), atol=1e-5, rtol=0)
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    policy(*random_inputs(8, 1))[0].sum().backward()
    opt.step()
    after = sched.score(state, pod, cand)
    assert not np.allclose(after, before)
    np.testing.assert_allclose(after, forward_logits(), atol=1e-5, rtol=0)


def test_policy_scheduler_select_gpus_for_sharing_pods(gpu_cluster):
    nodes, pods, typical = gpu_cluster
    sched = PolicyScheduler(make_policy(), typical)
    state = first_fit_state(nodes, pods, 40)
    share = [i for i in range(len(pods)) if Pod.from_table(pods, i).is_gpu_share]
    assert share
    checked = 0
    for i in share[:15]:
        pod = Pod.from_table(pods, i)
        for node in np.flatnonzero(state.feasible(pod)):
            gpus = sched.select_gpus(state, pod, int(node))
            assert len(gpus) == 1
            g = gpus[0]
            assert 0 <= g < nodes.gpu[node]
            assert state.gpu_free[node, g] >= pod.gpu_milli
            copy = state.copy()
            copy.allocate(int(node), pod, gpus)  # raises if over-allocated
            assert copy.gpu_free[node, g] == state.gpu_free[node, g] - pod.gpu_milli
            checked += 1
    assert checked > 0
    # Whole-GPU and CPU pods keep the default rule.
    whole = next(i for i in range(len(pods)) if pods.num_gpu[i] >= 1 and pods.gpu_milli[i] == MILLI_PER_GPU)
    pod = Pod.from_table(pods, whole)
    node = int(np.flatnonzero(state.feasible(pod))[0])
    assert sched.select_gpus(state, pod, node) == default_gpu_choice(state, pod, node)


# ---- checkpoints --------------------------------------------------------------------------------

@pytest.fixture
def checkpoint(tmp_path, gpu_cluster):
    _, pods, typical = gpu_cluster
    policy = make_policy(3, hidden=24)
    path = save_checkpoint(tmp_path / "run" / "checkpoint.pt", policy, algorithm="ppo",
                           hyperparameters={"learning_rate": 1e-3, "num_steps": 64},
                           typical=typical, data=data_hash(pods), extra={"global_step": 128})
    return path, policy, typical, data_hash(pods)


def test_checkpoint_round_trip(checkpoint):
    path, policy, typical, dh = checkpoint
    assert path.exists() and not path.with_suffix(".pt.tmp").exists()
    loaded, meta, opt = load_checkpoint(path)
    assert opt is None
    assert not loaded.training
    assert loaded.cfg == policy.cfg
    inputs = random_inputs(30, 9, batch=2)
    for a, b in zip(run(policy, *inputs), run(loaded, *inputs), strict=True):
        assert torch.equal(a, b)
    assert meta["feature_schema"] == FEATURE_SCHEMA_VERSION
    assert meta["node_features"] == list(NODE_FEATURES)
    assert meta["pod_features"] == list(POD_FEATURES)
    assert meta["context_features"] == list(CONTEXT_FEATURES)
    assert meta["algorithm"] == "ppo"
    assert meta["hyperparameters"] == {"learning_rate": 1e-3, "num_steps": 64}
    assert meta["data_hash"] == dh and meta["global_step"] == 128
    back = typical_from_dict(meta["typical_pods"])
    for k in ("cpu", "gpu_milli", "num_gpu", "spec_mask", "freq"):
        np.testing.assert_array_equal(getattr(back, k), getattr(typical, k))
        assert getattr(back, k).dtype == getattr(typical, k).dtype


def test_checkpoint_keeps_optimizer_state(tmp_path):
    policy = make_policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    policy(*random_inputs(5, 0))[0].sum().backward()
    opt.step()
    path = save_checkpoint(tmp_path / "c.pt", policy, algorithm="ppo", hyperparameters={}, typical=None,
                           data="x", optimizer={"optimizer": opt.state_dict(), "update": 3})
    _, meta, state = load_checkpoint(path)
    assert meta["typical_pods"] is None and state["update"] == 3
    opt2 = torch.optim.Adam(make_policy(1).parameters(), lr=1e-3)
    opt2.load_state_dict(state["optimizer"])


def test_checkpoint_with_other_feature_schema_is_refused(checkpoint, tmp_path):
    path = checkpoint[0]
    blob = torch.load(path, weights_only=True)
    other = FEATURE_SCHEMA_VERSION + 41
    blob["meta"]["feature_schema"] = other
    bad = tmp_path / "old.pt"
    torch.save(blob, bad)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bad)
    msg = str(err.value)
    assert f"schema {other}" in msg and f"schema {FEATURE_SCHEMA_VERSION}" in msg
    assert str(bad) in msg


def test_checkpoint_with_other_node_features_is_refused(checkpoint, tmp_path):
    blob = torch.load(checkpoint[0], weights_only=True)
    blob["meta"]["node_features"] = blob["meta"]["node_features"][:-1]
    bad = tmp_path / "renamed.pt"
    torch.save(blob, bad)
    with pytest.raises(CheckpointError, match="feature schema"):
        load_checkpoint(bad)


def test_random_bytes_checkpoint_is_refused(tmp_path):
    bad = tmp_path / "noise.pt"
    bad.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(CheckpointError, match=r"noise\.pt"):
        load_checkpoint(bad)


def test_missing_checkpoint_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "absent.pt")


def test_torch_file_without_metadata_is_refused(tmp_path):
    bad = tmp_path / "weights.pt"
    torch.save(make_policy().state_dict(), bad)
    with pytest.raises(CheckpointError, match="metadata"):
        load_checkpoint(bad)


def test_make_scheduler_resolves_checkpoint_path(checkpoint, gpu_cluster):
    path, policy, typical, _ = checkpoint
    nodes, pods, _ = gpu_cluster
    sched = make_scheduler(str(path))
    assert isinstance(sched, PolicyScheduler)
    assert sched.name == str(path)
    state = first_fit_state(nodes, pods, 40)
    pod = Pod.from_table(pods, 50)
    cand = np.flatnonzero(state.feasible(pod))
    expected = PolicyScheduler(policy, typical).score(state, pod, cand)
    np.testing.assert_array_equal(sched.score(state, pod, cand), expected)


def test_make_scheduler_with_missing_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(CheckpointError):
        make_scheduler(str(tmp_path / "absent.pt"))
    with pytest.raises(ValueError, match="unknown policy"):
        make_scheduler("no-such-policy")
