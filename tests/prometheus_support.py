"""Test helpers for the telemetry tests: simulated node-exporters and a real Prometheus server.

- :class:`NodeExporterSim` serves one node-exporter per simulated node, each with its own
  ``prometheus_client`` :class:`~prometheus_client.CollectorRegistry` and HTTP server on
  127.0.0.1 (a free port), publishing metrics under node-exporter's names
  (``node_cpu_seconds_total{cpu,mode}``, ``node_memory_MemTotal_bytes``,
  ``node_memory_MemAvailable_bytes``, ``node_disk_{read,written}_bytes_total{device}``,
  ``node_network_{receive,transmit}_bytes_total{device}``). The test sets each node's CPU and
  memory utilisation, disk I/O (MB/s) and network (Mbit/s); the counters advance at exactly
  those rates over wall time, so ``rate()`` in Prometheus gives back the set values. Dropping a
  node shuts its exporter down, as a dead node-exporter would be.
- :class:`KubeletSim` serves what a kubelet's ``/metrics/cadvisor`` endpoint publishes per
  container (``container_cpu_usage_seconds_total`` and ``container_memory_working_set_bytes``
  with ``namespace``, ``pod``, ``container``, ``image`` labels) for the pods the test sets, each
  container's CPU counter advancing at its set cores over wall time, and the series the
  telemetry's per-pod queries must leave out: the pod-level cgroup (``container=""``,
  ``image=""``, the sum of its containers again), the pod's sandbox (``container=""``, the pause
  image), the node's root cgroup (no pod) and the kubelet's ``/metrics/resource``-style copy of
  each container (no ``image`` label). Scraped with ``honor_labels`` like kube-prometheus'
  kubelet ServiceMonitor.
- :func:`running_prometheus` starts the real ``prometheus`` binary (Debian package) on a free
  loopback port with a temporary config (scrape and evaluation interval 1 s) and a recording
  rules file, waits for ``/-/ready`` and terminates it afterwards
  (:mod:`fedsched.experiment.prometheus`, which the kwok fleet uses too; re-exported here).

Each simulated node is its own scrape target, so its own ``instance``, as with one node-exporter
per node in kube-prometheus; a node either gets a ``node`` target label (its instance stays
``127.0.0.1:PORT``) or an ``instance`` label ``NAME:9100`` in place of its address.

The upstream CPU rule computes ``rate(...[5m])``, and ``rate`` divides by the whole window: with
a few seconds of samples it returns about elapsed/300 of the true rate (checked against this
Prometheus 2.42). :func:`rules_with_window` therefore gives the tests a copy of the shipped rules
file whose range selectors alone are shortened, so that values converge in seconds.
"""

from __future__ import annotations

import math
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fedsched.experiment.processes import free_port as free_port
from fedsched.experiment.processes import tail as tail
from fedsched.experiment.prometheus import PROMETHEUS as PROMETHEUS
from fedsched.experiment.prometheus import PrometheusServer as PrometheusServer
from fedsched.experiment.prometheus import running_prometheus as running_prometheus

PROMTOOL = shutil.which("promtool") or shutil.which("promtool", path="/usr/bin:/usr/local/bin")
RULES_FILE = Path(__file__).resolve().parents[1] / "common" / "data" / "prometheus" / "recording-rules.yaml"
JOB = "node-exporter"  # the job name the upstream memory rule selects
HOST = "127.0.0.1"
START_TIMEOUT = 30.0

# Split of the simulated load over modes and devices. Every part below is either counted by the
# queries (busy CPU modes, physical disks, eth0) or must be left out by them (idle/iowait/steal,
# the device-mapper volume stacked on sda, the loopback interface).
CPU_BUSY_MODES = {"user": 0.6, "system": 0.3, "softirq": 0.1}  # shares of the busy time
CPU_IDLE_MODES = {"idle": 0.96, "iowait": 0.03, "steal": 0.01}  # shares of the non-busy time
DISK_SHARES = {("sda", "read"): 0.3, ("sda", "written"): 0.2,
               ("nvme0n1", "read"): 0.25, ("nvme0n1", "written"): 0.25}
DISK_STACKED = {"dm-0": "sda"}  # a device-mapper volume on sda: the same bytes again
NET_SHARES = {("eth0", "receive"): 0.6, ("eth0", "transmit"): 0.4}
LOOPBACK_BYTES_PER_S = 5e8  # traffic on "lo", which must not count


class SimulatedNode(Collector):
    """One node's node-exporter metrics, with counters that follow the set utilisation."""

    def __init__(self, name: str, *, cpu: float, mem: float, disk_mbs: float, net_mbits: float,
                 cpus: int = 4, mem_total_bytes: int = 16 * 2**30, node_label: bool = True) -> None:
        self.name = name
        self.cpus = cpus
        self.mem_total_bytes = mem_total_bytes
        self.node_label = node_label
        self._lock = threading.Lock()
        self._since = time.time()
        # Counters start where a node up for a day would be, not at zero.
        self._base: dict[tuple[str, ...], float] = {}
        self._rates: dict[tuple[str, ...], float] = {}
        self._mem = 0.0
        self._apply(cpu, mem, disk_mbs, net_mbits, initial=True)

    # ---- load -----------------------------------------------------------------------------
    def set(self, *, cpu: float | None = None, mem: float | None = None, disk_mbs: float | None = None,
            net_mbits: float | None = None) -> None:
        """Change the load from now on; counters keep everything accumulated so far."""
        with self._lock:
            cur = self.current()
            self._apply(cur["cpu"] if cpu is None else cpu, cur["mem"] if mem is None else mem,
                        cur["disk_mbs"] if disk_mbs is None else disk_mbs,
                        cur["net_mbits"] if net_mbits is None else net_mbits)

    def current(self) -> dict[str, float]:
        """The load currently set (cpu and mem ratios 0..1, disk MB/s, net Mbit/s)."""
        return dict(self._load)

    def _apply(self, cpu: float, mem: float, disk_mbs: float, net_mbits: float,
               initial: bool = False) -> None:
        if not (0.0 <= cpu <= 1.0 and 0.0 <= mem <= 1.0 and disk_mbs >= 0 and net_mbits >= 0):
            raise ValueError(f"bad load for {self.name}: cpu={cpu} mem={mem} disk={disk_mbs} net={net_mbits}")
        now = time.time()
        if initial:
            uptime = 86400.0
            rates = self._rates_for(cpu, disk_mbs, net_mbits)
            self._base = {k: r * uptime for k, r in rates.items()}
        else:
            self._base = self._values(now)
            rates = self._rates_for(cpu, disk_mbs, net_mbits)
        self._rates, self._since = rates, now
        self._mem = mem
        self._load = {"cpu": cpu, "mem": mem, "disk_mbs": disk_mbs, "net_mbits": net_mbits}

    def _rates_for(self, cpu: float, disk_mbs: float, net_mbits: float) -> dict[tuple[str, ...], float]:
        rates: dict[tuple[str, ...], float] = {}
        for c in range(self.cpus):
            for mode, share in CPU_BUSY_MODES.items():
                rates[("cpu", str(c), mode)] = cpu * share
            for mode, share in CPU_IDLE_MODES.items():
                rates[("cpu", str(c), mode)] = (1.0 - cpu) * share
        for (dev, op), share in DISK_SHARES.items():
            rates[("disk", dev, op)] = disk_mbs * 1e6 * share
        for dev, under in DISK_STACKED.items():
            for op in ("read", "written"):
                rates[("disk", dev, op)] = rates[("disk", under, op)]
        for (dev, op), share in NET_SHARES.items():
            rates[("net", dev, op)] = net_mbits * 1e6 / 8 * share
        for op in ("receive", "transmit"):
            rates[("net", "lo", op)] = LOOPBACK_BYTES_PER_S
        return rates

    def _values(self, now: float) -> dict[tuple[str, ...], float]:
        dt = now - self._since
        return {k: self._base[k] + r * dt for k, r in self._rates.items()}

    # ---- exposition -----------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            values = self._values(time.time())
            mem = self._mem
        cpu_f = CounterMetricFamily("node_cpu_seconds_total", "Seconds the CPUs spent in each mode.",
                                    labels=["cpu", "mode"])
        disk_r = CounterMetricFamily("node_disk_read_bytes_total", "The total number of bytes read.",
                                     labels=["device"])
        disk_w = CounterMetricFamily("node_disk_written_bytes_total", "The total number of bytes written.",
                                     labels=["device"])
        net_rx = CounterMetricFamily("node_network_receive_bytes_total", "Network device statistic.",
                                     labels=["device"])
        net_tx = CounterMetricFamily("node_network_transmit_bytes_total", "Network device statistic.",
                                     labels=["device"])
        families = {("disk", "read"): disk_r, ("disk", "written"): disk_w,
                    ("net", "receive"): net_rx, ("net", "transmit"): net_tx}
        for key, v in sorted(values.items()):
            if key[0] == "cpu":
                cpu_f.add_metric([key[1], key[2]], v)
            else:
                families[(key[0], key[2])].add_metric([key[1]], v)
        yield cpu_f
        yield from families.values()
        total = GaugeMetricFamily("node_memory_MemTotal_bytes", "Memory information field MemTotal_bytes.")
        total.add_metric([], float(self.mem_total_bytes))
        yield total
        avail = GaugeMetricFamily("node_memory_MemAvailable_bytes",
                                  "Memory information field MemAvailable_bytes.")
        avail.add_metric([], float(self.mem_total_bytes) * (1.0 - mem))
        yield avail


PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
SANDBOX_CORES = 0.002  # what a pod's sandbox (pause) uses: must not count
SANDBOX_BYTES = 1 << 20
KUBELET_JOB = "kubelet"


@dataclass
class SimContainer:
    cores: float  # CPU use, cores
    mem_bytes: float  # working set, bytes
    image: str = "registry.example/app:1"


class SimulatedKubelet(Collector):
    """cAdvisor's per-container series of one kubelet, following the set use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (namespace, pod) -> container -> (container, CPU seconds at `since`, since)
        self._pods: dict[tuple[str, str], dict[str, tuple[SimContainer, float, float]]] = {}
        self._root_base = 5e6  # the node's root cgroup counter
        self._t0 = time.time()

    def set_pod(self, namespace: str, pod: str, containers: dict[str, SimContainer]) -> None:
        """Create the pod or change its containers' use from now on (counters keep their totals)."""
        now = time.time()
        with self._lock:
            old = self._pods.get((namespace, pod), {})
            new = {}
            for name, c in containers.items():
                seconds = self._seconds(old[name], now) if name in old else 3600.0 * c.cores
                new[name] = (c, seconds, now)
            self._pods[(namespace, pod)] = new

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self._lock:
            self._pods.pop((namespace, pod), None)

    @staticmethod
    def _seconds(entry: tuple[SimContainer, float, float], now: float) -> float:
        c, base, since = entry
        return base + c.cores * (now - since)

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        labels = ["id", "name", "namespace", "pod", "container", "image"]
        cpu = CounterMetricFamily("container_cpu_usage_seconds_total",
                                  "Cumulative cpu time consumed in seconds.", labels=labels)
        mem = GaugeMetricFamily("container_memory_working_set_bytes", "Current working set in bytes.",
                                labels=labels)
        with self._lock:
            pods = {k: dict(v) for k, v in self._pods.items()}
        root_cpu = self._root_base
        root_mem = 2e9
        for (ns, pod), containers in sorted(pods.items()):
            cg = f"/kubepods/burstable/pod-{ns}-{pod}"
            pod_cpu = SANDBOX_CORES * (3600.0 + now - self._t0)
            pod_mem = float(SANDBOX_BYTES)
            cpu.add_metric([f"{cg}/sandbox", "sandbox", ns, pod, "", PAUSE_IMAGE], pod_cpu)
            mem.add_metric([f"{cg}/sandbox", "sandbox", ns, pod, "", PAUSE_IMAGE], float(SANDBOX_BYTES))
            for name, entry in sorted(containers.items()):
                c = entry[0]
                seconds = self._seconds(entry, now)
                cpu.add_metric([f"{cg}/{name}", name, ns, pod, name, c.image], seconds)
                mem.add_metric([f"{cg}/{name}", name, ns, pod, name, c.image], c.mem_bytes)
                # the kubelet's /metrics/resource copy: no id, name or image (empty = absent)
                cpu.add_metric(["", "", ns, pod, name, ""], seconds)
                mem.add_metric(["", "", ns, pod, name, ""], c.mem_bytes)
                pod_cpu += seconds
                pod_mem += c.mem_bytes
            cpu.add_metric([cg, "", ns, pod, "", ""], pod_cpu)  # the pod's cgroup: its containers again
            mem.add_metric([cg, "", ns, pod, "", ""], pod_mem)
            root_cpu += pod_cpu
            root_mem += pod_mem
        cpu.add_metric(["/", "", "", "", "", ""], root_cpu)
        mem.add_metric(["/", "", "", "", "", ""], root_mem)
        yield cpu
        yield mem


class KubeletSim:
    """One simulated kubelet's cAdvisor endpoint on loopback (an HTTP server of its own)."""

    def __init__(self, node: str = "node-a") -> None:
        self.node = node
        self.kubelet = SimulatedKubelet()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.kubelet)
        self.server, self.thread = start_http_server(0, addr=HOST, registry=registry)

    def set_pod(self, namespace: str, pod: str, **containers: SimContainer) -> None:
        self.kubelet.set_pod(namespace, pod, containers)

    def remove_pod(self, namespace: str, pod: str) -> None:
        self.kubelet.remove_pod(namespace, pod)

    def scrape_config(self, job: str = KUBELET_JOB) -> dict:
        """The ``scrape_configs`` entry: the series keep their namespace/pod labels (honor_labels)."""
        return {"job_name": job, "honor_labels": True, "metrics_path": "/metrics/cadvisor",
                "static_configs": [{"targets": [f"{HOST}:{self.server.server_port}"],
                                    "labels": {"node": self.node}}]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> KubeletSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Served:
    node: SimulatedNode
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)


class NodeExporterSim:
    """Simulated node-exporters, one HTTP server (and registry) per node, on loopback."""

    def __init__(self) -> None:
        self._served: dict[str, _Served] = {}

    def add_node(self, name: str, **load: float | int | bool) -> SimulatedNode:
        """Start an exporter for a new node; ``load`` goes to :class:`SimulatedNode`."""
        if name in self._served:
            raise ValueError(f"node {name} exists")
        node = SimulatedNode(name, **load)  # type: ignore[arg-type]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(node)
        server, thread = start_http_server(0, addr=HOST, registry=registry)
        self._served[name] = _Served(node, server, thread)
        return node

    def node(self, name: str) -> SimulatedNode:
        return self._served[name].node

    @property
    def names(self) -> list[str]:
        return list(self._served)

    def set(self, name: str, **load: float) -> None:
        self._served[name].node.set(**load)

    def drop(self, name: str) -> None:
        """Stop publishing ``name``: its exporter goes away and scrapes of it fail."""
        s = self._served.pop(name)
        s.server.shutdown()
        s.server.server_close()
        s.thread.join(timeout=5)

    def url(self, name: str) -> str:
        return f"http://{HOST}:{self._served[name].port}/metrics"

    def scrape_config(self, job: str = JOB) -> dict:
        """The ``scrape_configs`` entry for all nodes: one target each."""
        groups = []
        for name, s in self._served.items():
            labels = {"node": name} if s.node.node_label else {"instance": f"{name}:9100"}
            groups.append({"targets": [f"{HOST}:{s.port}"], "labels": labels})
        return {"job_name": job, "static_configs": groups}

    def close(self) -> None:
        for name in list(self._served):
            self.drop(name)

    def __enter__(self) -> NodeExporterSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- Prometheus ------------------------------------------------------------------------------
RANGE_RE = re.compile(r"\[(\d+(?:ms|[smhdwy]))\]")


def rules_with_window(text: str, window: str) -> str:
    """``text`` with every range selector (``[5m]``, ``[3m]``) replaced by ``[window]``."""
    out, n = RANGE_RE.subn(f"[{window}]", text)
    if n == 0:
        raise ValueError("no range selector found in the rules")
    return out


def close_to(a: float, b: float, rel: float, abs_: float = 0.0) -> bool:
    """``a`` is finite and within ``rel`` (relative) or ``abs_`` (absolute) of ``b``."""
    return math.isfinite(a) and abs(a - b) <= max(rel * abs(b), abs_)

