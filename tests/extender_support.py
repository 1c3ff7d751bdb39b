"""Test helpers for the online agent: a real in-process extender on loopback (:func:`running`),
telemetry snapshots, the recorded extender payloads and a mutual-TLS PKI. The client for it and the
``fedsched serve`` process are in :mod:`bench.harness.extender_client` and
:mod:`bench.harness.serve` (the benchmarks use them too)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.extender_client import Client
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.telemetry import NodeUsage, TelemetrySnapshot
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.extender import ExtenderServer
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.security import certs

PAYLOADS = Path(__file__).parent / "data" / "extender-payloads"


def payload(name: str) -> Any:
    return json.loads((PAYLOADS / name).read_text())


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
