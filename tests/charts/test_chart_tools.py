"""The rendered charts through the real tools: ``kubernetes-validate --strict`` (the API
schemas of Kubernetes 1.30 and 1.37), ``checkov`` (offline, on the manifests and the
Dockerfile) with a short documented skip list, ``promtool check rules`` on the PrometheusRule
and on every dashboard query, and ``nginx -t`` on the gateway config the hub chart renders.

Each tool runs once per check over every CI values file's render of both charts (one combined
file), which keeps the whole module to a few seconds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness.charts import AGENT, HUB, NAMESPACE, Localizer, documents, fullname, one
from fedsched.common.security import certs
from fedsched.coordinator import chart_configs
from tests.charts.chart_support import (
    CRD_KINDS,
    checkov_bin,
    ci_files,
    dashboard_queries,
    promtool_bin,
    render_ci,
)
from tests.flower_support import NGINX
from tests.paths import REPO

KUBE_VERSIONS = ("1.30.0", "1.37.0")
#: checkov checks skipped for every resource, and why. Resource-specific exceptions are
#: annotations (checkov.io/skipN) on the objects themselves, each with its reason.
CHECKOV_SKIPS = {
    "CKV_K8S_15": "imagePullPolicy Always: the charts pin release tags (or digests via image.digest); "
                  "IfNotPresent is right for immutable tags",
    "CKV_K8S_43": "image digests: no fedsched image is published to pin; image.digest / "
                  "gateway.image.digest take one where a registry has it",
    "CKV_DOCKER_2": "HEALTHCHECK: Kubernetes ignores it; the charts give each container its own probes "
                    "(one image, several roles)",
}


@pytest.fixture(scope="module")
def combined(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """chart -> one multi-document file with the objects of every CI values file's render."""
    out = tmp_path_factory.mktemp("renders")
    files = {}
    for chart in (HUB, AGENT):
        docs = [d for f in ci_files(chart) for d in documents(render_ci(chart, f.name))]
        files[chart] = out / f"{chart}.yaml"
        files[chart].write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return files


def all_docs(files: dict[str, Path]) -> list[dict[str, Any]]:
    return [d for p in files.values() for d in yaml.safe_load_all(p.read_text()) if d]


# ---- kubernetes-validate ------------------------------------------------------------------------

def test_kubernetes_validate_strict_accepts_every_manifest(combined: dict[str, Path]) -> None:
    pytest.importorskip("kubernetes_validate",
                        reason="kubernetes-validate not installed (pip install -e '.[dev]')")
    cli = Path(sys.executable).parent / "kubernetes-validate"
    args = [str(cli), "--strict"]
    for v in KUBE_VERSIONS:
        args += ["-k", v]
    res = subprocess.run([*args, *map(str, combined.values())], capture_output=True, text=True, timeout=120,
                         check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    docs = all_docs(combined)
    builtin = [d for d in docs if d["kind"] not in CRD_KINDS]
    assert out.count(" passed") == len(builtin) * len(KUBE_VERSIONS), out[-3000:]
    warnings = [line for line in out.splitlines() if line.startswith("WARN")]
    crd_only = re.compile(r"schema for kind (Certificate|ServiceMonitor|PrometheusRule) ")
    assert all(crd_only.search(w) for w in warnings), warnings
    assert not [line for line in out.splitlines() if line.startswith(("ERROR", "FAIL"))]


def test_kubernetes_validate_strict_does_refuse_an_unknown_field() -> None:
    """The control for the test above: strict mode catches a misplaced field in our objects."""
    kv = pytest.importorskip("kubernetes_validate")
    dep = one(documents(render_ci(HUB, "defaults-values.yaml")), "Deployment", f"{fullname(HUB)}-superlink")
    kv.validate(dep, KUBE_VERSIONS[-1], strict=True)
    dep["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True  # misspelt
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, KUBE_VERSIONS[-1], strict=True)


# ---- checkov ---------------------------------------------------------------------------------------

def test_checkov_passes_with_the_documented_skips(combined: dict[str, Path], tmp_path: Path) -> None:
    checkov = checkov_bin()
    if checkov is None:
        pytest.skip("checkov not found (scripts/test.sh installs it into .venv/checkov, "
                    "or set FEDSCHED_CHECKOV)")
    args = [checkov, "--framework", "kubernetes", "dockerfile", "--skip-download", "--quiet", "--compact",
            "-o", "json", "--skip-check", ",".join(CHECKOV_SKIPS), "-f", str(REPO / "Dockerfile")]
    for f in combined.values():
        args += ["-f", str(f)]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    reports = json.loads(res.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    (docker,) = [r for r in reports if r["check_type"] == "dockerfile"]
    assert not docker["results"]["failed_checks"], docker["results"]["failed_checks"]
    assert docker["summary"]["passed"] > 50 and docker["summary"]["parsing_errors"] == 0
    (k8s,) = [r for r in reports if r["check_type"] == "kubernetes"]
    summary, results = k8s["summary"], k8s["results"]
    failed = [(c["check_id"], c["check_name"], c["resource"]) for c in results["failed_checks"]]
    assert not failed, failed
    assert summary["parsing_errors"] == 0 and summary["passed"] > 1000
    unique = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in all_docs(combined)}
    assert summary["resource_count"] >= len(unique)  # every object was scanned
    # Every in-chart exception says why.
    for c in results.get("skipped_checks", []):
        assert c["check_id"] in CHECKOV_SKIPS or len((c.get("check_result") or {}).get(
            "suppress_comment", "")) > 20, c


# ---- promtool ------------------------------------------------------------------------------------------

def promtool() -> str:
    path = promtool_bin()
    if path is None:
        pytest.skip("promtool not found on PATH (apt-get install prometheus)")
    return path


def test_promtool_accepts_the_prometheus_rule(tmp_path: Path) -> None:
    tool = promtool()
    docs = documents(render_ci(AGENT, "active-monitoring-values.yaml"))
    rule = one(docs, "PrometheusRule", f"{fullname(AGENT)}-recording-rules")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    res = subprocess.run([tool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 2 rules found" in res.stdout + res.stderr
    records = [r["record"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert records == ["instance:node_cpu:ratio", "instance:node_memory_utilisation:ratio"]


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    tool = promtool()
    queries = [(name, q) for name, q in dashboard_queries() if not q.startswith("label_values(")]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"fedsched:dashboard:q{i}", "expr": q.replace("$namespace", NAMESPACE)}
        for i, (_, q) in enumerate(queries)]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    res = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(queries)} rules found" in res.stdout + res.stderr
    panels = {name.split("/")[0] for name, _ in queries}
    for topic in ("latency", "Fallbacks", "Refused", "Model version", "Telemetry", "Shadow"):
        assert any(topic in p for p in panels), (topic, panels)


# ---- nginx -t -------------------------------------------------------------------------------------

def test_nginx_accepts_the_rendered_gateway_config(tmp_path: Path) -> None:
    if NGINX is None:
        pytest.skip("nginx not found on PATH (apt-get install nginx)")
    docs = documents(render_ci(HUB, "defaults-values.yaml"))
    conf = one(docs, "ConfigMap", f"{fullname(HUB)}-gateway")["data"]["nginx.conf"]
    svc = chart_configs.superlink_host(fullname(HUB), NAMESPACE)
    # The Secrets' files where the pod mounts them; the Service name resolves only in a cluster.
    pki = tmp_path / "pki"
    certs.init_ca(pki, hub_hosts=["localhost", svc])
    gw, up, work = tmp_path / "gateway", tmp_path / "superlink-ca", tmp_path / "work"
    for d in (gw, up, work):
        d.mkdir()
    for name in (certs.CA_CRT, certs.HUB_CRT, certs.HUB_KEY):
        (gw / name).write_bytes((pki / name).read_bytes())
    (up / "ca.crt").write_bytes((pki / certs.CA_CRT).read_bytes())
    upstream_dir = str(Path(chart_configs.GATEWAY_UPSTREAM_CA).parent)
    loc = Localizer(paths={chart_configs.GATEWAY_CERTS_DIR: gw, upstream_dir: up,
                           chart_configs.GATEWAY_WORKDIR: work},
                    addresses={f"{svc}:8000": "127.0.0.1:8000"})
    local = loc.text(conf)
    assert local.count(str(tmp_path)) >= 9 and "/etc/fedsched" not in local
    assert f"proxy_ssl_name {svc};" in local  # the SuperLink is still verified for its Service name
    path = work / "nginx.conf"
    path.write_text(local)
    res = subprocess.run([NGINX, "-t", "-p", str(work), "-e", str(work / "error.log"), "-c", str(path)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0 and "test is successful" in res.stderr, res.stderr
    # and refuses a broken one (the check is real)
    path.write_text(local.replace("ssl_verify_client on;", "ssl_verify_client sometimes;"))
    res = subprocess.run([NGINX, "-t", "-p", str(work), "-e", str(work / "error.log"), "-c", str(path)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode != 0 and 'invalid value "sometimes"' in res.stderr
