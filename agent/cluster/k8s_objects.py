"""Kubernetes API objects (Pod and Node JSON) to fedsched's cluster model, and back.

kube-scheduler sends the pod of every extender request as Kubernetes JSON, and the agent's
cache is fed Node and Pod JSON by watches; both go through this module, so the serving path
sees a pod exactly as the simulator does (:class:`fedsched.common.model.cluster.Pod`).

Conventions (stated, because Kubernetes has no standard for shared GPUs):

- CPU in milli-cores and memory in MiB, both rounded up from the resource quantity.
- A pod's request is what kube-scheduler's ``computePodResourceRequest`` uses: the sum over
  its containers, raised to the largest init container's request, plus ``spec.overhead``.
- Whole GPUs: the extended resource ``nvidia.com/gpu`` (requests, else limits).
- Shared GPUs follow the FGD artefact (hkust-adsl/kubernetes-scheduler-simulator) and the
  openb trace: annotations ``alibabacloud.com/gpu-milli`` (per-GPU share, 1..1000; 0 asks
  for no share, as on a CPU-only pod) and ``alibabacloud.com/gpu-count``;
  ``alibabacloud.com/gpu-card-model`` restricts the GPU model (comma-separated). A node's GPU
  count comes from ``nvidia.com/gpu`` (or ``alibabacloud.com/gpu-count``) in allocatable, its
  model from the label ``nvidia.com/gpu.product`` (or ``alibabacloud.com/gpu-card-model``).
- QoS: the annotation ``fedsched.io/qos`` (BE, Burstable, LS, Guaranteed) when present,
  else ``status.qosClass``, else the class Kubernetes would compute from requests/limits.
- GPU models: a pod's model constraint is an int64 bit mask over the cluster's models (sorted by
  name) in fedsched's cluster model (``Pod.spec_mask``, read by the simulator's and kube-default's
  compiled kernels), so :data:`MAX_GPU_MODELS` (63, bits 0..62) are told apart. A cluster with more
  is held whole (:func:`bound_gpu_models`: the nodes of the models past the 63rd are kept, with no
  model index, so only pods naming none of those run there), and a pod naming one of those models
  is an :class:`ObjectError` that names the limit. A pod naming only models no node has fits
  nowhere (:data:`FITS_NOWHERE`, the sign bit, which no model index matches).

Malformed objects raise :class:`ObjectError` with the field at fault.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedsched.common.model.cluster import (
    MAX_GPUS_PER_NODE,
    MILLI_PER_GPU,
    QOS_ALIASES,
    QOS_CLASSES,
    NodeTable,
    Pod,
)
from fedsched.common.model.traces import DEFAULT_DISK_IO_MBPS, DEFAULT_NET_MBPS

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MILLI_ANNOTATION = "alibabacloud.com/gpu-milli"
GPU_COUNT_ANNOTATION = "alibabacloud.com/gpu-count"
GPU_MODEL_ANNOTATION = "alibabacloud.com/gpu-card-model"
GPU_MODEL_LABELS = ("nvidia.com/gpu.product", GPU_MODEL_ANNOTATION)
QOS_ANNOTATION = "fedsched.io/qos"
MIB = 1024 * 1024

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    None: 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


#: GPU models a pod's model constraint can name: its int64 mask's bits 0..62 (module doc).
MAX_GPU_MODELS = 63
#: The model mask of a pod naming only models no node has: the sign bit alone, which no model
#: index 0..62 matches (``(mask >> m) & 1 == 0``, in Python as in int64), and non-zero (constrained).
FITS_NOWHERE = -(1 << 63)


class ObjectError(ValueError):
    """A Kubernetes object this agent cannot read (the message names the field)."""


MAX_AMOUNT = 2**50  # milli-CPU or MiB: far past any machine, and safe in int64 sums


def _bounded(value: int | None, where: str) -> int:
    if value is None or value > MAX_AMOUNT:
        raise ObjectError(f"{where}: larger than any node could hold")
    return int(value)


def parse_quantity(value: Any, where: str = "quantity") -> float:
    """A Kubernetes resource.Quantity ("500m", "1.5Gi", "2", "1e3", or a bare number)."""
    if isinstance(value, bool):
        raise ObjectError(f"{where}: expected a quantity, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ObjectError(f"{where}: expected a non-negative quantity, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ObjectError(f"{where}: expected a quantity string, got {type(value).__name__}")
    m = _QUANTITY.match(value.strip())
    if not m:
        raise ObjectError(f"{where}: {value!r} is not a Kubernetes quantity")
    q = float(m.group(1)) * _SUFFIX[m.group(2)]
    if not math.isfinite(q) or q < 0:
        raise ObjectError(f"{where}: {value!r} must be a finite non-negative quantity")
    return q


def _dict(obj: Any, where: str) -> dict:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise ObjectError(f"{where}: expected an object, got {type(obj).__name__}")
    return obj


def _list(obj: Any, where: str) -> list:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise ObjectError(f"{where}: expected a list, got {type(obj).__name__}")
    return obj


def _resources(container: dict, where: str) -> dict[str, float]:
    """A container's effective requests (requests, defaulted from limits as the API server does)."""
    res = _dict(container.get("resources"), f"{where}.resources")
    limits = _dict(res.get("limits"), f"{where}.resources.limits")
    requests = {**limits, **_dict(res.get("requests"), f"{where}.resources.requests")}
    return {k: parse_quantity(v, f"{where}.resources.requests[{k}]") for k, v in requests.items()}


def pod_requests(pod: dict) -> dict[str, float]:
    """kube-scheduler's computePodResourceRequest: max(sum(containers), max(init)) + overhead."""
    spec = _dict(pod.get("spec"), "spec")
    total: dict[str, float] = {}
    for i, c in enumerate(_list(spec.get("containers"), "spec.containers")):
        for k, v in _resources(_dict(c, f"spec.containers[{i}]"), f"spec.containers[{i}]").items():
            total[k] = total.get(k, 0.0) + v
    for i, c in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        for k, v in _resources(_dict(c, f"spec.initContainers[{i}]"), f"spec.initContainers[{i}]").items():
            total[k] = max(total.get(k, 0.0), v)
    for k, v in _dict(spec.get("overhead"), "spec.overhead").items():
        total[k] = total.get(k, 0.0) + parse_quantity(v, f"spec.overhead[{k}]")
    return total


def _qos(pod: dict, requests: dict[str, float]) -> int:
    meta = _dict(pod.get("metadata"), "metadata")
    ann = _dict(meta.get("annotations"), "metadata.annotations")
    if QOS_ANNOTATION in ann:
        key = str(ann[QOS_ANNOTATION]).strip().lower()
        if key not in QOS_ALIASES:
            raise ObjectError(
                f"metadata.annotations[{QOS_ANNOTATION}]: unknown QoS {ann[QOS_ANNOTATION]!r}; "
                f"expected one of {', '.join(QOS_CLASSES)}"
            )
        return QOS_ALIASES[key]
    status = _dict(pod.get("status"), "status")
    cls = str(status.get("qosClass") or "")
    if not cls:
        spec = _dict(pod.get("spec"), "spec")
        guaranteed, any_request = True, False
        for c in _list(spec.get("containers"), "spec.containers"):
            res = _dict(_dict(c, "container").get("resources"), "resources")
            req, lim = _dict(res.get("requests"), "requests"), _dict(res.get("limits"), "limits")
            any_request |= bool(req) or bool(lim)
            for r in ("cpu", "memory"):
                if r not in lim or (r in req and req[r] != lim[r]):
                    guaranteed = False
        cls = "Guaranteed" if guaranteed and any_request else ("Burstable" if any_request else "BestEffort")
    return QOS_ALIASES.get(cls.lower(), 1)


def _int_annotation(ann: dict, key: str, lo: int, hi: int) -> int | None:
    if key not in ann:
        return None
    try:
        v = int(str(ann[key]).strip())
    except ValueError:
        raise ObjectError(f"metadata.annotations[{key}]: {ann[key]!r} is not an integer") from None
    if not lo <= v <= hi:
        raise ObjectError(f"metadata.annotations[{key}]: {v} is outside {lo}..{hi}")
    return v


def pod_from_json(pod: Any, models: tuple[str, ...] = (), index: int = -1) -> Pod:
    """The fedsched :class:`Pod` of a Kubernetes Pod object; ``models`` is the cluster's GPU
    model vocabulary (``NodeTable.models``), for the pod's GPU-model constraint."""
    pod = _dict(pod, "Pod")
    if not pod:
        raise ObjectError("Pod: missing or empty")
    meta = _dict(pod.get("metadata"), "metadata")
    ann = _dict(meta.get("annotations"), "metadata.annotations")
    req = pod_requests(pod)
    cpu = _bounded(
        math.ceil(req.get("cpu", 0.0) * 1000 - 1e-9) if req.get("cpu", 0.0) < MAX_AMOUNT else None,
        "cpu request",
    )
    mem = _bounded(
        math.ceil(req.get("memory", 0.0) / MIB - 1e-9) if req.get("memory", 0.0) < MAX_AMOUNT * MIB else None,
        "memory request",
    )
    whole = req.get(GPU_RESOURCE, 0.0)
    if whole != int(whole):
        raise ObjectError(f"resources[{GPU_RESOURCE}]: {whole} is not a whole number of GPUs")
    # gpu-milli "0" asks for no GPU share: manifests generated from the openb trace carry it on
    # CPU-only pods (its gpu_milli column is 0 there), often with gpu-count "0"; whole GPUs then
    # still come from nvidia.com/gpu.
    milli = _int_annotation(ann, GPU_MILLI_ANNOTATION, 0, MILLI_PER_GPU)
    count = _int_annotation(ann, GPU_COUNT_ANNOTATION, 0, 64)
    if milli:
        num_gpu, gpu_milli = (count if count is not None else 1), milli
        if num_gpu > 1 and milli < MILLI_PER_GPU:
            raise ObjectError(
                f"{GPU_MILLI_ANNOTATION}={milli} with {GPU_COUNT_ANNOTATION}={num_gpu}: "
                "a GPU share below 1000 is for one GPU only"
            )
    elif whole > 0:
        num_gpu, gpu_milli = int(whole), MILLI_PER_GPU
    else:
        num_gpu, gpu_milli = 0, 0
    if num_gpu == 0:
        gpu_milli = 0
    spec_mask = 0
    if num_gpu and ann.get(GPU_MODEL_ANNOTATION):
        wanted = {m.strip() for m in str(ann[GPU_MODEL_ANNOTATION]).split(",") if m.strip()}
        for i, m in enumerate(models):
            if m in wanted:
                if i >= MAX_GPU_MODELS:
                    raise ObjectError(
                        f"metadata.annotations[{GPU_MODEL_ANNOTATION}]: GPU model {m!r} is model "
                        f"{i + 1} of this cluster's {len(models)}; fedsched tells apart the first "
                        f"{MAX_GPU_MODELS} GPU models (by name) only")
                spec_mask |= 1 << i
        if not spec_mask:
            spec_mask = FITS_NOWHERE  # asks for models this cluster lacks
    return Pod(
        index=index,
        cpu=cpu,
        mem=mem,
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        spec_mask=spec_mask,
        qos=_qos(pod, req),
    )


@dataclass(frozen=True)
class NodeInfo:
    """What the agent keeps of a Kubernetes Node object."""

    name: str
    cpu: int  # allocatable milli-CPU
    mem: int  # allocatable MiB
    gpu: int
    model: str  # GPU model ("" without GPUs)
    unschedulable: bool = False  # cordoned
    ready: bool = True
    no_schedule_taints: tuple[str, ...] = ()  # NoSchedule / NoExecute taint keys
    labels: tuple[tuple[str, str], ...] = ()


def node_from_json(node: Any) -> NodeInfo:
    node = _dict(node, "Node")
    meta = _dict(node.get("metadata"), "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("Node: metadata.name is missing")
    status = _dict(node.get("status"), "status")
    alloc = _dict(status.get("allocatable"), "status.allocatable") or _dict(
        status.get("capacity"), "status.capacity"
    )
    labels = {str(k): str(v) for k, v in _dict(meta.get("labels"), "metadata.labels").items()}
    cpu_q = parse_quantity(alloc.get("cpu", 0), f"node {name}: allocatable.cpu")
    mem_q = parse_quantity(alloc.get("memory", 0), f"node {name}: allocatable.memory")
    cpu = _bounded(
        math.floor(cpu_q * 1000 + 1e-9) if cpu_q < MAX_AMOUNT else None, f"node {name}: allocatable.cpu"
    )
    mem = _bounded(
        math.floor(mem_q / MIB + 1e-9) if mem_q < MAX_AMOUNT * MIB else None,
        f"node {name}: allocatable.memory",
    )
    gpu_q = alloc.get(GPU_RESOURCE, alloc.get(GPU_COUNT_ANNOTATION, 0))
    gpu = int(parse_quantity(gpu_q, f"node {name}: allocatable[{GPU_RESOURCE}]"))
    if gpu > MAX_GPUS_PER_NODE:
        raise ObjectError(
            f"node {name}: {gpu} GPUs; fedsched's cluster model holds at most {MAX_GPUS_PER_NODE} "
            "per node (the openb trace's largest), so this node is left out"
        )
    model = next((labels[k] for k in GPU_MODEL_LABELS if labels.get(k)), "unknown" if gpu else "")
    spec = _dict(node.get("spec"), "spec")
    taints = tuple(
        str(_dict(t, "taint").get("key", ""))
        for t in _list(spec.get("taints"), "spec.taints")
        if _dict(t, "taint").get("effect") in ("NoSchedule", "NoExecute")
    )
    ready = True
    for c in _list(status.get("conditions"), "status.conditions"):
        c = _dict(c, "condition")
        if c.get("type") == "Ready":
            ready = c.get("status") == "True"
    return NodeInfo(
        name,
        cpu,
        mem,
        gpu,
        model if gpu else "",
        bool(spec.get("unschedulable", False)),
        ready,
        taints,
        tuple(sorted(labels.items())),
    )


def bound_gpu_models(table: NodeTable) -> NodeTable:
    """``table`` with the nodes whose GPU model is past the first :data:`MAX_GPU_MODELS` given no
    model index (-1: they match no pod's model constraint, as no mask can name them); the
    vocabulary ``models`` stays whole, so that :func:`pod_from_json` names the limit to a pod
    asking for one of them."""
    if len(table.models) <= MAX_GPU_MODELS:
        return table
    return replace(table, model=np.where(table.model >= MAX_GPU_MODELS, -1, table.model))


def model_names(spec_mask: int, models: tuple[str, ...] | list[str]) -> list[str]:
    """The GPU models a pod's model mask names (none for :data:`FITS_NOWHERE`)."""
    if spec_mask <= 0:
        return []
    return [m for i, m in enumerate(models[:MAX_GPU_MODELS]) if (spec_mask >> i) & 1]


def node_table(infos: list[NodeInfo]) -> NodeTable:
    """The simulator's node table of these nodes (:func:`bound_gpu_models`). Kubernetes reports
    no disk or network capacity: the nodes get the defaults the trace loader gives openb nodes,
    so the policy's I/O and network features mean the same in serving as in training."""
    models = tuple(sorted({i.model for i in infos if i.gpu}))
    return bound_gpu_models(NodeTable(
        names=tuple(i.name for i in infos),
        cpu=np.array([i.cpu for i in infos], dtype=np.int64),
        mem=np.array([i.mem for i in infos], dtype=np.int64),
        gpu=np.array([i.gpu for i in infos], dtype=np.int64),
        model=np.array([models.index(i.model) if i.gpu else -1 for i in infos], dtype=np.int64),
        models=models,
        disk_io=np.full(len(infos), DEFAULT_DISK_IO_MBPS),
        net=np.full(len(infos), DEFAULT_NET_MBPS),
    ))


# ---- fedsched -> Kubernetes JSON (the scheduler stand-in, benchmarks and tests) -------------


def pod_to_json(
    pod: Pod,
    name: str,
    models: tuple[str, ...] = (),
    namespace: str = "default",
    uid: str | None = None,
    scheduler_name: str = "fedsched",
) -> dict:
    """A Pod object that :func:`pod_from_json` reads back as ``pod`` (index aside). A pod with an
    application code (``pod.app >= 0``) gets a controller ownerReference, StatefulSet
    ``app-<code>``, so the serving cache groups it with its siblings as the trace does (the
    cache numbers applications itself: its codes need not equal the trace's)."""
    requests: dict[str, str] = {}
    if pod.cpu:
        requests["cpu"] = f"{pod.cpu}m"
    if pod.mem:
        requests["memory"] = f"{pod.mem}Mi"
    ann: dict[str, str] = {QOS_ANNOTATION: QOS_CLASSES[pod.qos]}
    if pod.num_gpu and pod.is_gpu_share:
        ann[GPU_MILLI_ANNOTATION] = str(pod.gpu_milli)
        ann[GPU_COUNT_ANNOTATION] = "1"
    elif pod.num_gpu:
        requests[GPU_RESOURCE] = str(pod.num_gpu)
    if pod.num_gpu and pod.spec_mask:
        ann[GPU_MODEL_ANNOTATION] = ",".join(model_names(pod.spec_mask, models))
    resources: dict[str, Any] = {"requests": requests}
    if GPU_RESOURCE in requests:
        resources["limits"] = {GPU_RESOURCE: requests[GPU_RESOURCE]}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                            "annotations": ann}
    if pod.app >= 0:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": f"app-{pod.app}",
                                    "uid": f"uid-app-{pod.app}", "controller": True}]
    return {
        "metadata": meta,
        "spec": {
            "schedulerName": scheduler_name,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
        },
        "status": {"phase": "Pending"},
    }


def node_to_json(nodes: NodeTable, i: int) -> dict:
    """Node ``i`` of a node table as a Node object that :func:`node_from_json` reads back."""
    labels = {"kubernetes.io/hostname": nodes.names[i]}
    alloc = {"cpu": f"{int(nodes.cpu[i])}m", "memory": f"{int(nodes.mem[i])}Mi", "pods": "110"}
    if nodes.gpu[i]:
        alloc[GPU_RESOURCE] = str(int(nodes.gpu[i]))
        labels["nvidia.com/gpu.product"] = nodes.models[int(nodes.model[i])]
    return {
        "metadata": {"name": nodes.names[i], "labels": labels},
        "spec": {},
        "status": {
            "allocatable": alloc,
            "capacity": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
