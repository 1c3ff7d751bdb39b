"""ONNX export of the policy: parity with torch and numpy, schema checks, the CLI, backend choice.

Tolerance: the three backends evaluate the same float32 network with different kernels
(torch's sgemm, onnxruntime's MLAS, numpy's BLAS), which sum in different orders. Float32
rounding is ~6e-8 relative per operation; four layers of width <= 64 with contractive tanh
keep the logit differences around 1e-5 (measured max ~2e-5 on 2000 nodes, whose mean pool
sums 2000 terms; logits reach ~12 in magnitude). ``ATOL = RTOL = 1e-4`` leaves a wide margin
for other CPUs and kernel choices while still catching any real difference in the function
(a wrong mask, pooling or layer changes logits by far more than 1e-3).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from fedsched.cli.main import main
from fedsched.common.learning.checkpoint import load_checkpoint, save_checkpoint, typical_from_dict
from fedsched.common.learning.features import (
    CONTEXT_FEATURES,
    FEATURE_SCHEMA_VERSION,
    NODE_FEATURES,
    POD_FEATURES,
    FeatureBuilder,
)
from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig
from fedsched.common.learning.onnx import PREFIX, OnnxSchemaError, OnnxScorer, export_onnx
from fedsched.common.learning.scorers import BACKENDS, PolicyScheduler
from fedsched.common.model.cluster import ClusterState, NodeTable, Pod
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import default_policy_path
from fedsched.common.schedulers.base import default_gpu_choice

ATOL = RTOL = 1e-4
N_F, N_P, N_C = len(NODE_FEATURES), len(POD_FEATURES), len(CONTEXT_FEATURES)
SIZES = (10, 100, 500, 2000)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def shipped():
    """(policy, metadata, OnnxScorer of its export)."""
    policy, meta, _ = load_checkpoint(default_policy_path())
    return policy, meta


@pytest.fixture(scope="module")
def shipped_onnx(shipped, tmp_path_factory):
    policy, meta = shipped
    return export_onnx(policy, tmp_path_factory.mktemp("onnx") / "shipped.onnx", meta=meta)


def torch_logits(policy: NodeScoringPolicy, nodes, pod, ctx) -> np.ndarray:
    with torch.inference_mode():
        logits, _ = policy(torch.from_numpy(nodes)[None], torch.from_numpy(pod)[None],
                           torch.from_numpy(ctx)[None], torch.ones(1, len(nodes), dtype=torch.bool))
    return logits[0].numpy()


def assert_parity(policy: NodeScoringPolicy, scorer: OnnxScorer, nodes, pod, ctx) -> None:
    ref = policy.score_numpy(nodes, pod, ctx)
    out = scorer.logits(nodes, pod, ctx)
    assert out.shape == (len(nodes),) and out.dtype == np.float32
    np.testing.assert_allclose(out, torch_logits(policy, nodes, pod, ctx), atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(out, ref, atol=ATOL, rtol=RTOL)
    # the decision: the node ONNX picks is a best node for numpy too (up to the tolerance)
    assert ref[int(np.argmax(out))] >= ref.max() - ATOL


# ---- parity ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7, *SIZES])
def test_parity_random_inputs(shipped, shipped_onnx, n):
    rng = np.random.default_rng(n)
    scorer = OnnxScorer(shipped_onnx)
    for scale in (1.0, 5.0):  # feature range and well outside it
        nodes = (scale * rng.standard_normal((n, N_F))).astype(np.float32)
        pod, ctx = rng.random(N_P, dtype=np.float32), rng.random(N_C, dtype=np.float32)
        assert_parity(shipped[0], scorer, nodes, pod, ctx)


def test_parity_other_width(tmp_path):
    torch.manual_seed(3)
    policy = NodeScoringPolicy(PolicyConfig(hidden=32)).eval()
    scorer = OnnxScorer(export_onnx(policy, tmp_path / "p.onnx"))
    rng = np.random.default_rng(0)
    nodes = rng.random((300, N_F), dtype=np.float32)
    assert_parity(policy, scorer, nodes, rng.random(N_P, dtype=np.float32), rng.random(N_C, dtype=np.float32))


def openb_slice(base: NodeTable, n: int, rng: np.random.Generator) -> NodeTable:
    t = base.select(np.sort(rng.choice(len(base), n, replace=n > len(base))))
    return NodeTable(names=tuple(f"n{i}" for i in range(n)), cpu=t.cpu, mem=t.mem, gpu=t.gpu,
                     model=t.model, models=t.models, disk_io=t.disk_io, net=t.net)


def filled_state(nodes: NodeTable, pods, rng: np.random.Generator) -> ClusterState:
    """Bind up to three pods per node at random feasible nodes: mixed free/used/fragmented nodes."""
    state = ClusterState(nodes)
    for _ in range(3 * len(nodes)):
        pod = Pod.from_table(pods, int(rng.integers(len(pods))))
        fits = np.flatnonzero(state.feasible(pod))
        if len(fits):
            node = int(rng.choice(fits))
            state.allocate(node, pod, default_gpu_choice(state, pod, node))
    return state


@pytest.mark.parametrize("source", ["openb", "gpu", "web"])
@pytest.mark.parametrize("n", SIZES)
def test_parity_real_features(shipped, shipped_onnx, openb_gpu_nodes, openb_default_pods, source, n):
    policy, meta = shipped
    rng = np.random.default_rng(n)
    if source == "openb":
        nodes, pods = openb_slice(openb_gpu_nodes, n, rng), openb_default_pods
    else:
        nodes, pods = generate_cluster(source, n, n_nodes=n, n_pods=max(200, n))
    state = filled_state(nodes, pods, rng)
    features = FeatureBuilder(typical_from_dict(meta.get("typical_pods")))
    scorer = OnnxScorer(shipped_onnx)
    for _ in range(4):
        pod = Pod.from_table(pods, int(rng.integers(len(pods))))
        feasible = np.flatnonzero(state.feasible(pod))
        for cand in (np.arange(n), feasible):  # every node (worst case) and the real candidates
            if len(cand):
                f = features.build(state, pod, cand)
                assert_parity(policy, scorer, f.nodes, f.pod, f.context)


# ---- metadata and schema checks ---------------------------------------------------------------

def test_metadata(shipped, shipped_onnx):
    _, meta = shipped
    m = OnnxScorer(shipped_onnx).metadata
    assert m["feature_schema"] == FEATURE_SCHEMA_VERSION
    assert m["node_features"] == list(NODE_FEATURES)
    assert m["pod_features"] == list(POD_FEATURES)
    assert m["context_features"] == list(CONTEXT_FEATURES)
    for key in ("algorithm", "data_hash", "typical_pods", "policy"):
        assert m[key] == meta[key]


def rewrite_props(src, dst, **changes) -> None:
    """Copy an ONNX model with some fedsched metadata changed (None: removed)."""
    model = onnx.load(src)
    props = {p.key: p.value for p in model.metadata_props}
    for key, value in changes.items():
        if value is None:
            props.pop(PREFIX + key)
        else:
            props[PREFIX + key] = json.dumps(value)
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, props)
    onnx.save(model, dst)


@pytest.mark.parametrize(("changes", "match"), [
    ({"feature_schema": FEATURE_SCHEMA_VERSION + 1}, f"feature schema {FEATURE_SCHEMA_VERSION + 1}"),
    ({"node_features": list(NODE_FEATURES[:-1])}, f"this fedsched uses schema {FEATURE_SCHEMA_VERSION}"),
    ({"context_features": ["x"] * N_C}, "re-export"),
    ({"feature_schema": None}, "not a fedsched policy"),
])
def test_schema_mismatch(shipped_onnx, tmp_path, changes, match):
    bad = tmp_path / "bad.onnx"
    rewrite_props(shipped_onnx, bad, **changes)
    with pytest.raises(OnnxSchemaError, match=match):
        OnnxScorer(bad)


def test_unreadable_and_missing(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(OnnxSchemaError, match="not a readable ONNX model"):
        OnnxScorer(junk)
    with pytest.raises(FileNotFoundError):
        OnnxScorer(tmp_path / "missing.onnx")


def test_export_refuses_other_input_sizes(tmp_path):
    with pytest.raises(OnnxSchemaError, match="do not match"):
        export_onnx(NodeScoringPolicy(PolicyConfig(n_node=N_F - 1)), tmp_path / "p.onnx")


# ---- CLI -------------------------------------------------------------------------------------

def test_cli_shipped_policy(tmp_path, capsys, shipped):
    out = tmp_path / "sub" / "learned.onnx"
    assert main(["export", "--policy", "learned", "--onnx", str(out)]) == 0
    text = capsys.readouterr().out
    assert str(out) in text and "KiB" in text and "parity vs torch" in text and "(ok," in text
    scorer = OnnxScorer(out)
    assert scorer.metadata["algorithm"] == shipped[1]["algorithm"]
    rng = np.random.default_rng(1)
    nodes, pod, ctx = (rng.random(s, dtype=np.float32) for s in ((50, N_F), N_P, N_C))
    assert_parity(shipped[0], scorer, nodes, pod, ctx)


def test_cli_shipped_online_policy_carries_its_scoring_options(tmp_path, capsys):
    """Any shipped name exports; the online policy's kube weight travels in the model's
    properties and is named on the console (the ONNX holds the logits alone)."""
    out = tmp_path / "online.onnx"
    assert main(["export", "--policy", "learned-online", "--onnx", str(out)]) == 0
    text = capsys.readouterr().out
    assert "note: the model holds the network's logits" in text and "'kube_weight': 2.0" in text
    assert OnnxScorer(out).metadata["scoring"] == {"kube_weight": 2.0}


def test_cli_checkpoint_path_and_errors(tmp_path, capsys):
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "c.pt", NodeScoringPolicy(PolicyConfig(hidden=16)), algorithm="ppo",
                           hyperparameters={}, typical=None, data="x")
    out = tmp_path / "c.onnx"
    assert main(["export", "--policy", str(ckpt), "--onnx", str(out)]) == 0
    assert OnnxScorer(out).metadata["algorithm"] == "ppo"
    capsys.readouterr()
    assert main(["export", "--policy", str(tmp_path / "none.pt"), "--onnx", str(out)]) == 2
    assert "no such checkpoint" in capsys.readouterr().err


# ---- backend choice --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scoring_case(openb_gpu_nodes, openb_default_pods):
    rng = np.random.default_rng(7)
    state = filled_state(openb_slice(openb_gpu_nodes, 300, rng), openb_default_pods, rng)
    pods = [Pod.from_table(openb_default_pods, int(i)) for i in rng.integers(len(openb_default_pods), size=5)]
    return state, pods


def assert_same_scores(sched: PolicyScheduler, ref: PolicyScheduler, case) -> None:
    state, pods = case
    for pod in pods:
        for cand in (np.arange(len(state.nodes)), np.flatnonzero(state.feasible(pod))):
            got, want = sched.score(state, pod, cand), ref.score(state, pod, cand)
            assert got.dtype == np.float64 and got.shape == (len(cand),)
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


def test_default_backend_is_numpy_and_untimed():
    sched = PolicyScheduler.from_checkpoint(default_policy_path())
    assert sched.backend == "numpy" and sched.backend_timings == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_scores_like_numpy(backend, scoring_case):
    ref = PolicyScheduler.from_checkpoint(default_policy_path())
    sched = PolicyScheduler.from_checkpoint(default_policy_path(), backend=backend)
    assert sched.backend == backend
    assert_same_scores(sched, ref, scoring_case)
    empty = sched.logits(np.zeros((0, N_F), np.float32), np.zeros(N_P, np.float32), np.zeros(N_C, np.float32))
    assert empty.shape == (0,)


def test_auto_backend(scoring_case):
    sched = PolicyScheduler.from_checkpoint(default_policy_path(), backend="auto")
    assert sched.backend in BACKENDS
    assert set(sched.backend_timings) == set(BACKENDS)  # onnxruntime is installed here
    assert all(t > 0 for t in sched.backend_timings.values())
    assert sched.backend == min(sched.backend_timings, key=sched.backend_timings.__getitem__)
    assert_same_scores(sched, PolicyScheduler.from_checkpoint(default_policy_path()), scoring_case)


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'"):
        PolicyScheduler.from_checkpoint(default_policy_path(), backend="tensorrt")
