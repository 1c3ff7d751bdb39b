"""The Go Score plugin (``agent/scoreplugin``, kube-scheduler v1.37.2 with ``FedschedScore``)
calling a real ``fedsched serve`` over gRPC with mutual TLS, on the real control plane.

What runs, all on loopback (the fixtures and helpers of :mod:`tests.agent.k8s.test_real_kube_scheduler`):

- etcd + kube-apiserver (the session fixture ``k8s``) with the 40-node openb slice registered as
  Nodes (its module fixture ``cluster``, which also issues the certificates with ``fedsched
  certs``: the agent's serving certificate for the extender Service name and 127.0.0.1, a client
  certificate for kube-scheduler);
- ``fedsched serve --kubeconfig --grpc-port`` with mutual TLS, ``--gate off --mode active``;
- ``kube-scheduler-fedsched`` (``bash agent/scoreplugin/build.sh``, idempotent) with a
  KubeSchedulerConfiguration whose one profile ``fedsched`` enables ``FedschedScore`` in mode
  ``scores`` as ``agent/scoreplugin/examples/scheduler-config.yaml`` does, with a 200 ms deadline
  (the machine is shared with the control plane).

The safety filter (the plugin's PreFilter/Filter asking the agent's ``FilterNodes``) is tested
as the extender's refusals are (:mod:`tests.agent.k8s.test_real_kube_scheduler`), on live
telemetry: simulated node-exporters for every node scraped by the real ``prometheus`` with the
shipped recording rules (windows shortened to 5 s, :mod:`tests.prometheus_support`), read by the
agent with ``--prometheus``.

The plugin binary is an extra build: when it cannot be had the tests skip with the reason
(a failure under CI, :mod:`tests.require_services`), as the control plane's binaries do; so
does the safety-filter test without ``prometheus``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from bench.harness.control_plane import K8S_BIN, KubeScheduler, kube_scheduler, warnings_off
from bench.harness.extender_client import metric
from bench.harness.polling import wait_for
from bench.harness.ports import free_port
from bench.harness.processes import tail
from bench.harness.serve import serve_process
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.grpc_service import DecisionClient
from fedsched.common.model.cluster import ClusterState, Pod
from tests.agent.k8s.test_real_kube_scheduler import (  # noqa: F401 (cluster: the module fixture)
    NAMESPACE,
    SCHEDULER,
    SVC_HOST,
    Cluster,
    cluster,
    create_pods,
    node_of,
    openb_pod,
    sample,
    wait_bound,
)
from tests.k8s_support import notice
from tests.paths import REPO
from tests.prometheus_support import (
    PROMETHEUS,
    RULES_FILE,
    NodeExporterSim,
    rules_with_window,
    running_prometheus,
)

PLUGIN_BUILD = REPO / "agent" / "scoreplugin" / "build.sh"
PLUGIN_BIN = K8S_BIN / "kube-scheduler-fedsched"
N_PODS = 20
#: Pods whose ScoreNodes may go uncounted by the agent (a cycle past the deadline on a loaded host).
SLACK = 3
DEADLINE = "200ms"
PLUGIN_METRIC = "fedsched_score_plugin_requests_total"


def plugin_binary() -> Path:
    """``.k8s/bin/kube-scheduler-fedsched``, built (or found up to date) by ``build.sh``; a skip
    with the reason when it cannot be had."""
    if shutil.which("go") is None:
        if os.access(PLUGIN_BIN, os.X_OK):
            return PLUGIN_BIN
        pytest.skip(f"{PLUGIN_BIN} missing and go is not on PATH to build it (bash {PLUGIN_BUILD})")
    log_path = K8S_BIN.parent / "scoreplugin-build.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if not PLUGIN_BIN.exists():
        notice(f"building {PLUGIN_BIN} (bash {PLUGIN_BUILD}; log in {log_path})")
    with log_path.open("wb") as log:
        rc = subprocess.run(["bash", str(PLUGIN_BUILD)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                            check=False).returncode
    if rc != 0 or not os.access(PLUGIN_BIN, os.X_OK):
        pytest.skip(f"bash {PLUGIN_BUILD} failed (exit {rc}): {tail(log_path, 1500)}")
    return PLUGIN_BIN


@pytest.fixture(scope="module")
def plugin_bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bin folder whose ``kube-scheduler`` is the plugin build, for
    :func:`bench.harness.control_plane.kube_scheduler` (which runs ``cp.bin / "kube-scheduler"``)."""
    binary = plugin_binary()
    d = tmp_path_factory.mktemp("scoreplugin-bin")
    (d / "kube-scheduler").symlink_to(binary)
    return d


def plugin_config(c: Cluster, grpc_port: int, safety_filter: bool = True, deadline: str = DEADLINE) -> dict:
    """The example configuration's ``fedsched`` profile, on loopback, no leader election."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(c.cp.kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{
            "schedulerName": SCHEDULER,
            "plugins": {"multiPoint": {"enabled": [{"name": "FedschedScore", "weight": 5}]}},
            "pluginConfig": [{"name": "FedschedScore", "args": {
                "address": f"127.0.0.1:{grpc_port}",
                "deadline": deadline,
                "mode": "scores",
                "fallback": "LeastAllocated",
                "normalization": "None",
                "safetyFilter": safety_filter,
                "tls": {"caFile": str(c.ca), "certFile": str(c.client.cert), "keyFile": str(c.client.key),
                        "serverName": SVC_HOST},
            }}],
        }],
    }


@contextlib.contextmanager
def plugin_scheduler(c: Cluster, bin_dir: Path, root: Path, grpc_port: int, safety_filter: bool = True,
                     deadline: str = DEADLINE) -> Iterator[KubeScheduler]:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump(plugin_config(c, grpc_port, safety_filter, deadline), sort_keys=False))
    name = f"kube-scheduler-fedsched-{root.name}"
    ks = None
    try:
        with kube_scheduler(replace(c.cp, bin=bin_dir), name, [f"--config={path}", "--v=2"]) as ks:
            yield ks
    finally:
        (root / "kube-scheduler.log").write_text(ks.log_text() if ks else "")


def scheduler_metrics(c: Cluster, ks: KubeScheduler) -> str:
    """kube-scheduler's /metrics (delegated authentication: the admin token)."""
    with warnings_off(), requests.Session() as s:
        s.trust_env = False
        r = s.get(f"https://127.0.0.1:{ks.port}/metrics", timeout=10, verify=False,
                  headers={"Authorization": f"Bearer {c.cp.token}"})
    r.raise_for_status()
    return r.text


def plugin_results(text: str, mode: str | None = None) -> dict[str, float]:
    """{result: count} of ``fedsched_score_plugin_requests_total`` (of one ``mode``: scores,
    weights, filter; None: all)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == PLUGIN_METRIC and mode in (None, s.labels["mode"]):
                out[s.labels["result"]] = out.get(s.labels["result"], 0.0) + s.value
    return out


def accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def agent_get(c: Cluster, port: int, path: str) -> requests.Response:
    """A request to ``fedsched serve`` with kube-scheduler's client certificate (mutual TLS)."""
    with requests.Session() as s:
        s.trust_env = False
        return s.get(f"https://127.0.0.1:{port}{path}", timeout=10, verify=str(c.ca),
                     cert=(str(c.client.cert), str(c.client.key)))


def score_nodes_ok(c: Cluster, port: int) -> float:
    text = agent_get(c, port, "/metrics").text
    return metric(text, "fedsched_requests_total", verb="ScoreNodes", code="OK")


def run_pods(c: Cluster, prefix: str, seed: int) -> dict[str, dict]:
    objs = [openb_pod(c, i, f"{prefix}-{k:02d}") for k, i in enumerate(sample(c, N_PODS, seed=seed))]
    create_pods(c, objs)
    return wait_bound(c, [o["metadata"]["name"] for o in objs], 60)


def test_the_plugin_scores_with_the_agent(cluster: Cluster, plugin_bin_dir: Path,  # noqa: F811
                                          tmp_path: Path) -> None:
    """Every pod bound; the agent answered ScoreNodes for (nearly) every one, and the plugin
    counted its answers as ``result="ok"``."""
    c = cluster
    grpc_port = free_port()
    t0 = time.monotonic()
    try:
        with serve_process(
            "--policy", str(c.policy), "--kubeconfig", str(c.cp.kubeconfig), "--host", "127.0.0.1",
            "--port", "0", "--grpc-port", str(grpc_port),
            "--tls-cert", str(c.server.cert), "--tls-key", str(c.server.key), "--client-ca", str(c.ca),
            "--gate", "off", "--mode", "active", "--scheduler-name", SCHEDULER,
            "--watch-policy", "0", "--log-format", "text", stderr_path=tmp_path / "serve.log",
        ) as sp:
            wait_for(lambda: agent_get(c, sp.port, "/readyz").status_code == 200, 30, 0.2,
                     "the agent's cache synced from the API server")
            wait_for(lambda: accepts(grpc_port), 30, 0.2, f"the agent's gRPC port {grpc_port} accepting")
            with plugin_scheduler(c, plugin_bin_dir, tmp_path, grpc_port) as ks:
                before_agent = score_nodes_ok(c, sp.port)
                before = plugin_results(scheduler_metrics(c, ks), mode="scores")
                bound = run_pods(c, "scored", seed=5)
                assert len(bound) == N_PODS
                agent = score_nodes_ok(c, sp.port) - before_agent
                after = plugin_results(scheduler_metrics(c, ks), mode="scores")
                ok = after.get("ok", 0.0) - before.get("ok", 0.0)
                others = {k: v - before.get(k, 0.0) for k, v in after.items() if k != "ok"}
                assert agent >= N_PODS - SLACK, (agent, after, tail(ks.log, 2000))
                assert ok > 0, (after, tail(ks.log, 2000))
                assert ok >= N_PODS - SLACK, (ok, others)
                print(f"\nplugin with the agent: {N_PODS} pods bound {time.monotonic() - t0:.1f}s after the "
                      f"agent started; "
                      f"agent ScoreNodes OK +{agent:.0f}; plugin ok +{ok:.0f}, fallbacks {others}")
    finally:
        c.api.delete_pods(NAMESPACE)


def test_with_the_agent_down_the_plugin_falls_back(cluster: Cluster, plugin_bin_dir: Path,  # noqa: F811
                                                   tmp_path: Path) -> None:
    """No agent listens on the plugin's address: every pod is still bound (the LeastAllocated
    fallback scores it) and the plugin counts only non-ok results."""
    c = cluster
    grpc_port = free_port()  # nothing listens there
    try:
        with plugin_scheduler(c, plugin_bin_dir, tmp_path, grpc_port) as ks:
            bound = run_pods(c, "fallback", seed=6)
            assert len(bound) == N_PODS
            results = plugin_results(scheduler_metrics(c, ks))
            assert results.get("ok", 0.0) == 0, results
            failed = sum(v for k, v in results.items() if k != "ok")
            assert failed >= N_PODS - SLACK, results
            print(f"\nplugin, agent down: {N_PODS} pods bound by the fallback; plugin results {results}")
    finally:
        c.api.delete_pods(NAMESPACE)


# ---- the safety filter: the plugin's Filter refuses what the agent's filter refuses -------------

# Measured CPU shares, and the agent's hard limit between them. The shipped rule divides the busy
# modes' rate by the CPU count, so a scrape that a loaded machine runs late (its counters read past
# the scrape's timestamp) moves a node's measured share by the delay over the rule's window: on a
# loaded machine a hot node read below the default 0.9 limit now and then and took a pod (seen
# beside three busy loops). The limit half-way and a 15 s window keep each node on its side.
# The 40 exporters answer from this one Python process: with a series per CPU and mode (up to a
# thousand on openb's largest nodes) scraped every second they missed their 1 s scrape timeout
# on an idle machine too, and the largest nodes (the hot ones) had no telemetry at all. The
# measured share does not depend on the CPU count, so each exporter shows 8 CPUs, every 2 s.
HOT_CPU, COOL_CPU = 1.0, 0.30
CPU_LIMIT = "0.60"
RULE_WINDOW, SCRAPE_INTERVAL, SIM_CPUS = "15s", "2s", 8
N_HOT = 9
CPU_REFUSAL = re.compile(rf"cpu utilisation \d+\.\d\d > {re.escape(CPU_LIMIT)}")  # a hot node's reason
#: The plugin's longest deadline: the Filter fails open, so a FilterNodes call that a loaded
#: machine makes late lets its pod through to any node.
SAFETY_DEADLINE = "1s"


def pods_for_cool_nodes(c: Cluster, hot: set[str], n: int, seed: int) -> list[int]:
    """``n`` openb pods (indices into ``c.pods``) each of which fits an empty node that is not hot,
    so that refusing the hot nodes leaves every pod a place."""
    cool = ClusterState(c.nodes.select(np.flatnonzero([name not in hot for name in c.nodes.names])))
    fit = [i for i in range(len(c.pods)) if cool.feasible(Pod.from_table(c.pods, i)).any()]
    return sorted(np.random.default_rng(seed).choice(fit, n, replace=False).tolist())


def create_and_bind(c: Cluster, prefix: str, pods: list[int]) -> dict[str, dict]:
    objs = [openb_pod(c, i, f"{prefix}-{k:02d}") for k, i in enumerate(pods)]
    create_pods(c, objs)
    return wait_bound(c, [o["metadata"]["name"] for o in objs], 60)


@contextlib.contextmanager
def node_telemetry(c: Cluster, root: Path, hot: set[str]) -> Iterator[str]:
    """A simulated node-exporter for every node (``hot`` ones at 100% CPU, the others at 30%),
    scraped by the real Prometheus with the shipped rules; yields Prometheus' URL."""
    if PROMETHEUS is None:
        pytest.skip("prometheus not found on PATH (apt-get install prometheus)")
    with NodeExporterSim() as sim:
        for name in c.nodes.names:
            sim.add_node(name, cpu=HOT_CPU if name in hot else COOL_CPU, mem=0.4, disk_mbs=10.0,
                         net_mbits=100.0, cpus=SIM_CPUS)
        with running_prometheus(root / "prometheus", [sim.scrape_config()],
                                rules_with_window(RULES_FILE.read_text(), RULE_WINDOW),
                                interval=SCRAPE_INTERVAL) as prom:
            yield prom.url


def test_nodes_above_the_hard_cpu_limit_never_get_a_pod_through_the_plugin(
        cluster: Cluster, plugin_bin_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """The 9 largest nodes run at 100% measured CPU, above the agent's hard limit (60% here). With the
    plugin's safety filter no pod is bound to one of them (but a pod whose ``FilterNodes`` went
    unanswered: the Filter fails open; at most SLACK, none on an idle machine): the agent answered
    for the pods, refusing those nodes for their CPU, and the plugin counted its answers. The control,
    ``safetyFilter: false`` (the plugin scoring only, as before it had a Filter), binds some of the
    same kind of pods to hot nodes: kube-scheduler's other scores make them win.

    The agent runs in ``--mode shadow``: it answers ScoreNodes with kube-default scores, which do
    not look at measured use, so only the Filter keeps the pods off the hot nodes."""
    c = cluster
    order = np.argsort(-c.nodes.cpu, kind="stable")
    hot = {c.nodes.names[j] for j in order[:N_HOT]}
    names = list(c.nodes.names)
    pods = pods_for_cool_nodes(c, hot, N_PODS, seed=7)
    grpc_port = free_port()
    tls = (c.ca, c.client.cert, c.client.key)
    probe = pod_to_json(Pod(-1, 100, 100, 0, 0, 0, 1), "probe", scheduler_name=SCHEDULER)
    try:
        with node_telemetry(c, tmp_path, hot) as prom, serve_process(
            "--policy", str(c.policy), "--kubeconfig", str(c.cp.kubeconfig), "--host", "127.0.0.1",
            "--port", "0", "--grpc-port", str(grpc_port),
            "--tls-cert", str(c.server.cert), "--tls-key", str(c.server.key), "--client-ca", str(c.ca),
            "--gate", "off", "--mode", "shadow", "--scheduler-name", SCHEDULER,
            "--cpu-threshold", CPU_LIMIT, "--prometheus", prom, "--telemetry-interval", "1",
            "--stale-after", "30",
            "--watch-policy", "0", "--log-format", "text", stderr_path=tmp_path / "serve.log",
        ) as sp, DecisionClient(f"127.0.0.1:{grpc_port}", tls=tls, server_name=SVC_HOST) as client:
            wait_for(lambda: agent_get(c, sp.port, "/readyz").status_code == 200, 30, 0.2,
                     "the agent's cache synced from the API server")

            seen: list[dict[str, str]] = [{}]

            def hot_refused() -> dict[str, str] | None:
                # Each exporter is scraped on its own phase: wait until every node has a CPU rate.
                # The rate is not exactly 1.00 on a loaded machine (a late scrape answers with a
                # counter that ran past its timestamp), so any refusal for CPU above the limit counts.
                refused = seen[0] = client.filter_nodes(probe, names, timeout=10)
                return refused if set(refused) == hot and all(
                    CPU_REFUSAL.search(r) for r in refused.values()) else None

            try:
                wait_for(hot_refused, 90, 0.5, f"the agent refusing exactly the {N_HOT} hot nodes for CPU")
            except TimeoutError as e:
                raise AssertionError(f"{e}; hot: {sorted(hot)}; last refused: {seen[0]}; agent log: "
                                     f"{tail(tmp_path / 'serve.log', 3000)}") from None

            def agent_count(name: str, **labels: str) -> float:
                return metric(agent_get(c, sp.port, "/metrics").text, name, **labels)

            with plugin_scheduler(c, plugin_bin_dir, tmp_path / "filter-on", grpc_port,
                                  deadline=SAFETY_DEADLINE) as ks:
                filter_ok = agent_count("fedsched_requests_total", verb="FilterNodes", code="OK")
                cpu_refused = agent_count("fedsched_refused_nodes_total", reason="cpu")
                bound = create_and_bind(c, "safe", pods)
                assert len(bound) == N_PODS
                on_hot = sorted(f"{n} -> {node_of(p)}" for n, p in bound.items() if node_of(p) in hot)
                answered = agent_count("fedsched_requests_total", verb="FilterNodes", code="OK") - filter_ok
                refused = agent_count("fedsched_refused_nodes_total", reason="cpu") - cpu_refused
                plugin = plugin_results(scheduler_metrics(c, ks), mode="filter")
                # Only a pod whose FilterNodes went unanswered (the Filter failed open) may be on a
                # hot node; on an idle machine there is none.
                unanswered = sum(v for k, v in plugin.items() if k != "ok")
                assert len(on_hot) <= unanswered <= SLACK, (on_hot, plugin, tail(ks.log, 2000))
                assert answered >= N_PODS - SLACK, (answered, plugin)
                # Each answer refused hot nodes for their CPU: all 9, but for a GPU pod a hot node
                # without room for its GPUs, which the filter checks first, is refused for that.
                assert refused >= answered, (refused, answered)
                assert plugin.get("ok", 0.0) >= N_PODS - SLACK, plugin
            safe_on_hot = on_hot
            c.api.delete_pods(NAMESPACE)
            with plugin_scheduler(c, plugin_bin_dir, tmp_path / "filter-off", grpc_port,
                                  safety_filter=False, deadline=SAFETY_DEADLINE) as ks:
                bound = create_and_bind(c, "unsafe", pods)
                on_hot = sorted(node_of(p) for p in bound.values() if node_of(p) in hot)
                assert on_hot, "without the Filter no pod chose a hot node: the test shows nothing"
                assert plugin_results(scheduler_metrics(c, ks), mode="filter") == {}
            print(f"\nsafety filter through the plugin: {N_PODS} pods, {len(safe_on_hot)} on the {N_HOT} hot "
                  f"nodes (the agent answered FilterNodes {answered:.0f} times, refused {refused:.0f} hot "
                  f"nodes, {unanswered:.0f} unanswered); without it {len(on_hot)} of the same pods went to "
                  "hot nodes")
    finally:
        c.api.delete_pods(NAMESPACE)
