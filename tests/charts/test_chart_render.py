"""The Helm charts rendered offline (helm-python-sdk) with every CI values file, and held to
what the platform needs: strict lint, the schema's refusals, hardened pods, standard labels,
the SuperLink/SuperExec/SuperNode flags that Flower 1.42's own parsers accept, the proxy
configs equal to ``coordinator/mtls.py``'s output, and the scheduler configuration accepted by
the project's strict model of KubeSchedulerConfiguration.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from bench.harness.charts import (
    AGENT,
    CHARTS,
    HUB,
    NAMESPACE,
    RELEASE,
    documents,
    find,
    fullname,
    load_values,
    one,
)
from fedsched.coordinator import chart_configs
from tests.agent.serving.test_scheduler_config import (
    AGENT_BUDGET_S,
    MAX_EXTENDER_PRIORITY,
    MAX_NODE_SCORE,
    load_config,
)
from tests.charts.chart_support import (
    CLUSTER_SCOPED,
    WORKLOADS,
    argv,
    ci_cases,
    ci_files,
    container,
    containers,
    flag,
    helm,
    merge,
    mounts,
    pod_spec,
    render,
    render_ci,
)
from tests.paths import REPO

CASES = ci_cases()
IDS = [f"{c}-{f.removesuffix('-values.yaml')}" for c, f in CASES]
HUB_CASES = [f for c, f in CASES if c == HUB]
AGENT_CASES = [f for c, f in CASES if c == AGENT]
STANDARD_LABELS = ("helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                   "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "app.kubernetes.io/component")
HUB_FULL, AGENT_FULL = fullname(HUB), fullname(AGENT)
#: The recording rules the package ships; the agent chart's copy is a relative link to this file.
RULES = REPO / "common" / "data" / "prometheus" / "recording-rules.yaml"
CHART_RULES = CHARTS / AGENT / "files" / "recording-rules.yaml"


def test_every_chart_has_the_ci_values_the_issue_names() -> None:
    assert {f.name for f in ci_files(HUB)} >= {"defaults-values.yaml", "existing-secrets-values.yaml",
                                               "cert-manager-values.yaml", "ingress-passthrough-values.yaml",
                                               "ingress-terminate-values.yaml"}
    assert {f.name for f in ci_files(AGENT)} >= {"defaults-values.yaml", "existing-secrets-values.yaml",
                                                 "cert-manager-values.yaml", "shadow-values.yaml",
                                                 "active-monitoring-values.yaml"}


@pytest.mark.parametrize(("chart", "ci_file"), CASES, ids=IDS)
def test_lint_is_clean_in_strict_mode(chart: str, ci_file: str) -> None:
    report = helm().lint(str(CHARTS / chart), load_values(chart, ci_file), strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert not problems and not report["errors"], (problems, report["errors"])


@pytest.mark.parametrize(("chart", "ci_file"), CASES, ids=IDS)
def test_every_object_is_labelled_and_namespaced(chart: str, ci_file: str) -> None:
    docs = documents(render_ci(chart, ci_file))
    assert docs
    for d in docs:
        meta = d["metadata"]
        labels = meta.get("labels", {})
        assert all(labels.get(k) for k in STANDARD_LABELS), (d["kind"], meta["name"], labels)
        assert labels["app.kubernetes.io/name"] == chart and labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["helm.sh/chart"] == f"{chart}-0.1.0"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if d["kind"] not in CLUSTER_SCOPED:
            assert meta.get("namespace"), (d["kind"], meta["name"])
        if d["kind"] in WORKLOADS and d["kind"] != "Pod":
            tmpl = d["spec"]["template"]["metadata"]["labels"]
            assert all(tmpl.get(k) for k in STANDARD_LABELS), (d["kind"], meta["name"])


@pytest.mark.parametrize(("chart", "ci_file"), CASES, ids=IDS)
def test_every_container_is_hardened_and_bounded(chart: str, ci_file: str) -> None:
    docs = documents(render_ci(chart, ci_file))
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    assert workloads
    for w in workloads:
        spec = pod_spec(w)
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and isinstance(psc["runAsUser"], int) and psc["runAsUser"] > 0
        assert psc["seccompProfile"]["type"] == "RuntimeDefault"
        for c in containers(w):
            where = f"{w['kind']}/{w['metadata']['name']}/{c['name']}"
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False and sc.get("privileged", False) is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], where
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][part]), where
            image = c["image"]
            repo, _, tag = image.rpartition(":") if "@" not in image else (image, "", "digest")
            assert repo and tag and tag != "latest" and "/" not in tag, where
            if w["kind"] == "Deployment" and c not in spec.get("initContainers", []):
                assert "readinessProbe" in c and "livenessProbe" in c, where
        # Anything the read-only root would break is a volume: /tmp is never the image's.
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["mountPath"].startswith("/"), m


@pytest.mark.parametrize(("chart", "ci_file"), CASES, ids=IDS)
def test_pod_disruption_budgets_where_there_are_replicas(chart: str, ci_file: str) -> None:
    docs = documents(render_ci(chart, ci_file))
    pdbs = {p["metadata"]["name"]: p for p in find(docs, "PodDisruptionBudget")}
    for d in find(docs, "Deployment"):
        replicas = d["spec"]["replicas"]
        if replicas > 1:
            pdb = pdbs[d["metadata"]["name"]]
            assert pdb["spec"]["selector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]
        else:
            assert d["metadata"]["name"] not in pdbs
    if chart == HUB:
        replicas = load_values(chart, ci_file).get("gateway", {}).get("replicas", 2)
        assert (f"{HUB_FULL}-gateway" in pdbs) == (replicas > 1)


@pytest.mark.parametrize(("chart", "ci_file"), CASES, ids=IDS)
def test_persistent_volume_claims_survive_uninstall(chart: str, ci_file: str) -> None:
    docs = documents(render_ci(chart, ci_file))
    for pvc in find(docs, "PersistentVolumeClaim"):
        assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


@pytest.mark.parametrize(("chart", "ci_file"), CASES, ids=IDS)
def test_a_helm_test_hook_and_next_steps(chart: str, ci_file: str) -> None:
    rendered = render_ci(chart, ci_file)
    tests = [d for d in documents(rendered) if d["kind"] == "Pod"]
    assert tests and all(t["metadata"]["annotations"]["helm.sh/hook"] == "test" for t in tests)
    notes = rendered[f"{chart}/templates/NOTES.txt"]
    assert "Next steps" in notes and f"helm test {RELEASE}" in notes


# ---- the schema ----------------------------------------------------------------------------------

REFUSED = [
    pytest.param(HUB, {"bogus": 1}, "additional properties 'bogus' not allowed", id="hub-unknown-key"),
    pytest.param(HUB, {"gateway": {"replica": 2}}, "additional properties 'replica' not allowed",
                 id="hub-unknown-nested-key"),
    pytest.param(HUB, {"superexec": {"enabled": False}}, "/superexec/enabled",
                 id="process-isolation-no-superexec"),
    pytest.param(HUB, {"image": {"tag": "latest"}}, "/image/tag", id="hub-latest-tag"),
    pytest.param(HUB, {"superlink": {"isolation": "thread"}}, "/superlink/isolation", id="isolation-mode"),
    pytest.param(HUB, {"ingress": {"enabled": True, "mode": "terminate", "host": "fleet.example.com"}},
                 "/ingress/terminate", id="terminate-without-secrets"),
    pytest.param(HUB, {"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot",
                 id="hub-root"),
    pytest.param(AGENT, {"bogus": 1}, "additional properties 'bogus' not allowed", id="agent-unknown-key"),
    pytest.param(AGENT, {"scheduler": {"version": ""}}, "/scheduler/version", id="missing-scheduler-version"),
    pytest.param(AGENT, {"scheduler": {"version": "1.34"}}, "/scheduler/version", id="bad-scheduler-version"),
    pytest.param(AGENT, {"mode": "yolo"}, "/mode", id="mode"),
    pytest.param(AGENT, {"scheduler": {"extenderWeight": 20}}, "/scheduler/extenderWeight",
                 id="extender-weight-too-small-to-decide"),
    pytest.param(AGENT, {"federation": {"data": {"nodesCsv": "/var/lib/fedsched/n.csv"}}},
                 "/federation/data/podsCsv", id="nodes-csv-without-pods-csv"),
    pytest.param(AGENT, {"scheduler": {"percentageOfNodesToScore": 101}},
                 "/scheduler/percentageOfNodesToScore", id="percentage"),
    pytest.param(AGENT, {"containerSecurityContext": {"readOnlyRootFilesystem": False}},
                 "/containerSecurityContext/readOnlyRootFilesystem", id="agent-writable-root"),
    pytest.param(AGENT, {"extender": {"resources": {"requests": {"memory": None}}}}, "memory",
                 id="resources-without-memory"),
]


@pytest.mark.parametrize(("chart", "bad", "message"), REFUSED)
def test_the_schema_refuses_bad_values_with_the_offending_key(chart: str, bad: dict, message: str) -> None:
    h = helm()
    good = load_values(chart, "defaults-values.yaml")
    with h.Chart.load(str(CHARTS / chart)) as c:
        c.validate_schema(good)  # the baseline passes: the failure is the edit's
        with pytest.raises(h.HelmValuesError, match=re.escape(message)):
            c.validate_schema(merge(good, bad))
        with pytest.raises(h.HelmValuesError, match=re.escape(message)):  # and install refuses it too
            c.render(merge(good, bad), name=RELEASE, namespace=NAMESPACE, is_install=True)


def test_a_missing_scheduler_version_is_named_in_the_message() -> None:
    values = load_values(AGENT, "defaults-values.yaml")
    del values["scheduler"]["version"]
    with pytest.raises(helm().HelmValuesError, match="'/scheduler/version': minLength: got 0"):
        render(AGENT, values)


# ---- the hub -------------------------------------------------------------------------------------

def parse_with(parser: Any, args: list[str]) -> Any:
    """Flower's own argparse parser for a CLI: an unknown or malformed flag fails here."""
    try:
        return parser.parse_args(args)
    except SystemExit as e:
        raise AssertionError(f"{args} refused by Flower 1.42's parser") from e


@pytest.mark.parametrize("ci_file", HUB_CASES)
def test_superlink_runs_as_the_issue_asks(ci_file: str) -> None:
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink

    values = load_values(HUB, ci_file)
    docs = documents(render_ci(HUB, ci_file))
    dep = one(docs, "Deployment", f"{HUB_FULL}-superlink")
    c = container(dep, "superlink")
    args = argv(c)
    assert args[0] == "flower-superlink"
    parsed = parse_with(_parse_args_run_superlink(), args[1:])
    assert parsed.enable_supernode_auth and not parsed.insecure
    assert parsed.runtime_dependency_install is False  # --disable-runtime-dependency-installation
    isolation = values.get("superlink", {}).get("isolation", "process")
    assert parsed.isolation == isolation
    assert parsed.host == "0.0.0.0" and parsed.port == chart_configs.SUPERLINK_PORT
    assert parsed.health_server_address == f"0.0.0.0:{chart_configs.SUPERLINK_HEALTH_PORT}"
    # TLS from the mounted Secret; the LinkState on the PVC (registrations and runs survive restarts).
    vols = mounts(dep, c)
    tls_dir = str(Path(parsed.ssl_certfile).parent)
    names = {Path(parsed.ssl_certfile).name, Path(parsed.ssl_keyfile).name, Path(parsed.ssl_ca_certfile).name}
    assert names == {"tls.crt", "tls.key", "ca.crt"}
    assert "secret" in vols[tls_dir]
    db_dir = str(Path(parsed.database).parent)
    assert vols[db_dir]["persistentVolumeClaim"]["claimName"] == f"{HUB_FULL}-superlink-state"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["FLWR_TELEMETRY_ENABLED"] == "0" and env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["grpc"]["port"] == chart_configs.SUPERLINK_HEALTH_PORT
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    svc = one(docs, "Service", f"{HUB_FULL}-superlink")
    assert svc["spec"]["type"] == "ClusterIP" and [p["port"] for p in svc["spec"]["ports"]] == [8000]
    superexec = find(docs, "Deployment", f"{HUB_FULL}-superexec")
    assert bool(superexec) == (isolation == "process")


@pytest.mark.parametrize("ci_file", [f for f in HUB_CASES if "subprocess" not in f])
def test_superexec_runs_the_serverapp_with_checkpoints_on_a_pvc(ci_file: str) -> None:
    from flwr.supercore.cli.flower_superexec import _parse_args

    docs = documents(render_ci(HUB, ci_file))
    dep = one(docs, "Deployment", f"{HUB_FULL}-superexec")
    c = container(dep, "superexec")
    args = argv(c)
    assert args[0] == "flower-superexec"
    parsed = parse_with(_parse_args(), args[1:])
    host = chart_configs.superlink_host(HUB_FULL, NAMESPACE)
    assert parsed.runtime_api_address == f"{host}:{chart_configs.SUPERLINK_PORT}" and not parsed.insecure
    assert "secret" in mounts(dep, c)[str(Path(parsed.root_certificates).parent)]
    assert parsed.runtime_dependency_install is False
    # The ServerApp's out-dir is relative to the working directory: the checkpoints PVC.
    assert mounts(dep, c)[c["workingDir"]]["persistentVolumeClaim"]["claimName"] == f"{HUB_FULL}-checkpoints"
    assert c["image"] == container(one(docs, "Deployment", f"{HUB_FULL}-superlink"), "superlink")["image"]


@pytest.mark.parametrize("ci_file", HUB_CASES)
def test_the_gateway_config_is_mtls_py_output(ci_file: str) -> None:
    docs = documents(render_ci(HUB, ci_file))
    cm = one(docs, "ConfigMap", f"{HUB_FULL}-gateway")
    expected = chart_configs.hub_gateway_conf(chart_configs.superlink_host(HUB_FULL, NAMESPACE))
    assert cm["data"]["nginx.conf"] == expected
    dep = one(docs, "Deployment", f"{HUB_FULL}-gateway")
    c = container(dep, "nginx")
    args = argv(c)
    assert args[args.index("-c") + 1] == f"{chart_configs.GATEWAY_CONFIG_DIR}/nginx.conf"
    assert args[args.index("-p") + 1] == chart_configs.GATEWAY_WORKDIR
    vols = mounts(dep, c)
    assert vols[chart_configs.GATEWAY_CONFIG_DIR]["configMap"]["name"] == cm["metadata"]["name"]
    assert "emptyDir" in vols[chart_configs.GATEWAY_WORKDIR]
    # The projected certificates carry the file names mtls.nginx_conf reads.
    paths = {i["path"] for src in vols[chart_configs.GATEWAY_CERTS_DIR]["projected"]["sources"]
             for i in src["secret"]["items"]}
    assert paths == {"hub.crt", "hub.key", "ca.crt"}
    upstream_ca = vols[str(Path(chart_configs.GATEWAY_UPSTREAM_CA).parent)]["secret"]
    assert upstream_ca["secretName"] == pod_spec(one(docs, "Deployment", f"{HUB_FULL}-superlink"))[
        "volumes"][0]["secret"]["secretName"]
    assert c["ports"][0]["containerPort"] == chart_configs.GATEWAY_PORT
    assert dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


@pytest.mark.parametrize("ci_file", HUB_CASES)
def test_only_the_gateway_superexec_and_named_clients_reach_the_superlink(ci_file: str) -> None:
    values = load_values(HUB, ci_file)
    docs = documents(render_ci(HUB, ci_file))
    pol = one(docs, "NetworkPolicy", f"{HUB_FULL}-superlink")
    assert pol["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "superlink"
    (rule,) = pol["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    components = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                  for p in rule["from"] if "podSelector" in p}
    assert components == {"gateway", "superexec", "registration", "test"}
    extra = [p for p in rule["from"] if "podSelector" not in p]
    assert extra == values.get("networkPolicy", {}).get("controlClients", [])
    # Each selector names pods of this release that exist (or the hooks' pods).
    present = {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
               for d in docs if d["kind"] in ("Deployment", "Job")}
    assert components - {"registration", "test"} <= present | {"superexec"}
    assert one(docs, "NetworkPolicy", f"{HUB_FULL}-superexec")["spec"]["ingress"] == []


@pytest.mark.parametrize("ci_file", [f for f in HUB_CASES if "ingress" in f])
def test_ingress_modes(ci_file: str) -> None:
    values = load_values(HUB, ci_file)["ingress"]
    ing = one(documents(render_ci(HUB, ci_file)), "Ingress", f"{HUB_FULL}-gateway")
    ann = ing["metadata"]["annotations"]
    (path,) = ing["spec"]["rules"][0]["http"]["paths"]
    assert path["path"] == "/v1/fleet/" and path["backend"]["service"]["name"] == f"{HUB_FULL}-gateway"
    if values["mode"] == "passthrough":
        assert ann["nginx.ingress.kubernetes.io/ssl-passthrough"] == "true" and "tls" not in ing["spec"]
    else:
        assert ann["nginx.ingress.kubernetes.io/auth-tls-verify-client"] == "on"
        proxy_secret = ann["nginx.ingress.kubernetes.io/proxy-ssl-secret"]
        assert proxy_secret == f"{NAMESPACE}/{values['terminate']['proxyClientSecret']}"
        assert ing["spec"]["tls"][0]["secretName"] == values["terminate"]["tlsSecret"]


def test_cert_manager_certificates_name_the_services() -> None:
    docs = documents(render_ci(HUB, "cert-manager-values.yaml"))
    sl = one(docs, "Certificate", f"{HUB_FULL}-superlink")
    assert chart_configs.superlink_host(HUB_FULL, NAMESPACE) in sl["spec"]["dnsNames"]
    assert "server auth" in sl["spec"]["usages"]
    gw = one(docs, "Certificate", f"{HUB_FULL}-gateway")
    assert "fleet.example.com" in gw["spec"]["dnsNames"]
    secret = pod_spec(one(docs, "Deployment", f"{HUB_FULL}-superlink"))["volumes"][0]["secret"]["secretName"]
    assert secret == sl["spec"]["secretName"]


def test_the_registration_job_registers_every_key_after_install_and_upgrade() -> None:
    values = load_values(HUB, "existing-secrets-values.yaml")
    docs = documents(render_ci(HUB, "existing-secrets-values.yaml"))
    cm = one(docs, "ConfigMap", f"{HUB_FULL}-registration")
    keys = {k.removesuffix(".pub"): v for k, v in cm["data"].items() if k.endswith(".pub")}
    assert keys == {k: v.strip() for k, v in values["registration"]["publicKeys"].items()}
    assert cm["data"]["register.py"] == (CHARTS / HUB / "files" / "register.py").read_text()
    job = one(docs, "Job", f"{HUB_FULL}-registration")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    args = argv(container(job, "register"))
    assert args[:2] == ["python", "/etc/fedsched/registration/register.py"]
    assert args[2] == f"{chart_configs.superlink_host(HUB_FULL, NAMESPACE)}:8000"
    assert not find(documents(render_ci(HUB, "defaults-values.yaml")), "Job")


# ---- the member agent -------------------------------------------------------------------------------

def agent_docs(ci_file: str) -> list[dict[str, Any]]:
    return documents(render_ci(AGENT, ci_file))


@pytest.mark.parametrize("ci_file", AGENT_CASES)
def test_the_scheduler_configuration_passes_the_strict_model(ci_file: str) -> None:
    values = load_values(AGENT, ci_file)
    docs = agent_docs(ci_file)
    cm = one(docs, "ConfigMap", f"{AGENT_FULL}-scheduler")
    cfg = load_config(cm["data"]["config.yaml"])  # decoding, defaults and validation as kube-scheduler's
    # Only the fedsched profile, sampling off: the policy ranks every feasible node.
    (profile,) = cfg.profiles
    assert profile.schedulerName == "fedsched" and profile.percentageOfNodesToScore == 100
    # Its own lease, in the release namespace.
    le = cfg.leaderElection
    assert le.leaderElect and le.resourceLock == "leases"
    assert le.resourceName == f"{AGENT_FULL}-scheduler" != "kube-scheduler"
    assert le.resourceNamespace == NAMESPACE
    (ext,) = cfg.extenders
    url = urlsplit(ext.urlPrefix)
    svc = one(docs, "Service", f"{AGENT_FULL}-extender")
    assert (url.scheme, url.hostname, url.port, url.path) == (
        "https", f"{svc['metadata']['name']}.{NAMESPACE}.svc", svc["spec"]["ports"][0]["port"], "/scheduler")
    assert ext.ignorable and ext.nodeCacheCapable and ext.enableHTTPS
    assert ext.bindVerb == "" and ext.preemptVerb == "" and (ext.filterVerb, ext.prioritizeVerb) == (
        "filter", "prioritize")
    assert 10 * AGENT_BUDGET_S <= ext.httpTimeout.seconds < 1.0
    tls = ext.tlsConfig
    assert tls is not None and not tls.insecure and tls.serverName == url.hostname
    # The TLS files are the mounted Secret's.
    dep = one(docs, "Deployment", f"{AGENT_FULL}-scheduler")
    c = container(dep, "kube-scheduler")
    vol = mounts(dep, c)[str(Path(tls.certFile).parent)]
    assert {Path(f).parent for f in (tls.certFile, tls.keyFile, tls.caFile)} == {Path(tls.certFile).parent}
    assert vol["secret"]["secretName"]
    # The policy's pick dominates the two score plugins (kube adds Score * weight * 10).
    score = profile.plugins.score
    assert [p.name for p in score.disabled] == ["*"]
    plugin_max = MAX_NODE_SCORE * sum(p.weight or 0 for p in score.enabled)
    per_point = ext.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    assert (MAX_EXTENDER_PRIORITY - 1) * per_point + plugin_max < MAX_EXTENDER_PRIORITY * per_point
    # The official image, at the required version, reading this ConfigMap.
    version = values["scheduler"]["version"]
    assert c["image"] == f"registry.k8s.io/kube-scheduler:{version}"
    args = argv(c)
    config_file = flag(args, "--config")
    assert mounts(dep, c)[str(Path(config_file).parent)]["configMap"]["name"] == cm["metadata"]["name"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS" and c[probe]["httpGet"]["port"] == "https"


@pytest.mark.parametrize("ci_file", AGENT_CASES)
def test_scheduler_rbac_is_least_privilege(ci_file: str) -> None:
    values = load_values(AGENT, ci_file)
    docs = agent_docs(ci_file)
    sa = f"{AGENT_FULL}-scheduler"
    bound = {b["roleRef"]["name"] for b in find(docs, "ClusterRoleBinding")
             if any(s["name"] == sa for s in b["subjects"])}
    assert bound == {"system:kube-scheduler", "system:volume-scheduler"}
    assert not [r for r in find(docs, "ClusterRole") if r["metadata"]["name"].startswith(sa)]
    role = one(docs, "Role", f"{sa}-lease")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [sa],
                      "verbs": ["get", "update"]}]
    assert all(r["resources"] == ["leases"] for r in role["rules"])
    auth = values["scheduler"].get("authentication", "authReader")
    readers = find(docs, "RoleBinding", f"{sa}-auth-reader")
    args = argv(container(one(docs, "Deployment", sa), "kube-scheduler"))
    if auth == "authReader":
        (rb,) = readers
        assert rb["metadata"]["namespace"] == "kube-system"
        assert rb["roleRef"]["name"] == "extension-apiserver-authentication-reader"
        assert "--authentication-skip-lookup=true" not in args
    else:
        assert not readers and "--authentication-skip-lookup=true" in args
    # The extender reads Nodes and Pods, nothing else, and writes nothing.
    (cache,) = find(docs, "ClusterRole", f"{AGENT_FULL}-cache")
    assert cache["rules"] == [{"apiGroups": [""], "resources": ["nodes", "pods"],
                               "verbs": ["get", "list", "watch"]}]


@pytest.mark.parametrize("ci_file", AGENT_CASES)
def test_the_extender_serves_mtls_with_the_policy_on_the_shared_pvc(ci_file: str) -> None:
    from fedsched.cli.serve import OPTIONS

    values = load_values(AGENT, ci_file)
    docs = agent_docs(ci_file)
    dep = one(docs, "Deployment", AGENT_FULL)
    c = container(dep, "extender")
    args = argv(c)
    assert args[:2] == ["fedsched", "serve"]
    # Every flag is one of `fedsched serve`'s options.
    for a in args[2:]:
        assert a.startswith("--") and a[2:].split("=", 1)[0] in OPTIONS, a
    assert flag(args, "--mode") == values.get("mode", "shadow")
    for opt in ("--tls-cert", "--tls-key", "--client-ca"):
        assert "secret" in mounts(dep, c)[str(Path(flag(args, opt)).parent)]
    assert flag(args, "--prometheus") == (values.get("extender", {}).get("prometheusUrl") or None)
    data = mounts(dep, c)["/var/lib/fedsched"]
    assert ("persistentVolumeClaim" in data) == values.get("persistence", {}).get("enabled", True)
    assert flag(args, "--policy").startswith("/var/lib/fedsched/")
    assert flag(args, "--decision-log").startswith("/var/lib/fedsched/")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = c[probe]["exec"]["command"]
        assert cmd[:2] == ["python", "/etc/fedsched/scripts/probe.py"]
        assert cmd[2].endswith(("/readyz", "/healthz"))


@pytest.mark.parametrize("ci_file", [f for f in AGENT_CASES if f != "shadow-values.yaml"])
def test_the_supernode_and_its_sidecar(ci_file: str) -> None:
    from flwr.common.config import parse_config_args
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    values = load_values(AGENT, ci_file)
    fed = values["federation"]
    docs = agent_docs(ci_file)
    dep = one(docs, "Deployment", AGENT_FULL)
    c = container(dep, "supernode")
    args = argv(c)
    assert args[0] == "flower-supernode"
    parsed = parse_with(_parse_args_run_supernode(), args[1:])
    assert parsed.superlink == f"127.0.0.1:{chart_configs.SIDECAR_PORT}" and not parsed.insecure
    assert parsed.root_certificates == f"{chart_configs.SIDECAR_SERVER_DIR}/ca.crt"
    assert mounts(dep, c)[str(Path(parsed.auth_supernode_private_key).parent)]["secret"]["secretName"] == (
        fed["nodeKey"]["existingSecret"])
    node_config = parse_config_args([parsed.node_config])
    assert node_config["cluster-name"] == fed["clusterName"]
    extender_args = argv(container(dep, "extender"))
    # The ClientApp writes the policy the extender serves and learns from the log it writes.
    assert node_config["serve-policy"] == flag(extender_args, "--policy")
    assert node_config["decision-log"] == flag(extender_args, "--decision-log")
    if fed.get("data", {}).get("nodesCsv"):
        assert node_config["nodes-csv"] == fed["data"]["nodesCsv"]
        assert node_config["pods-csv"] == fed["data"]["podsCsv"]
    else:  # the recorder's files on the same PVC: the member's validation twin
        rec_out = flag(argv(container(dep, "recorder")), "--out")
        assert node_config["nodes-csv"] == f"{rec_out}/nodes.csv"
        assert node_config["pods-csv"] == f"{rec_out}/pods.csv"
    assert c["workingDir"] == "/var/lib/fedsched" and mounts(dep, c)["/var/lib/fedsched"] == mounts(
        dep, container(dep, "extender"))["/var/lib/fedsched"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["FLWR_TELEMETRY_ENABLED"] == "0" and env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    # The sidecar: stunnel on the config mtls.py renders for this hub.
    side = container(dep, "hub-sidecar")
    assert argv(side) == ["stunnel", f"{chart_configs.SIDECAR_CONFIG_DIR}/stunnel.conf"]
    cm = one(docs, "ConfigMap", f"{AGENT_FULL}-scripts")
    hub = fed["hub"]
    expected = chart_configs.member_sidecar_conf(f"{hub['host']}:{hub.get('port', 443)}",
                                                 hub.get("serverName") or hub["host"])
    assert cm["data"]["stunnel.conf"] == expected
    side_vols, node_vols = mounts(dep, side), mounts(dep, c)
    assert side_vols[chart_configs.SIDECAR_CONFIG_DIR]["configMap"]["name"] == cm["metadata"]["name"]
    assert side_vols[chart_configs.SIDECAR_CLIENT_DIR]["secret"]["secretName"] == fed["hubClientSecret"]
    assert side_vols[chart_configs.SIDECAR_SERVER_DIR] == node_vols[chart_configs.SIDECAR_SERVER_DIR]
    assert "emptyDir" in side_vols[chart_configs.SIDECAR_WORKDIR]


def test_shadow_then_active_by_a_value() -> None:
    base = load_values(AGENT, "defaults-values.yaml")
    assert "mode" not in base  # the default is shadow
    for mode in ("shadow", "active"):
        values = base if mode == "shadow" else merge(base, {"mode": mode})
        dep = one(documents(render(AGENT, values)), "Deployment", AGENT_FULL)
        assert flag(argv(container(dep, "extender")), "--mode") == mode


def test_without_federation_the_agent_is_the_extender_and_its_recorder() -> None:
    dep = one(agent_docs("shadow-values.yaml"), "Deployment", AGENT_FULL)
    assert [c["name"] for c in pod_spec(dep)["containers"]] == ["extender", "recorder"]


def test_monitoring_objects() -> None:
    docs = agent_docs("active-monitoring-values.yaml")
    values = load_values(AGENT, "active-monitoring-values.yaml")["monitoring"]
    rule = one(docs, "PrometheusRule", f"{AGENT_FULL}-recording-rules")
    assert rule["metadata"]["labels"]["release"] == values["prometheusRule"]["additionalLabels"]["release"]
    shipped = yaml.safe_load(RULES.read_text())
    assert rule["spec"] == shipped
    sm = one(docs, "ServiceMonitor", AGENT_FULL)
    (ep,) = sm["spec"]["endpoints"]
    assert ep["scheme"] == "https" and ep["path"] == "/metrics"
    assert ep["tlsConfig"]["cert"]["secret"]["key"] == "tls.crt"  # /metrics is behind mTLS
    dash = one(docs, "ConfigMap", f"{AGENT_FULL}-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["data"]["fedsched-agent.json"] == (CHARTS / AGENT / "files" / "dashboard.json").read_text()
    off = agent_docs("defaults-values.yaml")
    assert not find(off, "PrometheusRule") and not find(off, "ServiceMonitor")


def test_the_seed_policy_init_container_fills_an_empty_pvc(tmp_path: Path) -> None:
    """The init container's script, run as written, against a local directory."""
    import subprocess
    import sys

    dep = one(agent_docs("defaults-values.yaml"), "Deployment", AGENT_FULL)
    script = container(dep, "seed-policy")["command"][2]
    local = script.replace("/var/lib/fedsched", str(tmp_path))
    for _ in range(2):  # idempotent: a second start keeps the (federated) policy there
        subprocess.run([sys.executable, "-c", local], check=True, timeout=60)
    from fedsched.common.schedulers import default_policy_path

    assert (tmp_path / "policy.pt").read_bytes() == default_policy_path().read_bytes()
    assert (tmp_path / "decisions").is_dir()


# ---- generated files and the image ---------------------------------------------------------------------

def test_generated_chart_files_are_current() -> None:
    stale = chart_configs.stale_files(CHARTS)
    assert not stale, f"stale {stale}: run python -m fedsched.coordinator.chart_configs --charts charts"


def test_the_chart_recording_rules_are_the_package_file() -> None:
    """One file, two readers: the agent chart embeds the package's recording rules through a
    relative symbolic link (a chart reads only files inside itself; Helm follows the link)."""
    assert CHART_RULES.is_symlink(), f"{CHART_RULES} must be a link to {RULES} (core.symlinks off?)"
    target = Path(CHART_RULES.readlink())
    assert not target.is_absolute(), target
    assert CHART_RULES.resolve() == RULES.resolve()
    from importlib import resources

    packaged = resources.files("fedsched.common").joinpath("data", "prometheus", "recording-rules.yaml")
    assert packaged.read_bytes() == CHART_RULES.read_bytes()


def pip_steps(text: str) -> list[list[str]]:
    """Every ``python -m pip install ...`` command of a shell script or Dockerfile, as argv."""
    joined = text.replace("\\\n", " ")
    return [shlex.split(m) for m in re.findall(r"python -m pip install [^&\n]+", joined)]


def test_dockerfile_installs_as_setup_sh_does() -> None:
    """The image's pip steps are scripts/setup.sh's, in the same order (without the dev extra)."""
    setup = [[w.replace(".[dev]", ".") for w in step] for step in pip_steps(
        (REPO / "scripts" / "setup.sh").read_text())]
    text = (REPO / "Dockerfile").read_text()
    assert len(setup) == 3 and pip_steps(text) == setup
    assert "python -m venv" in text and "torch==2.13.0" in text
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert re.search(r"^FROM python:3\.11[\w.-]*-slim", text, re.M) and ":latest" not in text


def test_dockerfile_copies_every_package_folder() -> None:
    """The image installs the project from the folders it copies: each top-level package folder
    of pyproject.toml's ``package-dir`` (common, agent, coordinator, cli, ...) is among them."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = set(setuptools["package-dir"].values())
    copied = set(re.findall(r"^COPY (\S+) \1$", (REPO / "Dockerfile").read_text(), re.M))
    assert folders <= copied, f"the Dockerfile does not copy {sorted(folders - copied)}"
