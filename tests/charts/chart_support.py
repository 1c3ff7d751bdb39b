"""Helpers for the Helm chart tests on top of :mod:`bench.harness.charts` (rendering, manifest
lookup, the in-pod layout on loopback, shared with the scheduler benchmark): the pytest side of
rendering (:func:`helm`, :func:`render` and :func:`render_ci` skip with the reason when
helm-python-sdk is not installed; import them from here, the rest from ``bench.harness.charts``),
the CI values files, values merging, the parts of a workload, the agent's dashboard queries and
the real tools' locations. Imports :mod:`bench.harness` and ``tests.paths``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness import charts
from bench.harness.charts import AGENT, CHARTS, HUB, NAMESPACE, RELEASE, documents, fullname, one
from tests.paths import REPO

#: cert-manager and Prometheus Operator kinds: no built-in schema (kubernetes-validate warns).
CRD_KINDS = frozenset({"Certificate", "ServiceMonitor", "PrometheusRule"})
CLUSTER_SCOPED = frozenset({"ClusterRole", "ClusterRoleBinding"})
WORKLOADS = frozenset({"Deployment", "Job", "Pod"})


def helm() -> Any:
    """The helm-python-sdk module (skips with the reason when it is not installed)."""
    return pytest.importorskip("helm_python", reason=charts.HELM_MISSING)


def render(chart: str, values: dict[str, Any], name: str = RELEASE,
           namespace: str = NAMESPACE) -> dict[str, str]:
    """:func:`bench.harness.charts.render`, skipped without helm-python-sdk."""
    helm()
    return charts.render(chart, values, name=name, namespace=namespace)


def render_ci(chart: str, ci_file: str) -> dict[str, str]:
    """:func:`bench.harness.charts.render_ci` (cached), skipped without helm-python-sdk."""
    helm()
    return charts.render_ci(chart, ci_file)


def ci_files(chart: str) -> list[Path]:
    return sorted((CHARTS / chart / "ci").glob("*.yaml"))


def ci_cases() -> list[tuple[str, str]]:
    """(chart, ci values file name) for every CI values file of both charts."""
    return [(chart, f.name) for chart in (HUB, AGENT) for f in ci_files(chart)]


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` deep-merged over a copy of ``base`` (as ``helm -f a -f b`` merges values)."""
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


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
