"""``helm install`` of both charts into a real kube-apiserver v1.37.2: every object is accepted.

Helm is the project's own: helm-python-sdk (Helm v4 as a shared library, the same code as the
``helm`` CLI; :mod:`bench.harness.charts` renders with it offline). Here it talks to a
control plane of this module's own (:func:`bench.harness.control_plane.control_plane`) through its
admin kubeconfig, for every CI values file of both charts (one release and namespace each), as
the charts' README installs them: the namespace, then the Secrets the release's workloads mount
and does not create itself (from ``fedsched certs``, the CLI), then ``helm install``.

No controllers run (no kube-controller-manager, kubelet, cert-manager or Prometheus Operator), so
nothing starts; what is checked is that the API server accepts the release:

- the install ends ``deployed`` without a server-side error, and every object of the release's
  manifest exists afterwards (a GET of each at the path discovery gives for its kind), owned by
  the release (Helm's ``meta.helm.sh/release-*`` annotations, ``managed-by: Helm``), and none
  draws a ``Warning`` from the API server (a server-side-apply dry run of each: deprecated
  fields or annotations would);
- the hooks (the ``helm test`` Pods and ConfigMaps, the hub's registration Job) are accepted too:
  the install runs with hooks disabled (a Job hook would wait for a Job controller) and each hook
  is created with a server-side dry run (``dryRun=All``: validation and admission, nothing stored);
- the cert-manager (``Certificate``) and Prometheus Operator (``ServiceMonitor``,
  ``PrometheusRule``) kinds need their CRDs: without them Helm refuses the whole release ("no
  matches for kind ... ensure CRDs are installed first"), so this module registers stand-in CRDs of
  those kinds (any fields, ``x-kubernetes-preserve-unknown-fields``). Their objects are therefore
  checked for existence, not against cert-manager's or the operator's schemas;
- ``helm upgrade`` of each default install (the agent to ``mode=active``) makes revision 2, and
  ``helm uninstall`` removes every object but the PersistentVolumeClaims the charts keep
  (``helm.sh/resource-policy: keep``), as the README says.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench.harness.charts import AGENT, CHARTS, HUB, load_values
from bench.harness.control_plane import ControlPlane, KubeAPI, KubeAPIError, control_plane
from bench.harness.polling import wait_for
from fedsched.common.security import certs
from tests.charts.chart_support import ci_cases, helm, merge
from tests.k8s_support import k8s_binaries

#: Stand-ins for the CRDs of the kinds the charts can render beyond the built-in API.
STAND_IN_CRDS = (("cert-manager.io", "Certificate", "certificates"),
                 ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
                 ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"))
HOOK = "helm.sh/hook"


# ---- the control plane, certificates and stand-in CRDs -------------------------------------

@dataclass
class Cluster:
    cp: ControlPlane
    pki: Path

    @property
    def api(self) -> KubeAPI:
        return self.cp.api

    def helm(self, namespace: str) -> Any:
        """``helm --kubeconfig ADMIN -n NAMESPACE``: a helm-python-sdk Config (its namespace is
        also where the release records live), to be closed."""
        return helm().Config(kubeconfig_path=str(self.cp.kubeconfig), namespace=namespace)


def stand_in_crd(group: str, kind: str, plural: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                           "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                     "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


def fedsched_certs(*args: str) -> None:
    """``fedsched certs ARGS`` (the CLI, as an operator runs it)."""
    subprocess.run([sys.executable, "-m", "fedsched.cli.main", "certs", *args], check=True,
                   capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    helm()  # skips (fails under CI) without helm-python-sdk, before anything starts
    root = tmp_path_factory.mktemp("helm-install")
    pki = root / "pki"
    fedsched_certs("init", "--dir", str(pki), "--hub-host", "fleet.example.com")
    fedsched_certs("issue", "--dir", str(pki), "--name", "cluster-a")
    with control_plane(root / "cp", k8s_binaries()) as cp:
        for group, kind, plural in STAND_IN_CRDS:
            cp.api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                          stand_in_crd(group, kind, plural))
        for group, _, plural in STAND_IN_CRDS:
            wait_for(lambda n=f"{plural}.{group}": established(cp.api, n), 60, 0.2, f"CRD {plural}.{group}")
        yield Cluster(cp, pki)


def established(api: KubeAPI, name: str) -> bool:
    crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    # A CRD just created can carry "conditions": null until the apiserver has looked at it.
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


# ---- discovery: the path of any object ------------------------------------------------------

_DISCOVERY: dict[str, dict[str, dict]] = {}


def resource_of(api: KubeAPI, api_version: str, kind: str) -> dict:
    """The discovery entry (``name``, ``namespaced``) of ``kind`` in ``api_version``."""
    if api_version not in _DISCOVERY or kind not in _DISCOVERY[api_version]:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        _DISCOVERY[api_version] = {r["kind"]: r for r in api.get(base)["resources"] if "/" not in r["name"]}
    return _DISCOVERY[api_version][kind]


def object_path(api: KubeAPI, doc: dict, namespace: str, name: bool = True) -> str:
    api_version, kind = doc["apiVersion"], doc["kind"]
    res = resource_of(api, api_version, kind)
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = doc["metadata"].get("namespace") or namespace
    path = f"{base}/namespaces/{ns}/{res['name']}" if res["namespaced"] else f"{base}/{res['name']}"
    return f"{path}/{quote(doc['metadata']['name'])}" if name else path


def manifest_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


# ---- what the release needs before its install ------------------------------------------------

def pod_specs(docs: list[dict]) -> Iterator[dict]:
    for d in docs:
        if d["kind"] == "Pod":
            yield d["spec"]
        elif d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d["spec"]["template"]["spec"]


def mounted_secrets(docs: list[dict]) -> set[str]:
    """Secrets the workloads mount or read, less those the release itself provides (its Secrets,
    its cert-manager Certificates' ``secretName``)."""
    names: set[str] = set()
    for spec in pod_specs(docs):
        for v in spec.get("volumes", []):
            if "secret" in v:
                names.add(v["secret"]["secretName"])
            for src in v.get("projected", {}).get("sources", []):
                if "secret" in src:
                    names.add(src["secret"]["name"])
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    names.add(ref["name"])
            names |= {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}
    provided = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    provided |= {d["spec"]["secretName"] for d in docs if d["kind"] == "Certificate"}
    return names - provided


def create_secrets(c: Cluster, namespace: str, names: set[str]) -> None:
    """Each Secret as the README creates them (``kubectl create secret generic``): the TLS keys
    from ``fedsched certs`` and an EC node key, whatever the Secret is for."""
    ca, hub = certs.ca_files(c.pki), certs.hub_files(c.pki)
    node_key = ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    files = {"tls.crt": hub.cert.read_bytes(), "tls.key": hub.key.read_bytes(),
             "ca.crt": ca.cert.read_bytes()}
    for name in sorted(names):
        c.api.create(f"/api/v1/namespaces/{namespace}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "stringData": {**{k: v.decode() for k, v in files.items()}, "node.key": node_key.decode()}})


def release_name(chart: str, ci_file: str) -> str:
    return f"{chart.removeprefix('fedsched-')}-{ci_file.removesuffix('-values.yaml')}"


def install(c: Cluster, chart: str, name: str, values: dict) -> dict:
    """``helm install NAME CHART -n NAME --no-hooks`` (helm-python-sdk passes ``disable_hooks``
    to the Helm SDK's install action; its Python wrapper has no keyword for it)."""
    from helm_python import _native
    from helm_python.config import _opts

    with c.helm(name) as cfg:
        handle, ref = cfg._chart_args(str(CHARTS / chart))
        payload = _native.call_string("helm_install", cfg._raw(), cfg._context_arg(None), handle, ref, name,
                                      json.dumps(values),
                                      _opts(namespace=name, timeout_seconds=60, disable_hooks=True))
    return json.loads(payload)


# ---- the tests -------------------------------------------------------------------------------

@pytest.mark.parametrize(("chart", "ci_file"), ci_cases())
def test_helm_install_creates_every_object(cluster: Cluster, chart: str, ci_file: str) -> None:
    api = cluster.api
    name = release_name(chart, ci_file)
    values = load_values(chart, ci_file)
    with helm().Chart.load(str(CHARTS / chart)) as ch:
        rendered = ch.render(values, name=name, namespace=name, is_install=True)
    docs = [d for path, text in sorted(rendered.items()) if not path.endswith("NOTES.txt")
            for d in manifest_docs(text)]
    api.ensure_namespace(name)
    create_secrets(cluster, name, mounted_secrets(docs))

    release = install(cluster, chart, name, values)
    assert release["status"] == "deployed" and release["revision"] == 1

    objects = manifest_docs(release["manifest"])
    hooks = [d for d in docs if HOOK in d["metadata"].get("annotations", {})]
    assert len(objects) + len(hooks) == len(docs) and objects
    for doc in objects:
        got = api.get(object_path(api, doc, name))
        meta = got["metadata"]
        assert (got["kind"], meta["name"]) == (doc["kind"], doc["metadata"]["name"])
        assert meta["annotations"]["meta.helm.sh/release-name"] == name, doc["kind"]
        assert meta["annotations"]["meta.helm.sh/release-namespace"] == name
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        if resource_of(api, doc["apiVersion"], doc["kind"])["namespaced"]:
            assert meta["namespace"] == doc["metadata"].get("namespace", name)
    # the release record Helm keeps (storage driver "secret")
    record = api.get(f"/api/v1/namespaces/{name}/secrets/sh.helm.release.v1.{name}.v1")
    assert record["type"] == "helm.sh/release.v1"

    assert hooks  # every chart has its helm test hooks
    for doc in hooks:  # accepted by validation and admission, not stored
        status, warnings = dry_run(api, "POST", object_path(api, doc, name, name=False), doc)
        assert status == 201, f"hook {doc['kind']} {doc['metadata']['name']} refused: {warnings}"
        assert not warnings, f"hook {doc['kind']} {doc['metadata']['name']}: API warnings {warnings}"
    for doc in objects:  # and no object draws a warning from the API server (deprecations, ...)
        status, warnings = dry_run(api, "PATCH", object_path(api, doc, name), doc, apply=True)
        assert status == 200 and not warnings, f"{doc['kind']} {doc['metadata']['name']}: {status} {warnings}"


def dry_run(api: KubeAPI, method: str, path: str, doc: dict, apply: bool = False) -> tuple[int, list[str]]:
    """A server-side dry run (``dryRun=All``; ``apply``: a server-side apply with a field manager of
    its own) of ``doc``: (HTTP status, the API server's ``Warning`` headers, or its error body)."""
    params: dict[str, str] = {"dryRun": "All"}
    headers = {"Content-Type": "application/json"}
    if apply:
        params |= {"fieldManager": "dry-run-check", "force": "true"}
        headers["Content-Type"] = "application/apply-patch+yaml"
    r = api.session.request(method, api.url + path, data=json.dumps(doc), params=params, headers=headers,
                            timeout=30)
    if r.status_code >= 300:
        return r.status_code, [r.text[:2000]]
    return r.status_code, [w for w in r.headers.get("Warning", "").split(", 299") if w]


@pytest.mark.parametrize(("chart", "upgrade"), [(HUB, {"gateway": {"service": {"type": "LoadBalancer"}}}),
                                                 (AGENT, {"mode": "active"})])
def test_upgrade_then_uninstall_keeps_only_the_volume_claims(cluster: Cluster, chart: str,
                                                             upgrade: dict) -> None:
    api = cluster.api
    name = release_name(chart, "upgrade-values.yaml")
    values = load_values(chart, "defaults-values.yaml")
    api.ensure_namespace(name)
    with helm().Chart.load(str(CHARTS / chart)) as ch:
        docs = [d for p, t in ch.render(values, name=name, namespace=name, is_install=True).items()
                if not p.endswith("NOTES.txt") for d in manifest_docs(t)]
    create_secrets(cluster, name, mounted_secrets(docs))
    assert install(cluster, chart, name, values)["status"] == "deployed"

    with cluster.helm(name) as cfg:
        up = cfg.upgrade(str(CHARTS / chart), name, merge(values, upgrade), namespace=name, timeout=60)
    assert up["status"] == "deployed" and up["revision"] == 2
    objects = manifest_docs(up["manifest"])
    for doc in objects:
        api.get(object_path(api, doc, name))

    with cluster.helm(name) as cfg:
        out = cfg.uninstall(name, timeout=60)
    assert out["release"]["status"] == "uninstalled"
    kept = {d["metadata"]["name"] for d in objects
            if d["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep"}
    assert kept and {d["kind"] for d in objects if d["metadata"]["name"] in kept} == {"PersistentVolumeClaim"}
    for doc in objects:
        path = object_path(api, doc, name)
        if doc["metadata"]["name"] in kept and doc["kind"] == "PersistentVolumeClaim":
            assert api.get(path)["metadata"]["name"] == doc["metadata"]["name"]
        else:
            wait_for(lambda p=path: gone(api, p), 60, 0.2, f"{doc['kind']} {doc['metadata']['name']} deleted")
    assert gone(api, f"/api/v1/namespaces/{name}/secrets/sh.helm.release.v1.{name}.v1")


def gone(api: KubeAPI, path: str) -> bool:
    try:
        api.get(path)
    except KubeAPIError as e:
        return e.status == 404
    return False
