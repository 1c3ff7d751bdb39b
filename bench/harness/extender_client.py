"""Talking to the scheduler extender the way kube-scheduler does: :class:`Endpoint` (where an
extender listens on loopback: an in-process ``ExtenderServer`` or a ``fedsched serve`` process),
:class:`Client` (HTTP/1.1 keep-alive JSON) and :func:`metric` (a sum of samples in the agent's
``/metrics`` text). Imports the standard library and, lazily, ``prometheus_client``."""

from __future__ import annotations

import http.client
import json
from typing import Any, Protocol


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


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples matching ``labels`` in Prometheus text format."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
