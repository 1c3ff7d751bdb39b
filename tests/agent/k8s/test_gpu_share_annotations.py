"""GPU-share annotations on pods as manifests generated from the openb trace carry them.

The openb trace's ``gpu_milli`` column is 0 on CPU-only pods, so manifests written from it carry
``alibabacloud.com/gpu-milli: "0"`` (often with ``alibabacloud.com/gpu-count: "0"``) on pods that
ask for no GPU at all. The agent read 0 as out of range (1..1000): the extender answered such a
pod with a 400 (kube-scheduler, with ``ignorable: true``, then scheduled it without fedsched) and
the cache's watch dropped it, so a running CPU pod never counted on its node.
"""

from __future__ import annotations

import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import (
    GPU_COUNT_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    ObjectError,
    node_to_json,
    pod_from_json,
)
from tests.builders import make_nodes


def pod(annotations: dict[str, str], requests: dict[str, str] | None = None, node: str | None = None) -> dict:
    requests = {"cpu": "4", "memory": "8Gi", **(requests or {})}
    limits = {k: v for k, v in requests.items() if k == "nvidia.com/gpu"}
    spec: dict = {"schedulerName": "fedsched",
                  "containers": [{"name": "main", "resources": {"requests": requests, "limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u-1", "annotations": annotations},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


@pytest.mark.parametrize("annotations", [
    {GPU_MILLI_ANNOTATION: "0"},
    {GPU_MILLI_ANNOTATION: "0", GPU_COUNT_ANNOTATION: "0"},
    {GPU_MILLI_ANNOTATION: " 0 ", GPU_COUNT_ANNOTATION: "1"},
    {GPU_COUNT_ANNOTATION: "0"},
])
def test_a_cpu_pod_with_a_zero_gpu_share_is_a_cpu_pod(annotations: dict[str, str]) -> None:
    p = pod_from_json(pod(annotations))
    assert (p.cpu, p.mem, p.num_gpu, p.gpu_milli, p.spec_mask) == (4000, 8192, 0, 0, 0)


def test_a_zero_share_leaves_whole_gpus_from_the_extended_resource() -> None:
    p = pod_from_json(pod({GPU_MILLI_ANNOTATION: "0", GPU_COUNT_ANNOTATION: "0"}, {"nvidia.com/gpu": "2"}))
    assert (p.num_gpu, p.gpu_milli) == (2, 1000)


@pytest.mark.parametrize(("milli", "count", "want"), [("250", None, (1, 250)), ("1000", "2", (2, 1000)),
                                                      ("500", "0", (0, 0))])
def test_real_shares_still_read_as_before(milli: str, count: str | None, want: tuple[int, int]) -> None:
    ann = {GPU_MILLI_ANNOTATION: milli, **({GPU_COUNT_ANNOTATION: count} if count is not None else {})}
    p = pod_from_json(pod(ann))
    assert (p.num_gpu, p.gpu_milli) == want


@pytest.mark.parametrize("milli", ["-1", "1001", "half"])
def test_shares_outside_0_to_1000_are_still_refused(milli: str) -> None:
    with pytest.raises(ObjectError, match="gpu-milli"):
        pod_from_json(pod({GPU_MILLI_ANNOTATION: milli}))


def test_the_cache_counts_a_bound_cpu_pod_with_a_zero_share() -> None:
    nodes = make_nodes([32000], [65536], [0])
    cache = ClusterCache()
    cache.replace_all([node_to_json(nodes, 0)], [pod({GPU_MILLI_ANNOTATION: "0", GPU_COUNT_ANNOTATION: "0"},
                                                     node="n0")])
    assert cache.rejected_objects == 0
    assert list(cache.pods) == ["u-1"]
    assert (int(cache.state.cpu_req[0]), int(cache.state.mem_req[0])) == (4000, 8192)
