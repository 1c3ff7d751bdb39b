"""kwok (sigs.k8s.io/kwok v0.8.0) against a real kube-apiserver: simulated nodes whose pods go
through their lifecycle, with per-node and per-pod use for a real Prometheus, for the kwok fleet
(:mod:`.fleet`).

``scripts/build_k8s.sh`` builds the ``kwok`` binary from its Go module into ``.k8s/bin/`` and
copies kwok's released Stage and Metric configurations (the ones matching the binary) into
``.k8s/share/kwok/``. :func:`write_config` joins them with fedsched's own documents
(:data:`FEDSCHED_DOCS`) into the one config file :func:`start_kwok` gives ``kwok -c``:

- Nodes (label ``type=kwok``, :data:`NODE_SELECTOR`): kwok's ``node-initialize`` makes a new node
  Ready (its capacity and allocatable kept), ``node-heartbeat-with-lease`` keeps it so, and
  kwok renews its Lease. The apiserver's admission gives every new Node the not-ready taint
  that kube-controller-manager would lift; none runs, so :func:`register_nodes` lifts it.
- Pods bound to those nodes: kwok's ``pod-ready`` (Running, a pod IP), fedsched's
  ``fedsched-pod-complete`` (Succeeded once the duration in the pod's
  :data:`DURATION_ANNOTATION` has passed, e.g. ``90s``: the trace's lifetime), kwok's
  ``pod-delete`` (a pod being deleted is removed at once: no kubelet).
- Use: a ``ClusterResourceUsage`` gives each pod's container the CPU and memory in its
  :data:`USAGE_CPU_ANNOTATION` / :data:`USAGE_MEM_ANNOTATION` (quantities: ``1500m``,
  ``2048Mi``; the workload generator writes the project's usage model's level of the pod there).
- Metrics on kwok's server address, one kubelet-style path per node
  (``/metrics/nodes/NODE/metrics/cadvisor``): the node's ``node_cpu_usage_seconds_total`` and
  ``node_memory_working_set_bytes`` (kubelet's ``/metrics/resource`` names),
  ``machine_cpu_cores`` / ``machine_memory_bytes`` from its capacity, and each container's CPU
  counter and working set with an ``image`` label, as the agent's per-pod queries select
  cAdvisor's series.

:func:`scrape_configs` has Prometheus scrape that path of each node from kwok, labelled
``node`` and ``instance`` with the node's name, from a file-based discovery file
(:func:`write_targets`; Debian's Prometheus has no ``kubernetes_sd``). :data:`RECORDING_RULES`
turn the kubelet series into the two recorded ratios the agent's telemetry reads
(``instance:node_cpu:ratio``, ``instance:node_memory_utilisation:ratio``; node-exporter's
series, which the shipped rules read, do not exist here) and record
``node_memory_MemTotal_bytes`` from ``machine_memory_bytes``: the telemetry lists a node by
that series' timestamp. Disk and network stay unknown (NaN), as for a node without
node-exporter.

Imports the standard library, ``requests``, :mod:`fedsched.common.model.cluster` and this
package's :mod:`.control_plane` and :mod:`.processes`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import requests

from fedsched.common.model.cluster import NodeTable
from fedsched.experiment.control_plane import K8S_BIN, ControlPlane, KubeAPI, node_object
from fedsched.experiment.processes import HOST, free_port, tail, wait_for

__all__ = ["DURATION_ANNOTATION", "FEDSCHED_DOCS", "KWOK", "KWOK_SHARE", "NODE_SELECTOR", "RECORDING_RULES",
           "UPSTREAM_CONFIGS", "USAGE_CPU_ANNOTATION", "USAGE_MEM_ANNOTATION", "Kwok", "missing",
           "pod_annotations", "recording_rules", "register_nodes", "scrape_configs", "start_kwok",
           "write_config", "write_targets"]

KWOK = K8S_BIN / "kwok"
KWOK_SHARE = Path(os.environ.get("FEDSCHED_KWOK_SHARE") or K8S_BIN.parent / "share" / "kwok")
#: kwok's released configurations that scripts/build_k8s.sh copies, in the order they are used.
#: (Not kwok's metrics-resource.yaml: its container series, without an ``image`` label, would
#: share their names with :data:`FEDSCHED_DOCS`' and kwok registers one set of label names per
#: metric name, so which path served them depended on which was scraped first.)
UPSTREAM_CONFIGS = ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-ready.yaml",
                    "pod-delete.yaml")
NODE_LABEL = ("type", "kwok")
NODE_SELECTOR = f"{NODE_LABEL[0]}={NODE_LABEL[1]}"
DURATION_ANNOTATION = "fedsched.io/duration"
USAGE_CPU_ANNOTATION = "fedsched.io/usage-cpu"
USAGE_MEM_ANNOTATION = "fedsched.io/usage-memory"
#: The one Prometheus job that scrapes kwok's kubelet path of every node.
KUBELET_JOB = "kubelet"
NODE_LEASE_SECONDS = 40

_CONTAINER_LABELS = """
    labels:
    - name: container
      value: 'container.name'
    - name: image
      value: 'container.image'
    - name: namespace
      value: 'pod.metadata.namespace'
    - name: pod
      value: 'pod.metadata.name'"""

#: fedsched's kwok documents: the pod-complete Stage, the usage from annotations, the cAdvisor path.
FEDSCHED_DOCS = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: fedsched-pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["{DURATION_ANNOTATION}"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["{DURATION_ANNOTATION}"]'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{{{ $now | Quote }}}}
            reason: Completed
      {{{{ end }}}}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterResourceUsage
metadata:
  name: fedsched-usage
spec:
  usages:
  - usage:
      cpu:
        expression: |
          "{USAGE_CPU_ANNOTATION}" in pod.metadata.annotations
          ? Quantity(pod.metadata.annotations["{USAGE_CPU_ANNOTATION}"])
          : Quantity("1m")
      memory:
        expression: |
          "{USAGE_MEM_ANNOTATION}" in pod.metadata.annotations
          ? Quantity(pod.metadata.annotations["{USAGE_MEM_ANNOTATION}"])
          : Quantity("1Mi")
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Metric
metadata:
  name: fedsched-cadvisor
spec:
  path: "/metrics/nodes/{{nodeName}}/metrics/cadvisor"
  metrics:
  - name: node_cpu_usage_seconds_total
    dimension: node
    help: Cumulative cpu time consumed by the node in core-seconds
    kind: counter
    value: 'node.CumulativeUsage("cpu")'
  - name: node_memory_working_set_bytes
    dimension: node
    help: Current working set of the node in bytes
    kind: gauge
    value: 'node.Usage("memory")'
  - name: machine_cpu_cores
    dimension: node
    help: Number of logical CPU cores (the node's capacity)
    kind: gauge
    value: 'node.status.capacity["cpu"]'
  - name: machine_memory_bytes
    dimension: node
    help: Memory of the machine in bytes (the node's capacity)
    kind: gauge
    value: 'node.status.capacity["memory"]'
  - name: container_cpu_usage_seconds_total
    dimension: container
    help: Cumulative cpu time consumed in core-seconds
    kind: counter{_CONTAINER_LABELS}
    value: 'pod.CumulativeUsage("cpu", container.name)'
  - name: container_memory_working_set_bytes
    dimension: container
    help: Current working set in bytes
    kind: gauge{_CONTAINER_LABELS}
    value: 'pod.Usage("memory", container.name)'
"""


def recording_rules(window: str = "1m") -> str:
    """The recorded series the agent's telemetry reads, from the kubelet series kwok emulates;
    CPU over ``window`` (short, so a fleet's figures converge within a minute)."""
    by = "by (instance, node)"
    res = cad = f'job="{KUBELET_JOB}"'
    return f"""\
# fedsched kwok fleet: the agent's recorded series from the kubelet-style series kwok emulates
groups:
  - name: fedsched-kwok-node.rules
    rules:
      - record: instance:node_cpu:ratio
        expr: >-
          sum {by} (rate(node_cpu_usage_seconds_total{{{res}}}[{window}]))
          / on (instance, node) max {by} (machine_cpu_cores{{{cad}}})
      - record: instance:node_memory_utilisation:ratio
        expr: >-
          max {by} (node_memory_working_set_bytes{{{res}}})
          / on (instance, node) max {by} (machine_memory_bytes{{{cad}}})
      - record: node_memory_MemTotal_bytes
        expr: max {by} (machine_memory_bytes{{{cad}}})
"""


RECORDING_RULES = recording_rules()


def missing() -> list[str]:
    """Why kwok cannot run here (empty when it can)."""
    why = []
    if not os.access(KWOK, os.X_OK):
        why.append(f"{KWOK} missing (bash scripts/build_k8s.sh)")
    absent = [f for f in UPSTREAM_CONFIGS if not (KWOK_SHARE / f).is_file()]
    if absent:
        why.append(f"kwok's configurations {absent} missing in {KWOK_SHARE} (bash scripts/build_k8s.sh)")
    return why


def write_config(path: Path) -> Path:
    """kwok's config file: its released Stages and Metric, then :data:`FEDSCHED_DOCS`."""
    docs = [(KWOK_SHARE / f).read_text() for f in UPSTREAM_CONFIGS] + [FEDSCHED_DOCS]
    path.write_text("\n---\n".join(d.strip() for d in docs) + "\n")
    return path


def pod_annotations(duration_s: float, cpu_milli: float, mem_mib: float) -> dict[str, str]:
    """What kwok reads of a pod: its lifetime and its containers' use."""
    return {DURATION_ANNOTATION: f"{max(1, round(duration_s))}s",
            USAGE_CPU_ANNOTATION: f"{max(1, round(cpu_milli))}m",
            USAGE_MEM_ANNOTATION: f"{max(1, round(mem_mib))}Mi"}


@dataclass
class Kwok:
    """A running kwok: its process, its log and its server's address (the metrics)."""

    proc: subprocess.Popen
    log: Path
    address: str  # host:port

    def metrics(self, node: str, path: str = "metrics/cadvisor") -> str:
        with requests.Session() as s:
            s.trust_env = False
            r = s.get(f"http://{self.address}/metrics/nodes/{quote(node)}/{path}", timeout=10)
        r.raise_for_status()
        return r.text

    def log_tail(self, n: int = 3000) -> str:
        return tail(self.log, n)


@contextlib.contextmanager
def start_kwok(cp: ControlPlane, name: str = "kwok") -> Iterator[Kwok]:
    """kwok against ``cp`` managing the nodes labelled :data:`NODE_SELECTOR`; its server (the
    metrics) on a free loopback port; stopped on exit."""
    why = missing()
    if why:
        raise RuntimeError("; ".join(why))
    config = write_config(cp.root / f"{name}.yaml")
    address = f"{HOST}:{free_port()}"
    proc, log = cp.procs.start(name, [
        str(KWOK), "--kubeconfig", str(cp.kubeconfig), "-c", str(config),
        "--manage-nodes-with-label-selector", NODE_SELECTOR, "--server-address", address,
        "--node-lease-duration-seconds", str(NODE_LEASE_SECONDS), "--v", "WARN"])
    kwok = Kwok(proc, log, address)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"kwok exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(requests.RequestException), requests.Session() as s:
            s.trust_env = False
            return s.get(f"http://{address}/healthz", timeout=2).status_code == 200
        return False

    try:
        wait_for(up, 60, 0.2, "kwok's /healthz")
        yield kwok
    finally:
        cp.procs.stop(proc)


def _ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions", []))


def register_nodes(api: KubeAPI, nodes: NodeTable, timeout: float = 120.0) -> float:
    """Register every node of ``nodes`` for kwok (label :data:`NODE_SELECTOR`; capacity,
    allocatable and GPU model label from the inventory), wait until kwok has made each Ready,
    and lift the not-ready taint; returns the seconds until all were Ready."""
    t0 = time.monotonic()
    for i in range(len(nodes)):
        obj = node_object(nodes, i, {NODE_LABEL[0]: NODE_LABEL[1]})
        api.request("POST", "/api/v1/nodes", obj, ok=(201, 409))
    want = set(nodes.names)

    def all_ready() -> bool:
        ready = {n["metadata"]["name"] for n in api.items("/api/v1/nodes", labelSelector=NODE_SELECTOR)
                 if _ready(n)}
        return want <= ready

    wait_for(all_ready, timeout, 0.5, f"kwok making {len(want)} nodes Ready")
    took = time.monotonic() - t0
    for name in nodes.names:
        api.merge_patch(f"/api/v1/nodes/{quote(name)}", {"spec": {"taints": None}})
    return took


def write_targets(path: Path, kwok: Kwok, names: list[str] | tuple[str, ...]) -> Path:
    """The file-based service discovery file of :func:`scrape_configs`: one target per node
    (kwok's address, the node's name in ``node``; written atomically, Prometheus re-reads it on
    change, so a fleet that adds or removes nodes rewrites it)."""
    groups = [{"targets": [kwok.address], "labels": {"node": n, "instance": n}} for n in names]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)
    return path


def scrape_configs(targets: Path) -> list[dict]:
    """The Prometheus job for kwok's kubelet path of every node in ``targets``
    (:func:`write_targets`), labelled ``node`` and ``instance`` with the node's name. File-based
    discovery: Debian's Prometheus is built without ``kubernetes_sd``."""
    return [{
        "job_name": KUBELET_JOB,
        "honor_labels": True,
        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "10s"}],
        "relabel_configs": [
            {"source_labels": ["node"], "target_label": "__metrics_path__",
             "replacement": "/metrics/nodes/${1}/metrics/cadvisor"},
        ],
    }]
