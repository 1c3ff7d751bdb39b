"""The Helm charts rendered offline, for the chart tests and the scheduler benchmark: rendering
with helm-python-sdk, manifest lookup, and the charts' in-pod layout mapped onto a local directory.

Every render is the chart as Helm renders it (``helm_python.Chart.load(...).render``, Helm v4
as a library, no cluster); renders of the CI values files are cached per chart and values file
so that callers share them. :class:`Localizer` rewrites what a container would run (its command,
arguments, environment, working directory and mounted config files) from in-pod paths, ports and
Service names to a temporary directory and free loopback ports, so that a loopback run executes
exactly the flags and configs the charts render, and nothing hand-written. :func:`tls_secret`
lays out a TLS Secret's files as a pod mounts them.

Imports ``yaml`` and, when rendering, ``helm_python`` (an ImportError saying how to install it when
it is missing; the tests turn that into a skip in ``tests/charts/chart_support.py``).
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import ROOT

CHARTS = ROOT / "charts"
HUB, AGENT = "fedsched-hub", "fedsched-agent"
RELEASE, NAMESPACE = "fs", "fedsched"
HELM_MISSING = "helm-python-sdk not installed (pip install -e '.[dev]')"


def helm() -> Any:
    """The helm-python-sdk module (ImportError with :data:`HELM_MISSING` when it is not installed)."""
    try:
        return importlib.import_module("helm_python")
    except ImportError as e:
        raise ImportError(HELM_MISSING) from e


def load_values(chart: str, ci_file: str) -> dict[str, Any]:
    return yaml.safe_load((CHARTS / chart / "ci" / ci_file).read_text()) or {}


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
