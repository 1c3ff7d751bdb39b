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
    ``agent/prometheus/recording-rules.yaml`` (installed as package data), which copies them
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
    No extra recording rule is needed. The load-aware baselines (LoadVariationRiskBalancing)
    read them through ``Telemetry.cpu_mean`` etc. (``agent/cluster/cache.py``).
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
    ``nodes`` and ``fetched_at``, so callers can judge how old they are. The agent keeps
    working on requests alone meanwhile; the next successful refresh sets ``up=True`` again.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

__all__ = ["QUERIES", "STATS_WINDOW", "NodeUsage", "PrometheusTelemetry", "TelemetrySnapshot", "node_name",
           "queries"]

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
          "mem_mean": ("avg_over_time", _MEM_RATIO), "mem_std": ("stddev_over_time", _MEM_RATIO)}


def queries(stats_window: str = STATS_WINDOW) -> dict[str, str]:
    """name -> PromQL, the exact queries a refresh sends (``timestamp`` first), with the windowed
    statistics over ``stats_window`` (a PromQL duration such as ``15m``)."""
    if not _DURATION_RE.fullmatch(stats_window):
        raise ValueError(f"stats_window must be a PromQL duration such as 15m, got {stats_window!r}")
    return {
        "timestamp": f"max {_BY} (timestamp(node_memory_MemTotal_bytes))",
        "cpu": f"max {_BY} ({_CPU_RATIO})",
        "mem": f"max {_BY} ({_MEM_RATIO})",
        "disk": (f"(sum {_BY} (irate(node_disk_read_bytes_total{_DISKS}[1m]))"
                 f" + sum {_BY} (irate(node_disk_written_bytes_total{_DISKS}[1m]))) / 1e6"),
        "net": (f"(sum {_BY} (irate(node_network_receive_bytes_total{_NICS}[1m]))"
                f" + sum {_BY} (irate(node_network_transmit_bytes_total{_NICS}[1m]))) * 8 / 1e6"),
        **{name: f"max {_BY} ({fn}({series}[{stats_window}]))" for name, (fn, series) in _STATS.items()},
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


@dataclass(frozen=True)
class TelemetrySnapshot:
    """The result of the last refresh, with the last good node data when it failed."""

    up: bool  # the last refresh reached Prometheus and the queries succeeded
    fetched_at: float  # unix time of the last *successful* refresh (0.0 if never)
    nodes: dict[str, NodeUsage]  # by Kubernetes node name
    error: str = ""  # why the last refresh failed ("" when up)


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


class PrometheusTelemetry:
    """Per-node CPU, memory, disk and network use from Prometheus, refreshed on demand or in a thread.

    ``url`` is Prometheus' base URL (``http://prometheus-k8s.monitoring:9090``); ``verify`` is
    ``requests``' TLS verification (a CA bundle path, or False); ``headers`` go with every query
    (``Authorization: Bearer ...``). ``timeout_s`` bounds a whole refresh; ``on_update`` is
    called with the snapshot after every refresh of the background thread. ``stats_window`` is
    the window of the mean and deviation (PromQL duration, Trimaran's ``15m`` by default).
    """

    def __init__(self, url: str, interval_s: float = 5.0, timeout_s: float = 2.0,
                 on_update: Callable[[TelemetrySnapshot], None] | None = None,
                 verify: bool | str = True, headers: dict[str, str] | None = None,
                 stats_window: str = STATS_WINDOW) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(f"interval_s and timeout_s must be > 0, got {interval_s}, {timeout_s}")
        self.queries = queries(stats_window)
        self.stats_window = stats_window
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
            try:
                nodes = self._fetch()
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]
                if not self._down_logged:  # once per outage, not at every interval
                    _LOG.warning("telemetry: Prometheus at %s unavailable: %s", self.url, msg)
                    self._down_logged = True
                snap = TelemetrySnapshot(up=False, fetched_at=prev.fetched_at, nodes=prev.nodes, error=msg)
            else:
                if self._down_logged:
                    _LOG.info("telemetry: Prometheus at %s reachable again (%d nodes)", self.url, len(nodes))
                    self._down_logged = False
                snap = TelemetrySnapshot(up=True, fetched_at=time.time(), nodes=nodes, error="")
            self._snapshot = snap
            return snap

    def _query(self, name: str, deadline: float, params: dict[str, str]) -> list[dict]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"refresh took longer than {self.timeout_s}s (before query {name!r})")
        return self._prom.custom_query(self.queries[name], params=params, timeout=remaining)

    def _fetch(self) -> dict[str, NodeUsage]:
        deadline = time.monotonic() + self.timeout_s
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
        return {
            name: NodeUsage(cpu_ratio=cpu.get(name, _NAN), mem_ratio=mem.get(name, _NAN),
                            disk_io_mbs=disk.get(name, _NAN), net_mbits=net.get(name, _NAN), timestamp=ts,
                            **{stat: values[stat].get(name, _NAN) for stat in _STATS})
            for name, ts in sorted(stamps.items())
        }

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
