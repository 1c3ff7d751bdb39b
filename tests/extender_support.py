"""Test helpers for the online agent: a real extender on loopback, a ``fedsched serve`` process
and a JSON client for either (the load benchmark, ``bench/``, uses the process and the client too)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.telemetry import NodeUsage, TelemetrySnapshot
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.extender import ExtenderServer
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.security import certs

PAYLOADS = Path(__file__).parent / "data" / "extender-payloads"


def payload(name: str) -> Any:
    return json.loads((PAYLOADS / name).read_text())


class Endpoint(Protocol):
    """Where an extender listens on loopback: an :class:`ExtenderServer` or a :class:`ServeProcess`."""

    @property
    def port(self) -> int: ...

    @property
    def prefix(self) -> str: ...


class Client:
    """HTTP/1.1 keep-alive JSON client, as kube-scheduler's extender client is (http.client turns
    Nagle off, and opens a new connection by itself after the server closed one)."""

    def __init__(self, server: Endpoint, timeout: float = 10.0) -> None:
        self.server = server
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)

    def raw(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        h = {"Content-Type": "application/json", **(headers or {})}
        try:
            self.conn.request(method, path, body, h)
            r = self.conn.getresponse()
            return r.status, r.read()
        except (http.client.HTTPException, ConnectionError):
            self.conn.close()
            raise

    def post_bytes(self, verb: str, body: bytes) -> tuple[int, bytes]:
        """POST an encoded body to a verb: the status and the answer as it came."""
        return self.raw("POST", f"{self.server.prefix}/{verb}", body)

    def post(self, verb: str, body: Any) -> tuple[int, Any]:
        status, data = self.post_bytes(verb, json.dumps(body).encode())
        return status, json.loads(data)

    def get(self, path: str) -> tuple[int, str]:
        status, data = self.raw("GET", path)
        return status, data.decode()

    def close(self) -> None:
        self.conn.close()


@contextlib.contextmanager
def running(
    cache: ClusterCache, policy: str = "learned", allow_bind: bool = True, **cfg: Any
) -> Iterator[tuple[ExtenderServer, Client]]:
    cfg.setdefault("budget_ms", 2000.0)  # tests about the budget set it; the others must not time out
    decider = Decider(cache, ModelStore(policy), DeciderConfig(**cfg))
    server = ExtenderServer(decider, port=0, allow_bind=allow_bind)
    server.start()
    client = Client(server)
    try:
        yield server, client
    finally:
        client.close()
        server.stop()
        decider.close()


def snapshot(usage: dict[str, tuple[float, float]], age_s: float = 0.0, up: bool = True) -> TelemetrySnapshot:
    """Telemetry as Prometheus would report it: (cpu_ratio, mem_ratio) per node, ``age_s`` old."""
    now = time.time()
    nodes = {n: NodeUsage(c, m, float("nan"), float("nan"), now - age_s) for n, (c, m) in usage.items()}
    return TelemetrySnapshot(up, now if up else 0.0, nodes, "" if up else "connection refused")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples matching ``labels`` in Prometheus text format."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


@dataclass
class ServeProcess:
    """A running ``fedsched serve`` process (see :func:`serve_process`)."""

    proc: subprocess.Popen
    url: str = ""  # the verbs' URL prefix, e.g. http://127.0.0.1:PORT/scheduler
    base: str = ""  # the server's root (for /metrics, /readyz)
    stderr: str = ""  # the process's logs, after it stopped

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None, self.url
        return port

    @property
    def prefix(self) -> str:
        return urlsplit(self.url).path


@contextlib.contextmanager
def serve_process(
    *args: str,
    command_prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    stderr_path: Path | None = None,
) -> Iterator[ServeProcess]:
    """Run ``fedsched serve ARGS`` until it listens; SIGTERM it on exit (its logs in ``stderr``).

    ``command_prefix`` runs it under another command (``taskset -c 0``), ``env`` is added to its
    environment, and with ``stderr_path`` its logs go to that file as it runs (read into
    ``stderr`` at exit) rather than to a pipe read only at exit, which a long run would fill."""
    base_env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    log = open(stderr_path, "w") if stderr_path is not None else None  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [*command_prefix, sys.executable, "-m", "fedsched.common.cli.main", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if log is None else log,
        text=True,
        env={**base_env, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    sp = ServeProcess(proc)
    try:
        line = proc.stdout.readline()
        if "listening on" not in line:
            if stderr_path is not None:
                raise AssertionError(line + stderr_path.read_text(errors="replace")[-2000:])
            raise AssertionError(proc.stderr.read() if proc.poll() is not None else line)
        sp.url = line.split("listening on ")[1].split()[0]
        sp.base = sp.url.rsplit("/scheduler", 1)[0]
        yield sp
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if log is not None:
                log.close()
        sp.stderr = err if stderr_path is None else stderr_path.read_text(errors="replace")


@dataclass
class AgentPki:
    """Certificates for mutual-TLS tests of the agent, from ``fedsched certs``' own code."""

    server: certs.Issued  # the agent's serving certificate (localhost, 127.0.0.1)
    client: certs.Issued  # kube-scheduler's client certificate, signed by the same CA
    intruder: certs.Issued  # a client certificate signed by another CA
    ca: Path  # the CA certificate the agent trusts


def agent_pki(root: Path) -> AgentPki:
    pki, other = root / "pki", root / "other"
    certs.init_ca(pki)
    certs.init_ca(other)
    return AgentPki(
        certs.issue(pki, "fedsched-agent", kind="server", hosts=["localhost"], ips=["127.0.0.1"]),
        certs.issue(pki, "kube-scheduler", kind="client"),
        certs.issue(other, "intruder", kind="client"),
        certs.ca_files(pki).cert,
    )
