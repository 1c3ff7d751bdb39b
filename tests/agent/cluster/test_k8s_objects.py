"""Kubernetes Pod/Node JSON <-> fedsched's cluster model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedsched.agent.cluster.k8s_objects import (
    ObjectError,
    node_from_json,
    node_table,
    node_to_json,
    parse_quantity,
    pod_from_json,
    pod_to_json,
)
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace, load_nodes
from tests.extender_support import payload


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", 0.5),
        ("2", 2.0),
        ("1.5", 1.5),
        ("512Mi", 512 * 2**20),
        ("1Gi", 2**30),
        ("1G", 1e9),
        ("1e3", 1000.0),
        ("100k", 1e5),
        ("0", 0.0),
        ("250u", 250e-6),
        (3, 3.0),
        (".5", 0.5),
        ("2Ki", 2048.0),
    ],
)
def test_quantities(text, value):
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", ["lots", "1.5.5", "-1", "1Q", "", None, True, [], float("nan"), "Gi"])
def test_bad_quantities_name_the_field(bad):
    with pytest.raises(ObjectError, match="cpu"):
        parse_quantity(bad, "cpu")


def test_payload_pod_reads_as_its_requests():
    pod = pod_from_json(payload("01-filter-request.nodecache.json")["Pod"])
    assert (pod.cpu, pod.mem, pod.num_gpu) == (500, 512, 0)
    assert pod.qos == 1  # Burstable: requests below limits


def test_pod_request_is_kube_schedulers_effective_request():
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
                {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            ],  # requests default to limits
            "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "10Mi"}}}],
            "overhead": {"cpu": "100m"},
        },
    }
    p = pod_from_json(pod)
    assert p.cpu == 2000 + 100  # the init container's 2 CPUs dominate, plus the overhead
    assert p.mem == 64 + 1024


def test_gpu_conventions():
    whole = {"metadata": {}, "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    p = pod_from_json(whole)
    assert (p.num_gpu, p.gpu_milli, p.is_gpu_share) == (2, 1000, False)
    share = {
        "metadata": {
            "annotations": {
                "alibabacloud.com/gpu-milli": "250",
                "alibabacloud.com/gpu-count": "1",
                "alibabacloud.com/gpu-card-model": "V100M16",
            }
        },
        "spec": {"containers": [{}]},
    }
    p = pod_from_json(share, models=("P100", "V100M16"))
    assert (p.num_gpu, p.gpu_milli, p.spec_mask) == (1, 250, 0b10)
    p = pod_from_json(share, models=("P100",))
    assert p.spec_mask and not (p.spec_mask & 1)  # asks for a model the cluster lacks: fits nowhere
    with pytest.raises(ObjectError, match="gpu-milli"):
        pod_from_json({"metadata": {"annotations": {"alibabacloud.com/gpu-milli": "1500"}}, "spec": {}})
    with pytest.raises(ObjectError, match="whole number"):
        pod_from_json({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}})


def test_qos_from_annotation_status_or_spec():
    def pod(**kw):
        return {
            "metadata": {"annotations": kw.get("ann", {})},
            "status": kw.get("status", {}),
            "spec": {"containers": [{"resources": kw.get("res", {})}]},
        }

    assert pod_from_json(pod(ann={"fedsched.io/qos": "LS"})).qos == 2
    assert pod_from_json(pod(status={"qosClass": "Guaranteed"})).qos == 3
    assert pod_from_json(pod()).qos == 0  # BestEffort
    same = {"cpu": "1", "memory": "1Gi"}
    assert pod_from_json(pod(res={"requests": same, "limits": same})).qos == 3
    with pytest.raises(ObjectError, match="unknown QoS"):
        pod_from_json(pod(ann={"fedsched.io/qos": "platinum"}))


def test_node_from_payload_and_gpu_node():
    node = node_from_json(payload("03-prioritize-request.full-nodes.json")["Nodes"]["items"][0])
    assert (node.name, node.cpu, node.mem, node.gpu, node.ready) == ("node-a", 8000, 32768, 0, True)
    table = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    gpu_node = next(i for i in range(len(table)) if table.gpu[i] > 0)
    info = node_from_json(node_to_json(table, gpu_node))
    assert (info.cpu, info.mem, info.gpu) == (table.cpu[gpu_node], table.mem[gpu_node], table.gpu[gpu_node])
    assert info.model == table.models[table.model[gpu_node]]
    assert node_table([info]).models == (info.model,)


@given(
    cpu=st.integers(0, 96_000),
    mem=st.integers(0, 800_000),
    kind=st.sampled_from(["cpu", "share", "whole"]),
    milli=st.integers(1, 999),
    n=st.integers(1, 8),
    qos=st.integers(0, 3),
    mask=st.integers(0, 3),
)
def test_pod_json_round_trip(cpu, mem, kind, milli, n, qos, mask):
    models = ("A100", "V100")
    num_gpu, gpu_milli = {"cpu": (0, 0), "share": (1, milli), "whole": (n, 1000)}[kind]
    pod = Pod(-1, cpu, mem, num_gpu, gpu_milli, mask if num_gpu else 0, qos)
    assert pod_from_json(pod_to_json(pod, "p", models), models) == pod
