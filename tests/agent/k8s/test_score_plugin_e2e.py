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

The plugin binary is an extra build: when it cannot be had the tests skip with the reason
(a failure under CI, :mod:`tests.require_services`), as the control plane's binaries do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import requests
import yaml

from bench.harness.control_plane import K8S_BIN, KubeScheduler, kube_scheduler, warnings_off
from bench.harness.extender_client import metric
from bench.harness.polling import wait_for
from bench.harness.ports import free_port
from bench.harness.processes import tail
from bench.harness.serve import serve_process
from tests.agent.k8s.test_real_kube_scheduler import (  # noqa: F401 (cluster: the module fixture)
    NAMESPACE,
    SCHEDULER,
    SVC_HOST,
    Cluster,
    cluster,
    create_pods,
    openb_pod,
    sample,
    wait_bound,
)
from tests.k8s_support import notice
from tests.paths import REPO

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


def plugin_config(c: Cluster, grpc_port: int) -> dict:
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
                "deadline": DEADLINE,
                "mode": "scores",
                "fallback": "LeastAllocated",
                "normalization": "None",
                "tls": {"caFile": str(c.ca), "certFile": str(c.client.cert), "keyFile": str(c.client.key),
                        "serverName": SVC_HOST},
            }}],
        }],
    }


@contextlib.contextmanager
def plugin_scheduler(c: Cluster, bin_dir: Path, root: Path, grpc_port: int) -> Iterator[KubeScheduler]:
    path = root / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump(plugin_config(c, grpc_port), sort_keys=False))
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


def plugin_results(text: str) -> dict[str, float]:
    """{result: count} of ``fedsched_score_plugin_requests_total``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == PLUGIN_METRIC:
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
                before = plugin_results(scheduler_metrics(c, ks))
                bound = run_pods(c, "scored", seed=5)
                assert len(bound) == N_PODS
                agent = score_nodes_ok(c, sp.port) - before_agent
                after = plugin_results(scheduler_metrics(c, ks))
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
