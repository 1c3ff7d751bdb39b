"""The agent chart's extender as the chart runs it: its container's command and arguments, its
seed-policy init container, its exec probes and its ``helm test`` commands, against a real
``fedsched serve`` process in cluster mode.

No API server can run here, so the one addition to the container's arguments is
``--kubeconfig`` pointing at the tests' local server that speaks the Kubernetes list/watch API
(``tests/k8s_api_stub_server.py``); everything else is the rendered manifest with its mount
points, port and Service name mapped to a temporary directory and a loopback port
(:class:`bench.harness.charts.Localizer`). kube-scheduler's side of the link is built
from the chart's KubeSchedulerConfiguration (``tlsConfig`` files and ``serverName``,
``urlPrefix``): filter and prioritize go over that mutual TLS, and the ``/metrics`` they leave
behind must name every metric the chart's Grafana dashboard queries.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from bench.harness.charts import AGENT, NAMESPACE, Localizer, documents, fullname, one, tls_secret
from bench.harness.polling import wait_for
from bench.harness.ports import free_port
from bench.harness.serve import ServeProcess, serve_process
from fedsched.common.security import certs
from tests.agent.cluster.test_k8s_watch import write_kubeconfig
from tests.agent.serving.test_scheduler_config import load_config
from tests.charts.chart_support import argv, container, dashboard_queries, render_ci
from tests.k8s_api_stub_server import KubeAPIStub
from tests.paths import TEST_DATA

FULL = fullname(AGENT)
SVC_HOST = f"{FULL}-extender.{NAMESPACE}.svc"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}


@dataclass
class Extender:
    sp: ServeProcess
    loc: Localizer
    docs: list[dict]
    intruder: certs.CertFiles
    port: int

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        local = self.loc.argv(cmd)
        assert local[0] == "python"
        return subprocess.run([sys.executable, *local[1:]], capture_output=True, text=True, timeout=30,
                              check=False)


@pytest.fixture(scope="module")
def extender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Extender]:
    root = tmp_path_factory.mktemp("extender")
    docs = documents(render_ci(AGENT, "defaults-values.yaml"))
    dep = one(docs, "Deployment", FULL)
    scripts = one(docs, "ConfigMap", f"{FULL}-scripts")
    pki, other = root / "pki", root / "other"
    certs.init_ca(pki)
    certs.init_ca(other)
    ca = certs.ca_files(pki).cert
    server = certs.issue(pki, "fedsched-extender", kind="server", hosts=[SVC_HOST]).files
    client = certs.issue(pki, "kube-scheduler", kind="client").files
    intruder = certs.issue(other, "kube-scheduler", kind="client").files
    (root / "scripts").mkdir()
    (root / "scripts" / "probe.py").write_text(scripts["data"]["probe.py"])
    port = free_port()
    loc = Localizer(
        paths={"/var/lib/fedsched": root / "data", "/etc/fedsched/extender-tls": tls_secret(
                   root / "extender-tls", server, ca),
               "/etc/fedsched/probe": tls_secret(root / "probe", client, ca),
               "/etc/fedsched/tls": root / "probe", "/etc/fedsched/scripts": root / "scripts"},
        addresses={"0.0.0.0": "127.0.0.1", f"{SVC_HOST}:8443": f"127.0.0.1:{port}"},
        ports={8443: port})
    (root / "data").mkdir()
    seed = container(dep, "seed-policy")["command"]
    subprocess.run([sys.executable, *loc.argv(seed)[1:]], check=True, timeout=120)
    nodes = json.loads((TEST_DATA / "k8s" / "nodes.json").read_text())["items"]
    pods = json.loads((TEST_DATA / "k8s" / "pods.json").read_text())["items"]
    args = loc.argv(argv(container(dep, "extender")))
    assert args[:2] == ["fedsched", "serve"]
    with KubeAPIStub(nodes, pods) as api:
        kubeconfig = write_kubeconfig(root / "kubeconfig", api.url)
        with serve_process(*args[2:], "--kubeconfig", str(kubeconfig)) as sp:
            yield Extender(sp, loc, docs, intruder, port)


def test_the_startup_readiness_and_liveness_probes_pass(extender: Extender) -> None:
    c = container(one(extender.docs, "Deployment", FULL), "extender")
    wait_for(lambda: extender.run(c["startupProbe"]["exec"]["command"]).returncode == 0, 60, 0.5,
             "the extender's startup probe")
    for probe in ("readinessProbe", "livenessProbe"):
        res = extender.run(c[probe]["exec"]["command"])
        assert res.returncode == 0, res.stdout + res.stderr
        assert ": 200 " in res.stdout


def test_the_helm_test_passes(extender: Extender) -> None:
    pod = one(extender.docs, "Pod", f"{FULL}-test")
    wait_for(lambda: extender.run(container(pod, "with-certificate")["command"]).returncode == 0, 60, 0.5,
             "the extender ready")
    res = extender.run(container(pod, "without-certificate")["command"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "refused without a client certificate" in res.stdout


def test_a_certificate_of_another_ca_is_refused(extender: Extender) -> None:
    c = container(one(extender.docs, "Deployment", FULL), "extender")
    cmd = extender.loc.argv(c["readinessProbe"]["exec"]["command"])
    cmd[3:5] = [str(extender.intruder.cert), str(extender.intruder.key)]
    res = subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 1, res.stdout + res.stderr


def scheduler_call(extender: Extender, method: str, path: str,
                   body: object | None = None) -> tuple[int, bytes]:
    """One request as kube-scheduler makes it with the chart's KubeSchedulerConfiguration
    (``path`` relative to its urlPrefix when it starts with ``verb:``)."""
    cfg = load_config(one(extender.docs, "ConfigMap", f"{FULL}-scheduler")["data"]["config.yaml"])
    (ext,) = cfg.extenders
    tls = ext.tlsConfig
    assert tls is not None
    ctx = ssl.create_default_context(cafile=str(extender.loc.path(tls.caFile)))
    ctx.load_cert_chain(str(extender.loc.path(tls.certFile)), str(extender.loc.path(tls.keyFile)))
    url = urlsplit(ext.urlPrefix)
    raw = socket.create_connection(("127.0.0.1", extender.port), timeout=10)
    conn = http.client.HTTPConnection(tls.serverName, url.port, timeout=10)
    conn.sock = ctx.wrap_socket(raw, server_hostname=tls.serverName)  # verified for the Service name
    try:
        data = json.dumps(body).encode() if body is not None else None
        target = f"{url.path}/{path.removeprefix('verb:')}" if path.startswith("verb:") else path
        conn.request(method, target, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def exported_metric_names(text: str) -> set[str]:
    """Series names a scrape of this /metrics text can hold, from its ``# TYPE`` lines."""
    names = set()
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
        name, kind = m.groups()
        if kind == "counter":
            names |= {name, f"{name}_total"}
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def promql_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels, strings out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    tokens = re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?", e)
    out = {t.group(0) for t in tokens if not t.group(1) and t.group(0) not in PROMQL_WORDS}
    return {n for n in out if not n.startswith("namespace")} | (
        {m.group(1) for m in re.finditer(r"label_values\((\w+)", expr)})


def test_every_dashboard_query_names_a_metric_the_extender_exports(extender: Extender) -> None:
    pods = json.loads((TEST_DATA / "k8s" / "pods.json").read_text())["items"]
    pod = next(p for p in pods if p["metadata"]["name"].startswith("llama-finetune"))
    pod["spec"]["schedulerName"] = "fedsched"
    names = ["gpu-v100-0", "cpu-node-a"]
    wait_for(lambda: scheduler_call(extender, "GET", "/readyz")[0] == 200, 60, 0.5, "the extender ready")
    for verb in ("filter", "prioritize"):
        status, out = scheduler_call(extender, "POST", f"verb:{verb}", {"Pod": pod, "NodeNames": names})
        assert status == 200, out
    status, text = scheduler_call(extender, "GET", "/metrics")
    assert status == 200
    exported = exported_metric_names(text.decode())
    assert "fedsched_decision_seconds_bucket" in exported and "fedsched_shadow_decisions_total" in exported
    queries = dashboard_queries()
    used: set[str] = set()
    for name, q in queries:
        metrics = promql_metrics(q)
        assert metrics, (name, q)
        missing = metrics - exported
        assert not missing, f"{name}: {q} names {missing}, not exported by fedsched serve"
        used |= metrics
    # The panels the issue asks for each read their metric.
    assert {"fedsched_decision_seconds_bucket", "fedsched_fallbacks_total", "fedsched_refused_nodes_total",
            "fedsched_model_info", "fedsched_telemetry_age_seconds",
            "fedsched_shadow_decisions_total"} <= used
    # The decision was made in the chart's default mode, shadow.
    assert re.search(r'^fedsched_decisions_total\{mode="shadow"', text.decode(), re.M)
