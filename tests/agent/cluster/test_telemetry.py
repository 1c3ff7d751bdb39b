"""Tests of ``fedsched.agent.cluster.telemetry`` against a real Prometheus server.

Simulated node-exporters (``tests/prometheus_support.py``) publish node-exporter metrics whose
counters follow a utilisation the test sets; the real ``prometheus`` binary scrapes them every
second and evaluates the recording rules of ``common/data/prometheus/recording-rules.yaml``;
:class:`PrometheusTelemetry` reads the result through the HTTP API. The shared server runs the
shipped rules with their range selectors shortened from 5m to a few seconds (the only change)
so that values converge in seconds; one test runs the shipped file unchanged. A simulated
kubelet (``KubeletSim``) publishes cAdvisor's per-container series beside them, for the per-pod
queries. Skips only when the ``prometheus`` binary is missing.
"""

from __future__ import annotations

import contextlib
import math
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.polling import wait_for
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.telemetry import (
    POD_RATE_WINDOW,
    QUERIES,
    STATS_WINDOW,
    NodeUsage,
    PrometheusTelemetry,
    TelemetrySnapshot,
    node_name,
    queries,
)
from tests.prometheus_support import (
    HOST,
    PROMETHEUS,
    PROMTOOL,
    RANGE_RE,
    RULES_FILE,
    KubeletSim,
    NodeExporterSim,
    PrometheusServer,
    SimContainer,
    close_to,
    free_port,
    rules_with_window,
    running_prometheus,
)

needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not found on PATH (apt-get install prometheus)")

TEST_WINDOW = "5s"  # range selectors of the test copy of the rules (upstream: 5m)
CONVERGE_S = 25.0  # first scrape (discovery sends targets after 5 s) + the window + slack
# node name -> initial load; node-c has no `node` label and is found by its instance "node-c:9100"
NODES: dict[str, dict] = {
    "node-a": {"cpu": 0.35, "mem": 0.40, "disk_mbs": 120.0, "net_mbits": 800.0, "cpus": 4},
    "node-b": {"cpu": 0.70, "mem": 0.65, "disk_mbs": 15.0, "net_mbits": 90.0, "cpus": 8},
    "node-c": {"cpu": 0.10, "mem": 0.20, "disk_mbs": 2.0, "net_mbits": 40.0, "cpus": 2, "node_label": False},
    "node-d": {"cpu": 0.50, "mem": 0.50, "disk_mbs": 50.0, "net_mbits": 500.0, "cpus": 4},
    # changed by test_windowed_statistics only
    "node-e": {"cpu": 0.30, "mem": 0.40, "disk_mbs": 5.0, "net_mbits": 50.0, "cpus": 4},
}
STATS_TEST_WINDOW = "8s"  # the window of the mean / deviation queries in the test (Trimaran: 15m)
POD_TEST_WINDOW = "5s"  # the per-pod CPU rate window in the test (production: 5m)
MIB = 2**20
# What the simulated kubelet runs: (namespace, pod) -> containers. Two replicas of the fixture's
# Deployment ``web`` (tests/data/k8s/pods.json), its namesake in another namespace and a pod
# with two containers; each pod also has a sandbox and a pod-level cgroup series that must not count.
KUBELET_PODS: dict[tuple[str, str], dict[str, SimContainer]] = {
    ("shop", "web-7d9c5b6f8-m4kqt"): {"web": SimContainer(0.25, 256 * MIB)},
    ("shop", "web-7d9c5b6f8-two22"): {"web": SimContainer(1.0, 768 * MIB)},
    ("staging", "web-7d9c5b6f8-m4kqt"): {"web": SimContainer(3.0, 3072 * MIB)},
    ("batch", "etl-nightly-28930860-q9wzl"): {"etl": SimContainer(0.8, 1024 * MIB),
                                              "log-shipper": SimContainer(0.2, 64 * MIB)},
}


def pod_totals(pods: dict[tuple[str, str], dict[str, SimContainer]]) -> dict:
    return {k: (sum(c.cores for c in cs.values()), sum(c.mem_bytes for c in cs.values()))
            for k, cs in pods.items()}


def pods_match(snap: TelemetrySnapshot, want: dict[tuple[str, str], tuple[float, float]]) -> bool:
    """The snapshot's pods are exactly ``want``: CPU within 3%, memory exact."""
    return (snap.up and set(snap.pods) == set(want)
            and all(close_to(snap.pods[k][0], c, 0.03, 0.005) and snap.pods[k][1] == m
                    for k, (c, m) in want.items()))


def mismatch(u: NodeUsage, want: dict[str, float], now: float) -> str:
    """Why ``u`` does not show the load ``want`` ("" when it does)."""
    bad = []
    if not close_to(u.cpu_ratio, want["cpu"], 0.0, 0.02):
        bad.append(f"cpu {u.cpu_ratio:.4f} != {want['cpu']}")
    if not close_to(u.mem_ratio, want["mem"], 0.0, 0.002):
        bad.append(f"mem {u.mem_ratio:.4f} != {want['mem']}")
    if not close_to(u.disk_io_mbs, want["disk_mbs"], 0.03, 0.05):
        bad.append(f"disk {u.disk_io_mbs:.3f} != {want['disk_mbs']}")
    if not close_to(u.net_mbits, want["net_mbits"], 0.03, 0.05):
        bad.append(f"net {u.net_mbits:.3f} != {want['net_mbits']}")
    if not now - 5.0 < u.timestamp <= now + 1.0:
        bad.append(f"timestamp {now - u.timestamp:.1f}s old")
    return "; ".join(bad)


def shows(tel: PrometheusTelemetry, sim: NodeExporterSim, names: list[str]) -> TelemetrySnapshot | None:
    """Refresh; the snapshot if every node in ``names`` shows its currently set load, else None."""
    snap = tel.refresh()
    now = time.time()
    if not snap.up:
        return None
    for name in names:
        if name not in snap.nodes or mismatch(snap.nodes[name], sim.node(name).current(), now):
            return None
    return snap


def explain(tel: PrometheusTelemetry, sim: NodeExporterSim, names: list[str]) -> str:
    snap = tel.refresh()
    now = time.time()
    return f"up={snap.up} error={snap.error!r} " + ", ".join(
        f"{n}: {mismatch(snap.nodes[n], sim.node(n).current(), now) if n in snap.nodes else 'missing'}"
        for n in names)


def converge(tel: PrometheusTelemetry, sim: NodeExporterSim, names: list[str],
             timeout: float = CONVERGE_S) -> TelemetrySnapshot:
    try:
        return wait_for(lambda: shows(tel, sim, names), timeout, what="telemetry matching the exporters")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {explain(tel, sim, names)}") from None


def query_requests(prom: PrometheusServer) -> float:
    """Prometheus' own count of /api/v1/query requests answered."""
    with urllib.request.urlopen(f"{prom.url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line)


@pytest.fixture(scope="module")
def kubelet() -> Iterator[KubeletSim]:
    with KubeletSim("node-a") as k:
        for (ns, pod), containers in KUBELET_PODS.items():
            k.set_pod(ns, pod, **containers)
        yield k


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            kubelet: KubeletSim) -> Iterator[tuple[NodeExporterSim, PrometheusServer]]:
    """Five simulated nodes and a kubelet scraped by one Prometheus that runs the short-window rules."""
    with NodeExporterSim() as sim:
        for name, load in NODES.items():
            sim.add_node(name, **load)
        rules = rules_with_window(RULES_FILE.read_text(), TEST_WINDOW)
        with running_prometheus(tmp_path_factory.mktemp("prometheus"),
                                [sim.scrape_config(), kubelet.scrape_config()], rules) as prom:
            yield sim, prom


# ---- pure functions ------------------------------------------------------------------------------
def test_node_name_from_labels() -> None:
    assert node_name({"node": "worker-1", "instance": "10.0.0.7:9100"}) == "worker-1"
    assert node_name({"instance": "worker-2:9100"}) == "worker-2"
    assert node_name({"instance": "10.0.0.7:9100"}) == "10.0.0.7"
    assert node_name({"instance": "worker-3"}) == "worker-3"
    assert node_name({"instance": "[fd00::7]:9100"}) == "fd00::7"
    assert node_name({"instance": "fd00::7"}) == "fd00::7"  # a bare IPv6 address has no port
    assert node_name({"node": "", "instance": "w4:9100"}) == "w4"
    assert node_name({"job": "node-exporter"}) is None


def test_test_rules_differ_from_shipped_only_in_range() -> None:
    shipped = RULES_FILE.read_text()
    short = rules_with_window(shipped, TEST_WINDOW)
    assert short != shipped
    assert RANGE_RE.sub("[]", short) == RANGE_RE.sub("[]", shipped)
    assert "record: instance:node_cpu:ratio" in shipped
    assert "record: instance:node_memory_utilisation:ratio" in shipped


def test_windowed_statistics_queries() -> None:
    """Trimaran's load-watcher queries: avg_over_time / stddev_over_time of the ratios over 15m."""
    assert STATS_WINDOW == "15m" and queries() == QUERIES
    assert QUERIES["cpu_mean"] == "max by (instance, node) (avg_over_time(instance:node_cpu:ratio[15m]))"
    assert QUERIES["mem_std"] == ("max by (instance, node) "
                                  "(stddev_over_time(instance:node_memory_utilisation:ratio[15m]))")
    short = queries("1h30m")
    assert short["cpu_std"].endswith("(stddev_over_time(instance:node_cpu:ratio[1h30m]))")
    assert {k: v for k, v in short.items() if "over_time" not in v} == {
        k: v for k, v in QUERIES.items() if "over_time" not in v}
    for bad in ("15", "15 m", "m", "15m]", ""):
        with pytest.raises(ValueError, match="stats_window must be a PromQL duration"):
            PrometheusTelemetry("http://localhost:9090", stats_window=bad)
    u = NodeUsage(0.1, 0.2, 3.0, 4.0, 5.0)  # the positional form callers use keeps working
    assert all(math.isnan(x) for x in (u.cpu_mean, u.cpu_std, u.mem_mean, u.mem_std, u.cpu_peak, u.mem_peak))


def test_peak_and_per_pod_queries() -> None:
    """The windowed peaks (max_over_time, same window) and cAdvisor's per-pod CPU and memory."""
    assert QUERIES["cpu_peak"] == "max by (instance, node) (max_over_time(instance:node_cpu:ratio[15m]))"
    assert QUERIES["mem_peak"] == ("max by (instance, node) "
                                   "(max_over_time(instance:node_memory_utilisation:ratio[15m]))")
    assert POD_RATE_WINDOW == "5m"
    assert QUERIES["pod_cpu"] == ('sum by (namespace, pod) '
                                  '(rate(container_cpu_usage_seconds_total{container!="",image!=""}[5m]))')
    assert QUERIES["pod_mem"] == ('sum by (namespace, pod) '
                                  '(container_memory_working_set_bytes{container!="",image!=""})')
    assert list(QUERIES)[-2:] == ["pod_cpu", "pod_mem"]  # after the node queries
    short = queries("8s", "30s")
    assert short["cpu_peak"].endswith("(max_over_time(instance:node_cpu:ratio[8s]))")
    assert short["pod_cpu"] == QUERIES["pod_cpu"].replace("[5m]", "[30s]")
    assert short["pod_mem"] == QUERIES["pod_mem"]
    with pytest.raises(ValueError, match="pod_rate_window must be a PromQL duration"):
        PrometheusTelemetry("http://localhost:9090", pod_rate_window="5")
    s = TelemetrySnapshot(True, 1.0, {})  # the positional form callers use keeps working
    assert s.pods == {} and s.pods_error == ""


def test_unreachable_url_is_down_and_never_raises() -> None:
    url = f"http://{HOST}:{free_port()}"  # nothing listens there
    tel = PrometheusTelemetry(url, timeout_s=30.0)
    assert tel.snapshot.up is False and tel.snapshot.fetched_at == 0.0
    t0 = time.monotonic()
    snap = tel.refresh()
    # connection refused: no retries, no waiting for the timeout (bounds far apart, so that a
    # loaded machine cannot fail the check and a client that waits cannot pass it)
    assert time.monotonic() - t0 < 5.0
    assert snap.up is False and snap.error and snap.nodes == {} and snap.fetched_at == 0.0
    assert tel.snapshot is snap
    assert tel.refresh().up is False


def test_hanging_server_bounded_by_timeout() -> None:
    """A server that accepts connections and never answers: a refresh ends after ``timeout_s``."""
    with socket.socket() as srv:
        srv.bind((HOST, 0))
        srv.listen(16)  # the kernel completes the handshakes; nobody ever reads or replies
        tel = PrometheusTelemetry(f"http://{HOST}:{srv.getsockname()[1]}", timeout_s=2.0)
        t0 = time.monotonic()
        snap = tel.refresh()
        took = time.monotonic() - t0
        assert snap.up is False and "timed out" in snap.error.lower()
        # one timeout, not two (no retries), and never a hang; a timeout long enough that a
        # loaded machine's delays stay far inside the margin
        assert 1.9 < took < 3.9
        # stop() during a hanging refresh returns once that refresh gives up
        calls: list[TelemetrySnapshot] = []
        tel = PrometheusTelemetry(f"http://{HOST}:{srv.getsockname()[1]}", interval_s=0.1, timeout_s=2.0,
                                  on_update=calls.append)
        tel.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        tel.stop()
        assert time.monotonic() - t0 < 3.9
        assert calls and all(not s.up for s in calls)


# ---- against the real Prometheus -----------------------------------------------------------------
@needs_prometheus
def test_values_match_exporters(cluster: tuple[NodeExporterSim, PrometheusServer]) -> None:
    sim, prom = cluster
    tel = PrometheusTelemetry(prom.url)
    snap = converge(tel, sim, list(NODES))
    assert snap.up and snap.error == ""
    assert abs(snap.fetched_at - time.time()) < 5
    assert set(snap.nodes) == set(NODES)  # node-c by its instance label, the rest by `node`
    # one HTTP round trip per query, nothing else
    before = query_requests(prom)
    assert tel.refresh().up
    assert query_requests(prom) - before == len(QUERIES)


@needs_prometheus
def test_changed_utilisation_shows_up(cluster: tuple[NodeExporterSim, PrometheusServer]) -> None:
    sim, prom = cluster
    tel = PrometheusTelemetry(prom.url)
    converge(tel, sim, ["node-a", "node-b"])
    sim.set("node-a", cpu=0.85, mem=0.75, disk_mbs=30.0, net_mbits=2500.0)
    sim.set("node-b", cpu=0.05)
    snap = converge(tel, sim, ["node-a", "node-b"], timeout=15.0)
    a = snap.nodes["node-a"]
    assert a.cpu_ratio == pytest.approx(0.85, abs=0.02) and a.mem_ratio == pytest.approx(0.75, abs=0.002)
    assert snap.nodes["node-b"].mem_ratio == pytest.approx(NODES["node-b"]["mem"], abs=0.002)


@needs_prometheus
def test_windowed_statistics(cluster: tuple[NodeExporterSim, PrometheusServer]) -> None:
    """Mean and deviation over the window: constant load, then a step that the window straddles."""
    sim, prom = cluster
    tel = PrometheusTelemetry(prom.url, stats_window=STATS_TEST_WINDOW)
    converge(tel, sim, ["node-e"])
    window_s = float(STATS_TEST_WINDOW.removesuffix("s"))

    def stats(pred) -> NodeUsage | None:
        s = tel.refresh()
        u = s.nodes.get("node-e") if s.up else None
        return u if u is not None and pred(u) else None

    # a constant load: the mean is the load, the deviation ~0 (memory is an exact gauge ratio)
    steady = wait_for(lambda: stats(lambda u: close_to(u.mem_mean, 0.40, 0.0, 0.002) and u.mem_std < 0.002
                                    and close_to(u.cpu_mean, 0.30, 0.0, 0.03) and 0 <= u.cpu_std < 0.03
                                    and close_to(u.mem_peak, 0.40, 0.0, 0.002)),
                      window_s + 10.0, what="steady windowed statistics")
    assert steady.mem_ratio == pytest.approx(0.40, abs=0.002)
    assert steady.cpu_mean <= steady.cpu_peak < steady.cpu_mean + 0.05
    # memory steps 0.40 -> 0.80: while the window holds both, the mean lies between and std > 0;
    # the peak is the new level at once
    sim.set("node-e", mem=0.80)
    mixed = wait_for(lambda: stats(lambda u: 0.45 < u.mem_mean < 0.75 and u.mem_std > 0.05),
                     window_s + 5.0, what="a window straddling the step")
    assert mixed.mem_std <= 0.2 + 1e-9  # the largest std of a mix of 0.4 and 0.8
    assert mixed.mem_peak == pytest.approx(0.80, abs=0.002)
    # ... and back down 0.80 -> 0.40: the peak holds the window's largest sample
    sim.set("node-e", mem=0.40)
    down = wait_for(lambda: stats(lambda u: close_to(u.mem_ratio, 0.40, 0.0, 0.002)), 5.0, what="step down")
    assert down.mem_peak == pytest.approx(0.80, abs=0.002)
    sim.set("node-e", mem=0.80)
    # once the window has passed the steps: the new level, no deviation, the peak the level
    wait_for(lambda: stats(lambda u: close_to(u.mem_mean, 0.80, 0.0, 0.002) and u.mem_std < 0.002
                           and close_to(u.mem_peak, 0.80, 0.0, 0.002)),
             window_s + 10.0, what="windowed statistics of the new level")
    # one HTTP round trip per query, the statistics included
    before = query_requests(prom)
    assert tel.refresh().up
    assert query_requests(prom) - before == len(tel.queries) == len(QUERIES)


@needs_prometheus
def test_dropped_node_vanishes(cluster: tuple[NodeExporterSim, PrometheusServer]) -> None:
    sim, prom = cluster
    tel = PrometheusTelemetry(prom.url)
    converge(tel, sim, ["node-d"])
    sim.drop("node-d")
    snap = wait_for(lambda: (s := tel.refresh()).up and "node-d" not in s.nodes and s, 10.0,
                    what="node-d gone from the telemetry")
    assert {"node-a", "node-b", "node-c"} <= set(snap.nodes)
    # Prometheus itself sees the dead exporter
    up = {r["metric"].get("node") or r["metric"]["instance"]: r["value"][1] for r in prom.query("up")}
    assert up["node-d"] == "0" and up["node-a"] == "1"
    converge(tel, sim, ["node-a", "node-b", "node-c"], timeout=10.0)


@needs_prometheus
def test_background_thread_calls_on_update(cluster: tuple[NodeExporterSim, PrometheusServer]) -> None:
    _sim, prom = cluster
    calls: list[TelemetrySnapshot] = []
    done = threading.Event()

    def on_update(snap: TelemetrySnapshot) -> None:
        calls.append(snap)
        if len(calls) >= 3 and {"node-a", "node-b"} <= set(snap.nodes):
            done.set()

    tel = PrometheusTelemetry(prom.url, interval_s=0.2, on_update=on_update)
    tel.start()
    tel.start()  # a second start does not start a second thread
    try:
        assert done.wait(CONVERGE_S), f"on_update called {len(calls)} times, last {calls[-1:]}"
        assert sum(t.name == "prometheus-telemetry" for t in threading.enumerate()) == 1
    finally:
        t0 = time.monotonic()
        tel.stop()
        took = time.monotonic() - t0
    assert took < 5.0  # prompt (generous: only a hang or a long wait should fail it)
    n = len(calls)
    time.sleep(0.5)
    assert len(calls) == n  # no refresh after stop()
    assert all(s.up for s in calls) and tel.snapshot is calls[-1]
    assert {"node-a", "node-b"} <= set(calls[-1].nodes)
    assert not any(t.name == "prometheus-telemetry" for t in threading.enumerate())
    tel.start()  # and it can be started again
    try:
        wait_for(lambda: len(calls) > n, 5.0, what="refresh after restart")
    finally:
        tel.stop()


@needs_prometheus
def test_shipped_rules_then_prometheus_stops(tmp_path: Path) -> None:
    """The shipped rules file as it is, in Prometheus 2.42; then Prometheus goes away."""
    if PROMTOOL is not None:
        check = subprocess.run([PROMTOOL, "check", "rules", str(RULES_FILE)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "2 rules found" in check.stdout
    with NodeExporterSim() as sim:
        sim.add_node("node-a", cpu=0.6, mem=0.3, disk_mbs=10.0, net_mbits=100.0)
        sim.add_node("node-c", cpu=0.4, mem=0.8, disk_mbs=1.0, net_mbits=10.0, node_label=False)
        with running_prometheus(tmp_path / "prometheus", [sim.scrape_config()]) as prom:
            tel = PrometheusTelemetry(prom.url)

            def ready() -> TelemetrySnapshot | None:
                s = tel.refresh()
                ok = s.up and all(n in s.nodes and math.isfinite(s.nodes[n].cpu_ratio)
                                  and math.isfinite(s.nodes[n].disk_io_mbs) for n in ("node-a", "node-c"))
                return s if ok else None

            last = wait_for(ready, CONVERGE_S, what="shipped rules evaluated for both nodes")
            assert last.pods == {} and last.pods_error == ""  # no cAdvisor here: no pods, no error
            groups = prom.api("rules")["groups"]
            rules = {r["name"]: r for g in groups for r in g["rules"]}
            assert set(rules) == {"instance:node_cpu:ratio", "instance:node_memory_utilisation:ratio"}
            assert all(r["health"] == "ok" and not r.get("lastError") for r in rules.values()), rules
            for name, (cpu, mem) in {"node-a": (0.6, 0.3), "node-c": (0.4, 0.8)}.items():
                u = last.nodes[name]
                assert u.mem_ratio == pytest.approx(mem, abs=0.002)  # a gauge ratio: exact at once
                # rate(...[5m]) over a few seconds of samples divides by the whole 5 minutes
                assert 0.0 < u.cpu_ratio < 0.25 * cpu
                assert u.net_mbits == pytest.approx(sim.node(name).current()["net_mbits"], rel=0.03)

            prom.stop()
            assert prom.proc.poll() is not None
            for _ in range(2):
                snap = tel.refresh()
                assert snap.up is False and snap.error
                assert snap.nodes == last.nodes and snap.fetched_at == last.fetched_at
                assert snap.pods is last.pods
            assert tel.snapshot is snap


# ---- per-pod use (cAdvisor) against the real Prometheus --------------------------------------------
def converge_pods(tel: PrometheusTelemetry, want: dict[tuple[str, str], tuple[float, float]],
                  timeout: float = CONVERGE_S) -> TelemetrySnapshot:
    def matching() -> TelemetrySnapshot | None:
        snap = tel.refresh()
        return snap if pods_match(snap, want) else None

    try:
        return wait_for(matching, timeout, what="per-pod use matching the kubelet")
    except TimeoutError as exc:
        got = tel.snapshot
        raise AssertionError(f"{exc}: got {got.pods} ({got.pods_error!r}), want {want}") from None


@contextlib.contextmanager
def kubelet_restored(kubelet: KubeletSim) -> Iterator[KubeletSim]:
    """Give the shared kubelet back with :data:`KUBELET_PODS` as they were."""
    try:
        yield kubelet
    finally:
        for (ns, pod), containers in KUBELET_PODS.items():
            kubelet.set_pod(ns, pod, **containers)


@needs_prometheus
def test_pod_usage_matches_the_kubelet(cluster: tuple[NodeExporterSim, PrometheusServer],
                                       kubelet: KubeletSim) -> None:
    """Per pod, the sum of its containers: the sandbox, the pod's cgroup, the root cgroup and the
    /metrics/resource copies are left out (memory is exact, so any of them would show)."""
    _sim, prom = cluster
    tel = PrometheusTelemetry(prom.url, pod_rate_window=POD_TEST_WINDOW)
    want = pod_totals(KUBELET_PODS)
    snap = converge_pods(tel, want)
    assert snap.pods_error == "" and {"node-a", "node-b"} <= set(snap.nodes)  # node telemetry as before
    assert snap.pods[("batch", "etl-nightly-28930860-q9wzl")][1] == (1024 + 64) * MIB  # two containers
    # one HTTP round trip per query, the per-pod ones included
    before = query_requests(prom)
    assert tel.refresh().up
    assert query_requests(prom) - before == len(QUERIES)
    # the production window: memory exact at once, the 5m rate an underestimate over this young series
    prod = PrometheusTelemetry(prom.url).refresh()
    for key, (cores, mem) in want.items():
        assert prod.pods[key][1] == mem
        assert 0.0 < prod.pods[key][0] <= 1.05 * cores
    with kubelet_restored(kubelet):
        kubelet.set_pod("shop", "web-7d9c5b6f8-two22", web=SimContainer(0.5, 512 * MIB))
        kubelet.remove_pod("batch", "etl-nightly-28930860-q9wzl")
        changed = {k: v for k, v in want.items() if k[0] != "batch"}
        changed[("shop", "web-7d9c5b6f8-two22")] = (0.5, 512 * MIB)
        converge_pods(tel, changed, timeout=15.0)
    converge_pods(tel, want, timeout=15.0)


@needs_prometheus
def test_pod_usage_feeds_the_cache_app_ratios(cluster: tuple[NodeExporterSim, PrometheusServer],
                                              kubelet: KubeletSim) -> None:
    """Prometheus -> PrometheusTelemetry -> ClusterCache.apply_telemetry -> Telemetry.app_usage."""
    import copy
    import json

    from tests.paths import TEST_DATA

    _sim, prom = cluster
    nodes = json.loads((TEST_DATA / "k8s" / "nodes.json").read_text())["items"]
    pods = json.loads((TEST_DATA / "k8s" / "pods.json").read_text())["items"]
    web = next(p for p in pods if p["metadata"]["name"] == "web-7d9c5b6f8-m4kqt")
    web2 = copy.deepcopy(web)
    web2["metadata"].update(name="web-7d9c5b6f8-two22", uid="uid-web-two")
    web2["spec"]["nodeName"] = "cpu-node-b"
    web2["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1500m", "memory": "1536Mi"}
    cache = ClusterCache()
    cache.replace_all(nodes, [*pods, web2])
    code = {b.ref[1]: b.pod.app for b in cache.pods.values()}
    tel = PrometheusTelemetry(prom.url, pod_rate_window=POD_TEST_WINDOW, on_update=cache.apply_telemetry)
    cache.apply_telemetry(converge_pods(tel, pod_totals(KUBELET_PODS)))
    usage = cache.telemetry.app_usage
    # web: (250 + 1000) m / (500 + 1500) m and (256 + 768) MiB / (512 + 1536) MiB; the namesake
    # pod in "staging" is no pod of the cache's
    assert usage(code["web-7d9c5b6f8-m4kqt"]) == (pytest.approx(0.625, rel=0.03),
                                                  pytest.approx(0.5, rel=1e-12))
    # etl (requests 2000m / 4096Mi): (800 + 200) m, (1024 + 64) MiB
    assert usage(code["etl-nightly-28930860-q9wzl"]) == (pytest.approx(0.5, rel=0.03),
                                                         pytest.approx(1088 / 4096, rel=1e-12))
    assert usage(code["redis-0"]) is None  # running, but the kubelet has no series of it


@needs_prometheus
def test_failing_pod_queries_leave_node_telemetry_up(cluster: tuple[NodeExporterSim, PrometheusServer],
                                                     kubelet: KubeletSim,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _sim, prom = cluster
    tel = PrometheusTelemetry(prom.url, pod_rate_window=POD_TEST_WINDOW)
    good = converge_pods(tel, pod_totals(KUBELET_PODS))
    real = tel._prom.custom_query

    def refusing(query: str, *args, **kwargs):
        if "container_" in query:
            raise RuntimeError("per-pod query refused")
        return real(query, *args, **kwargs)

    monkeypatch.setattr(tel._prom, "custom_query", refusing)
    snap = tel.refresh()
    assert snap.up and snap.error == "" and {"node-a", "node-b"} <= set(snap.nodes)
    assert snap.pods is good.pods and "per-pod query refused" in snap.pods_error
    monkeypatch.undo()
    again = tel.refresh()
    assert again.up and again.pods_error == "" and set(again.pods) == set(good.pods)
