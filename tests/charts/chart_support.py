"""Helpers for the Helm chart tests: offline rendering with helm-python-sdk, manifest lookup,
the real tools' locations, and the charts' in-pod layout mapped onto a test directory.

Every render is the chart as Helm renders it (``helm_python.Chart.load(...).render``, Helm v4
as a library, no cluster); renders are cached per chart and values so the test modules share
them. :class:`Localizer` rewrites what a container would run (its command, arguments,
environment, working directory and mounted config files) from in-pod paths, ports and Service
names to a temporary directory and free loopback ports, so the loopback federation test runs
exactly the flags and configs the charts render, and nothing hand-written.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import REPO

CHARTS = REPO / "charts"
HUB, AGENT = "fedsched-hub", "fedsched-agent"
RELEASE, NAMESPACE = "fs", "fedsched"
#: cert-manager and Prometheus Operator kinds: no built-in schema (kubernetes-validate warns).
CRD_KINDS = frozenset({"Certificate", "ServiceMonitor", "PrometheusRule"})
CLUSTER_SCOPED = frozenset({"ClusterRole", "ClusterRoleBinding"})
WORKLOADS = frozenset({"Deployment", "Job", "Pod"})


def helm() -> Any:
    """The helm-python-sdk module (skips with the reason when it is not installed)."""
    return pytest.importorskip("helm_python",
                               reason="helm-python-sdk not installed (pip install -e '.[dev]')")


def ci_files(chart: str) -> list[Path]:
    return sorted((CHARTS / chart / "ci").glob("*.yaml"))


def ci_cases() -> list[tuple[str, str]]:
    """(chart, ci values file name) for every CI values file of both charts."""
    return [(chart, f.name) for chart in (HUB, AGENT) for f in ci_files(chart)]


def load_values(chart: str, ci_file: str) -> dict[str, Any]:
    return yaml.safe_load((CHARTS / chart / "ci" / ci_file).read_text()) or {}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` deep-merged over a copy of ``base`` (as ``helm -f a -f b`` merges values)."""
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render(chart: str, values: dict[str, Any], name: str = RELEASE,
           namespace: str = NAMESPACE) -> dict[str, str]:
    """{template path: manifest} as ``helm install`` would render it."""
    with helm().Chart.load(str(CHARTS / chart)) as c:
        return c.render(values, name=name, namespace=namespace, is_install=True)


@functools.cache
def render_ci(chart: str, ci_file: str) -> dict[str, str]:
    return render(chart, load_values(chart, ci_file))


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object of a render (NOTES.txt and empty templates left out)."""
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    names = [d["metadata"]["name"] for d in find(docs, kind)]
    assert len(found) == 1, f"expected one {kind} {name}, found {names}"
    return found[0]


def fullname(chart: str, release: str = RELEASE) -> str:
    return f"{release}-{chart}"


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "Pod":
        return doc["spec"]
    return doc["spec"]["template"]["spec"]


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = pod_spec(doc)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in containers(doc) if c["name"] == name]
    return c


def argv(c: dict[str, Any]) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


def mounts(doc: dict[str, Any], c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> the pod volume mounted there, for one container."""
    vols = {v["name"]: v for v in pod_spec(doc).get("volumes", [])}
    return {m["mountPath"]: vols[m["name"]] for m in c.get("volumeMounts", [])}


def flag(args: list[str], name: str) -> str | None:
    """The value of ``--name=value`` (or ``--name value``) in ``args``; None when absent."""
    for i, a in enumerate(args):
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel/refId, PromQL) of every query in the dashboard the agent chart ships."""
    docs = documents(render_ci(AGENT, "active-monitoring-values.yaml"))
    cm = one(docs, "ConfigMap", f"{fullname(AGENT)}-dashboard")
    dash = json.loads(cm["data"]["fedsched-agent.json"])
    out = [(f"{p['title']}/{t['refId']}", t["expr"]) for p in dash["panels"] for t in p["targets"]]
    out += [(f"variable {v['name']}", v["query"]["query"]) for v in dash["templating"]["list"]
            if isinstance(v.get("query"), dict)]
    return out


# ---- the real tools ----------------------------------------------------------------------------

def checkov_bin() -> str | None:
    """checkov lives in its own virtualenv (.venv/checkov, scripts/test.sh): its pins
    (packaging<24, networkx<2.7) conflict with Flower's."""
    env = os.environ.get("FEDSCHED_CHECKOV")
    for cand in (env, str(REPO / ".venv" / "checkov" / "bin" / "checkov"), shutil.which("checkov")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def promtool_bin() -> str | None:
    return shutil.which("promtool")


# ---- the in-pod layout on loopback ---------------------------------------------------------------

@dataclass
class Localizer:
    """Maps in-pod absolute paths (mount points, working directories) to local directories,
    and ``host:port`` / ``=port`` / ``listen`` targets to loopback ports, in text and argv.

    ``paths``: in-pod prefix -> local directory (the longest prefix wins). ``addresses``:
    exact ``HOST:PORT`` strings -> replacement. ``ports``: in-pod port -> local port, applied
    to ``:PORT`` and ``=PORT`` occurrences that no address mapping took.
    """

    paths: dict[str, Path] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)

    def text(self, s: str) -> str:
        """Addresses, then paths, then ports; each in one pass (nothing replaced is rescanned)."""
        def sub(table: dict[str, str], before: str, text: str) -> str:
            if not table:
                return text
            alts = "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True))
            return re.sub(rf"(?<!{before})({alts})(?![\w.-])", lambda m: table[m.group(1)], text)

        s = sub(self.addresses, r"[\w.-]", s)
        s = sub({k: str(v) for k, v in self.paths.items()}, r"[\w/.-]", s)
        if self.ports:
            ports = "|".join(str(p) for p in self.ports)
            s = re.sub(rf"(?<=[:=])({ports})\b", lambda m: str(self.ports[int(m.group(1))]), s)
        return s

    def argv(self, args: list[str]) -> list[str]:
        return [self.text(a) for a in args]

    def env(self, c: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
        out = dict(base)
        for e in c.get("env", []):
            out[e["name"]] = self.text(str(e["value"]))
        return out

    def path(self, in_pod: str) -> Path:
        return Path(self.text(in_pod))


def write_secret(directory: Path, files: dict[str, Path]) -> Path:
    """A Secret's keys as the pod mounts them: ``{key: source file}`` copied into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, src in files.items():
        (directory / key).write_bytes(Path(src).read_bytes())
        (directory / key).chmod(0o600)
    return directory


def tls_secret(directory: Path, cert: Any, ca: Path) -> Path:
    """A kubernetes.io/tls Secret with ca.crt (``cert``: a certs.CertFiles) as mounted."""
    return write_secret(directory, {"tls.crt": cert.cert, "tls.key": cert.key, "ca.crt": ca})
