"""Live node telemetry for the online scheduling agent, read from a Prometheus server.

The agent (a kube-scheduler extender) weighs each node by its requests and, when Prometheus
is reachable, by what the node really uses: CPU and memory utilisation, disk I/O and network.
:class:`PrometheusTelemetry` fetches them with ``prometheus-api-client`` (one HTTP query per
signal, see :data:`QUERIES`), either on demand (:meth:`~PrometheusTelemetry.refresh`) or every
``interval_s`` seconds in a background thread (:meth:`~PrometheusTelemetry.start`), and hands
out immutable :class:`TelemetrySnapshot` objects.

Recording rules required
    CPU and memory are the two series the Trimaran load-aware plugins read:
    ``instance:node_cpu:ratio`` (kube-prometheus ``kube-prometheus-node-recording.rules``) and
    ``instance:node_memory_utilisation:ratio`` (node-mixin ``node-exporter.rules``).
    kube-prometheus ships both. Any other Prometheus must load
    ``common/data/prometheus/recording-rules.yaml`` (installed as package data), which copies them
    verbatim and names its sources; like upstream, it expects the node-exporter scrape job to
    be called ``node-exporter`` and one ``instance`` per node. Without the rules the CPU and
    memory ratios are NaN and the agent schedules on requests for them. The CPU rule is
    ``rate(...[5m])``: for the first five minutes of a node's series it underestimates (rate
    divides by the whole window), and it follows a change in load over five minutes.
Units
    ``cpu_ratio`` and ``mem_ratio`` are 0..1 (a rate can overshoot 1 by a little, values are not
    clipped); ``disk_io_mbs`` is MB/s (10^6 bytes) read + written summed over the node's disks,
    device-mapper and md devices left out since they repeat the I/O of the disks under them
    (node-exporter already drops partitions, loop and ram devices); ``net_mbits`` is Mbit/s
    (10^6 bits) received + transmitted summed over all interfaces but ``lo``. Disk and network
    use ``irate`` over ``[1m]``: the rate between a node's last two scrapes, so current load that
    is correct from the second scrape on, for scrape intervals up to 30 s.
Windowed statistics
    ``cpu_mean`` / ``cpu_std`` / ``mem_mean`` / ``mem_std`` are ``avg_over_time`` and
    ``stddev_over_time`` of the same two recorded ratios over ``stats_window`` (default ``15m``),
    the queries and the window Trimaran's load-watcher sends (paypal/load-watcher
    pkg/watcher/internal/metricsprovider/prometheus.go; its library client asks for the 15-minute
    window). 0..1 like the ratios; over a window that holds one sample the deviation is 0, and
    for the first 15 minutes of a series the window holds what there is. NaN without the rules.
    ``cpu_peak`` / ``mem_peak`` are ``max_over_time`` of the same ratios over the same window:
    the largest sample the window holds (0..1, NaN without the rules), the policy's windowed
    peak (feature schema 2). No extra recording rule is needed. The load-aware baselines
    (LoadVariationRiskBalancing) and the policy features read them through
    ``Telemetry.cpu_mean`` / ``cpu_peak`` etc. (``agent/cluster/cache.py``,
    ``common/schedulers/load_stats.py::node_load``).
Per-pod use
    ``snapshot.pods`` maps ``(namespace, pod)`` to ``(cpu_cores, mem_bytes)``, what each pod's
    containers use, from the cAdvisor series kubelet exposes at ``/metrics/cadvisor``
    (kube-prometheus' ``kubelet`` ServiceMonitor scrapes it, with ``honorLabels`` so the
    series keep their own ``namespace`` and ``pod`` labels):
    ``sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{container!="",image!=""}[5m]))``
    (cores: CPU seconds per second) and
    ``sum by (namespace, pod) (container_memory_working_set_bytes{container!="",image!=""})``
    (bytes: the working set, what the kubelet's eviction and the OOM killer look at). The
    selector keeps the containers' own series: ``container=""`` are the pod- and higher-level
    cgroups (they repeat their containers' use), ``image=""`` also leaves out the kubelet's
    ``/metrics/resource`` copies of the same metric names (they have no ``image`` label). The
    CPU rate needs two samples in its window (a pod's first scrape interval has memory only:
    its CPU is NaN) and, like the recording rule's, underestimates for the first five minutes
    of a container. The cache turns them into per-application use / request ratios
    (``Telemetry.app_usage``). Without cAdvisor in Prometheus ``pods`` is empty; a failing
    per-pod query (an error, or the refresh budget spent on the node queries) leaves node
    telemetry up, keeps the last good ``pods`` and says why in ``pods_error``.
Node names
    A series is the node in its ``node`` label if it has one, else its ``instance`` label with
    any ``:port`` suffix removed (kube-prometheus sets ``instance`` to the node name).
Staleness
    ``NodeUsage.timestamp`` is the time of the node's newest raw sample in Prometheus
    (``timestamp(node_memory_MemTotal_bytes)``, Prometheus' clock). A node appears in
    ``snapshot.nodes`` only while Prometheus has such a sample: when its node-exporter goes
    down, the failed scrape writes staleness markers and the node vanishes from the next
    refresh (so do its recorded ratios: memory is a gauge ratio and the CPU rule divides by an
    instant count of CPUs; the ``irate`` of disk and network alone would linger for a minute).
    When Prometheus stops scraping without writing markers (it restarted, the target left its
    configuration while it was down), the node keeps its last sample for the lookback delta
    (5 minutes) with a timestamp that grows old: callers compare ``timestamp`` with the time.
Prometheus down
    ``refresh`` never raises. When Prometheus cannot be reached, answers with an error, or a
    refresh takes longer than ``timeout_s`` (the budget of the whole refresh, not of each
    query), the snapshot says ``up=False`` with the reason in ``error`` and keeps the last good
    ``nodes``, ``pods`` and ``fetched_at``, so callers can judge how old they are. The agent
    keeps working on requests alone meanwhile; the next successful refresh sets ``up=True``
    again. ``up`` is about the node queries: the per-pod ones (sent last, within the same
    budget) fail on their own (``pods_error``, see above).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

__all__ = ["POD_RATE_WINDOW", "QUERIES", "STATS_WINDOW", "NodeUsage", "PodUsage", "PrometheusTelemetry",
           "TelemetrySnapshot", "node_name", "queries"]

_LOG = logging.getLogger(__name__)

_BY = "by (instance, node)"
_DISKS = '{device!~"dm-.+|md.+"}'  # stacked devices repeat the I/O of the disks under them
_NICS = '{device!="lo"}'
_CPU_RATIO = "instance:node_cpu:ratio"
_MEM_RATIO = "instance:node_memory_utilisation:ratio"
#: Trimaran's window (load-watcher ``FifteenMinutes``) for the windowed mean and deviation.
STATS_WINDOW = "15m"
_DURATION_RE = re.compile(r"(\d+(ms|[smhdwy]))+")  # a PromQL duration: 15m, 1h30m, 90s
#: The windowed statistics: name -> (PromQL function, recorded series).
_STATS = {"cpu_mean": ("avg_over_time", _CPU_RATIO), "cpu_std": ("stddev_over_time", _CPU_RATIO),
          "mem_mean": ("avg_over_time", _MEM_RATIO), "mem_std": ("stddev_over_time", _MEM_RATIO),
          "cpu_peak": ("max_over_time", _CPU_RATIO), "mem_peak": ("max_over_time", _MEM_RATIO)}
#: The rate window of the per-pod CPU query (the one of kube-prometheus' container CPU rules).
POD_RATE_WINDOW = "5m"
_CONTAINERS = '{container!="",image!=""}'  # the containers' own cAdvisor series
_POD_BY = "by (namespace, pod)"
#: The per-pod queries (cAdvisor), sent after the node queries; their failure is not the node's.
_POD_QUERIES = ("pod_cpu", "pod_mem")


def queries(stats_window: str = STATS_WINDOW, pod_rate_window: str = POD_RATE_WINDOW) -> dict[str, str]:
    """name -> PromQL, the exact queries a refresh sends (``timestamp`` first), with the windowed
    statistics over ``stats_window`` (a PromQL duration such as ``15m``) and the per-pod CPU
    rate over ``pod_rate_window`` (``5m``)."""
    for what, window in (("stats_window", stats_window), ("pod_rate_window", pod_rate_window)):
        if not _DURATION_RE.fullmatch(window):
            raise ValueError(f"{what} must be a PromQL duration such as 15m, got {window!r}")
    return {
        "timestamp": f"max {_BY} (timestamp(node_memory_MemTotal_bytes))",
        "cpu": f"max {_BY} ({_CPU_RATIO})",
        "mem": f"max {_BY} ({_MEM_RATIO})",
        "disk": (f"(sum {_BY} (irate(node_disk_read_bytes_total{_DISKS}[1m]))"
                 f" + sum {_BY} (irate(node_disk_written_bytes_total{_DISKS}[1m]))) / 1e6"),
        "net": (f"(sum {_BY} (irate(node_network_receive_bytes_total{_NICS}[1m]))"
                f" + sum {_BY} (irate(node_network_transmit_bytes_total{_NICS}[1m]))) * 8 / 1e6"),
        **{name: f"max {_BY} ({fn}({series}[{stats_window}]))" for name, (fn, series) in _STATS.items()},
        "pod_cpu": f"sum {_POD_BY} (rate(container_cpu_usage_seconds_total{_CONTAINERS}[{pod_rate_window}]))",
        "pod_mem": f"sum {_POD_BY} (container_memory_working_set_bytes{_CONTAINERS})",
    }


#: name -> PromQL, the exact queries a refresh sends with the default window.
QUERIES: dict[str, str] = queries()

_NAN = float("nan")
_MAX_ERROR = 500  # characters of an error message kept in the snapshot


@dataclass(frozen=True)
class NodeUsage:
    """What one node really uses, as Prometheus last saw it."""

    cpu_ratio: float  # 0..1 (instance:node_cpu:ratio), NaN if unknown
    mem_ratio: float  # 0..1 (instance:node_memory_utilisation:ratio), NaN if unknown
    disk_io_mbs: float  # MB/s read+written, NaN if unknown
    net_mbits: float  # Mbit/s received+transmitted, NaN if unknown
    timestamp: float  # unix seconds of the newest underlying sample (PromQL timestamp())
    # Mean and standard deviation of the two ratios over the statistics window, NaN if unknown.
    cpu_mean: float = math.nan
    cpu_std: float = math.nan
    mem_mean: float = math.nan
    mem_std: float = math.nan
    # The largest sample of the two ratios over the statistics window, NaN if unknown.
    cpu_peak: float = math.nan
    mem_peak: float = math.nan


#: (namespace, pod name) -> (CPU cores, memory working set in bytes); NaN where one is unknown.
PodUsage = dict[tuple[str, str], tuple[float, float]]


@dataclass(frozen=True)
class TelemetrySnapshot:
    """The result of the last refresh, with the last good node data when it failed."""

    up: bool  # the last refresh reached Prometheus and the node queries succeeded
    fetched_at: float  # unix time of the last *successful* refresh (0.0 if never)
    nodes: dict[str, NodeUsage]  # by Kubernetes node name
    error: str = ""  # why the last refresh failed ("" when up)
    # Per-pod use (cAdvisor), {} when Prometheus has none; the last good ones when the per-pod
    # queries failed, with the reason in pods_error ("" when they succeeded).
    pods: PodUsage = field(default_factory=dict)
    pods_error: str = ""


def _strip_port(instance: str) -> str:
    if instance.startswith("["):  # [ipv6]:port
        end = instance.find("]")
        return instance[1:end] if end > 0 else instance
    host, sep, port = instance.rpartition(":")
    if sep and host and port.isdigit() and ":" not in host:
        return host
    return instance  # no port, or a bare IPv6 address


def node_name(labels: Mapping[str, str]) -> str | None:
    """The Kubernetes node a series belongs to: its ``node`` label, else ``instance`` sans port."""
    node = labels.get("node")
    if node:
        return node
    instance = labels.get("instance")
    return _strip_port(instance) if instance else None


def _by_node(result: list[dict]) -> dict[str, float]:
    """Instant-query result -> {node: value}; several series of one node: the largest value."""
    out: dict[str, float] = {}
    for item in result:
        name = node_name(item.get("metric", {}))
        if name is None:
            continue
        v = float(item["value"][1])
        old = out.get(name)
        if old is None or math.isnan(old) or v > old:
            out[name] = v
    return out


def _by_pod(result: list[dict]) -> dict[tuple[str, str], float]:
    """Instant-query result -> {(namespace, pod): value}; series without both labels are skipped."""
    out: dict[tuple[str, str], float] = {}
    for item in result:
        labels = item.get("metric", {})
        ns, pod = labels.get("namespace"), labels.get("pod")
        if ns and pod:
            out[(ns, pod)] = float(item["value"][1])
    return out


class PrometheusTelemetry:
    """Per-node CPU, memory, disk and network use from Prometheus, refreshed on demand or in a thread.

    ``url`` is Prometheus' base URL (``http://prometheus-k8s.monitoring:9090``); ``verify`` is
    ``requests``' TLS verification (a CA bundle path, or False); ``headers`` go with every query
    (``Authorization: Bearer ...``). ``timeout_s`` bounds a whole refresh; ``on_update`` is
    called with the snapshot after every refresh of the background thread. ``stats_window`` is
    the window of the mean, deviation and peak (PromQL duration, Trimaran's ``15m`` by default);
    ``pod_rate_window`` the rate window of the per-pod CPU query (``5m``).
    """

    def __init__(self, url: str, interval_s: float = 5.0, timeout_s: float = 2.0,
                 on_update: Callable[[TelemetrySnapshot], None] | None = None,
                 verify: bool | str = True, headers: dict[str, str] | None = None,
                 stats_window: str = STATS_WINDOW, pod_rate_window: str = POD_RATE_WINDOW) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(f"interval_s and timeout_s must be > 0, got {interval_s}, {timeout_s}")
        self.queries = queries(stats_window, pod_rate_window)
        self.stats_window = stats_window
        self.pod_rate_window = pod_rate_window
        self.url = url.rstrip("/")
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.on_update = on_update
        session = requests.Session()
        session.verify = verify
        # No retries: a refresh that fails is simply repeated at the next interval.
        self._prom = PrometheusConnect(url=self.url, headers=dict(headers or {}), session=session,
                                       retry=Retry(total=0, raise_on_status=False), timeout=self.timeout_s)
        self._snapshot = TelemetrySnapshot(up=False, fetched_at=0.0, nodes={}, error="not refreshed yet")
        self._refresh_lock = threading.Lock()
        self._down_logged = False
        self._pods_logged = False
        self._rules_warned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- fetching -----------------------------------------------------------------------------
    @property
    def snapshot(self) -> TelemetrySnapshot:
        """The latest snapshot (no I/O)."""
        return self._snapshot

    def refresh(self) -> TelemetrySnapshot:
        """Fetch every signal once; never raises (a failure gives ``up=False`` with the last nodes)."""
        with self._refresh_lock:
            prev = self._snapshot
            deadline = time.monotonic() + self.timeout_s
            try:
                nodes, params = self._fetch(deadline)
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]
                if not self._down_logged:  # once per outage, not at every interval
                    _LOG.warning("telemetry: Prometheus at %s unavailable: %s", self.url, msg)
                    self._down_logged = True
                snap = TelemetrySnapshot(up=False, fetched_at=prev.fetched_at, nodes=prev.nodes, error=msg,
                                         pods=prev.pods, pods_error=prev.pods_error)
            else:
                if self._down_logged:
                    _LOG.info("telemetry: Prometheus at %s reachable again (%d nodes)", self.url, len(nodes))
                    self._down_logged = False
                pods, pods_error = self._fetch_pods(deadline, params, prev.pods)
                snap = TelemetrySnapshot(up=True, fetched_at=time.time(), nodes=nodes, error="", pods=pods,
                                         pods_error=pods_error)
            self._snapshot = snap
            return snap

    def _query(self, name: str, deadline: float, params: dict[str, str]) -> list[dict]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"refresh took longer than {self.timeout_s}s (before query {name!r})")
        return self._prom.custom_query(self.queries[name], params=params, timeout=remaining)

    def _fetch(self, deadline: float) -> tuple[dict[str, NodeUsage], dict[str, str]]:
        """The node queries: (nodes, the query parameters that pin Prometheus' evaluation time)."""
        stamps_raw = self._query("timestamp", deadline, {})
        # Evaluate the other queries at the instant Prometheus evaluated the first (its clock).
        params = {"time": str(stamps_raw[0]["value"][0])} if stamps_raw else {}
        stamps = _by_node(stamps_raw)
        values = {name: _by_node(self._query(name, deadline, params))
                  for name in ("cpu", "mem", "disk", "net", *_STATS)}
        if stamps and not values["cpu"] and not values["mem"] and not self._rules_warned:
            _LOG.warning("telemetry: node-exporter data but no instance:node_cpu:ratio or "
                         "instance:node_memory_utilisation:ratio: are the recording rules loaded?")
            self._rules_warned = True
        cpu, mem, disk, net = values["cpu"], values["mem"], values["disk"], values["net"]
        nodes = {
            name: NodeUsage(cpu_ratio=cpu.get(name, _NAN), mem_ratio=mem.get(name, _NAN),
                            disk_io_mbs=disk.get(name, _NAN), net_mbits=net.get(name, _NAN), timestamp=ts,
                            **{stat: values[stat].get(name, _NAN) for stat in _STATS})
            for name, ts in sorted(stamps.items())
        }
        return nodes, params

    def _fetch_pods(self, deadline: float, params: dict[str, str], prev: PodUsage) -> tuple[PodUsage, str]:
        """The per-pod queries: (pods, "") or, when they fail, (the last good pods, why)."""
        try:
            cpu, mem = (_by_pod(self._query(name, deadline, params)) for name in _POD_QUERIES)
        except Exception as exc:
            msg = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]
            if not self._pods_logged:
                _LOG.warning("telemetry: per-pod queries failed (node telemetry unaffected): %s", msg)
                self._pods_logged = True
            return prev, msg
        self._pods_logged = False
        return {key: (cpu.get(key, _NAN), mem.get(key, _NAN)) for key in sorted(cpu.keys() | mem.keys())}, ""

    # ---- background thread --------------------------------------------------------------------
    def start(self) -> None:
        """Refresh every ``interval_s`` in a daemon thread, calling ``on_update`` after each."""
        if self._thread is not None and self._thread.is_alive():
            return
        # A fresh event per thread: a thread that outlived stop()'s join never runs on.
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="prometheus-telemetry",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (at most one refresh, bounded by ``timeout_s``)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.timeout_s + 5.0)
            if thread.is_alive():
                _LOG.warning("telemetry: refresh thread still running after stop()")

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            snap = self.refresh()
            if self.on_update is not None:
                try:
                    self.on_update(snap)
                except Exception:
                    _LOG.exception("telemetry: on_update callback failed")
            if stop.wait(self.interval_s):
                break
