"""A cluster with 70 GPU models (issue 26, item 6). A pod's model constraint is an int64 bit mask
over the cluster's models in fedsched's cluster model, so the agent tells 63 models apart (bits
0..62): a pod naming one of them fits exactly the nodes of that model, a pod naming a model no node
has fits nowhere (the old "fits nowhere" marker was bit 62, model 62's own), a pod naming a model
past the 63rd gets a clear error naming the limit (it was an OverflowError), and every other pod
is served on every node, whatever their models."""

from __future__ import annotations

import pytest

from bench.harness.extender_client import metric
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import (
    GPU_MODEL_ANNOTATION,
    MAX_GPU_MODELS,
    ObjectError,
    pod_to_json,
)
from fedsched.common.model.cluster import Pod
from tests.extender_support import running

N_MODELS = 70
MODELS = [f"gpu-{k:02d}" for k in range(N_MODELS)]  # sorted by name: model k has index k


def _node(k: int) -> dict:
    alloc = {"cpu": "64000m", "memory": "262144Mi", "pods": "110", "nvidia.com/gpu": "8"}
    return {"metadata": {"name": f"n{k:02d}", "labels": {"nvidia.com/gpu.product": MODELS[k]}},
            "spec": {}, "status": {"allocatable": alloc, "capacity": dict(alloc),
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.fixture
def cache() -> ClusterCache:
    c = ClusterCache()
    c.replace_all([_node(k) for k in range(N_MODELS)], [])
    return c


def _pod(models: str | None, uid: str = "u") -> dict:
    obj = pod_to_json(Pod(-1, 1000, 1024, 1, 1000, 0, 1), f"p-{uid}", uid=uid)
    if models is not None:
        obj["metadata"].setdefault("annotations", {})[GPU_MODEL_ANNOTATION] = models
    return obj


def _fits(cache: ClusterCache, models: str | None) -> list[str]:
    pod = cache.pod(_pod(models))
    return [cache.table.names[i] for i in cache.state.feasible(pod).nonzero()[0]]


def test_seventy_models_are_held_and_a_pod_fits_exactly_the_nodes_of_its_model(cache) -> None:
    assert len(cache.table.models) == N_MODELS
    assert _fits(cache, None) == [f"n{k:02d}" for k in range(N_MODELS)]
    for k in (0, 5, 61, 62):
        assert _fits(cache, MODELS[k]) == [f"n{k:02d}"]
    assert _fits(cache, f"{MODELS[3]},{MODELS[62]}") == ["n03", "n62"]


def test_a_pod_naming_a_model_no_node_has_fits_nowhere(cache) -> None:
    assert _fits(cache, "no-such-model") == []  # the old marker, bit 62, fitted model 62's node


def test_a_pod_naming_a_model_past_the_limit_gets_a_clear_error(cache) -> None:
    for k in (MAX_GPU_MODELS, N_MODELS - 1):
        with pytest.raises(ObjectError, match=f"{MAX_GPU_MODELS} GPU models"):
            cache.pod(_pod(MODELS[k]))


def test_the_extender_on_seventy_models(cache) -> None:
    names = list(cache.table.names)
    with running(cache) as (_server, c):
        status, out = c.post("filter", {"Pod": _pod(MODELS[62]), "NodeNames": names})
        assert status == 200 and out["NodeNames"] == ["n62"] and not out["Error"]
        status, out = c.post("filter", {"Pod": _pod("no-such-model"), "NodeNames": names})
        assert status == 200 and out["NodeNames"] == [] and not out["Error"]
        status, out = c.post("filter", {"Pod": _pod(None), "NodeNames": names})
        assert status == 200 and out["NodeNames"] == names
        status, out = c.post("filter", {"Pod": _pod(MODELS[69]), "NodeNames": names})
        assert status == 400 and f"{MAX_GPU_MODELS} GPU models" in out["Error"]
        status, out = c.post("prioritize", {"Pod": _pod(MODELS[69]), "NodeNames": names})
        assert status == 400 and f"{MAX_GPU_MODELS} GPU models" in out["Error"]
        text = c.get("/metrics")[1]
    assert metric(text, "fedsched_fallbacks_total", reason="internal") == 0
