"""A recording mutual-TLS relay between the real kube-scheduler and ``fedsched serve``.

kube-scheduler keeps no record of what its extender answered, and ``fedsched serve`` logs no
per-pod decision (its decision log keeps features and the node the pod really went to, not
names). This relay sits where kube-scheduler's ``urlPrefix`` points: it terminates kube-scheduler's
mutual TLS with the extender's own serving certificate and client CA (so kube-scheduler sees
exactly the TLS it would see from the agent), forwards each request unchanged over a second
mutual-TLS connection with kube-scheduler's client certificate, and keeps every exchange:
the verb, the request (the pod and the candidate ``NodeNames``), the status and answer that
went back, and how long the relay held it. :meth:`ExtenderRecorder.stop` closes the listener and
every open connection, which is what kube-scheduler sees of an extender that went down.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Exchange:
    verb: str  # the path after the urlPrefix: filter, prioritize, ...
    pod_uid: str
    pod_name: str  # namespace/name
    scheduler_name: str
    request: dict
    status: int
    response: Any
    started: float  # time.monotonic() when the request had been read
    held_s: float  # from the request read to the answer ready (the relay's and the agent's time)

    @property
    def node_names(self) -> list[str]:
        return list(self.request.get("NodeNames") or [])

    def scores(self) -> dict[str, int]:
        """A prioritize answer as {host: score}."""
        return {h["Host"]: int(h["Score"]) for h in (self.response or [])}

    def top(self) -> set[str]:
        """The hosts with the highest score of a prioritize answer (empty: no answer)."""
        s = self.scores()
        if not s:
            return set()
        best = max(s.values())
        return {h for h, v in s.items() if v == best}

    def refused(self) -> dict[str, str]:
        """A filter answer's FailedNodes and FailedAndUnresolvableNodes."""
        r = self.response if isinstance(self.response, dict) else {}
        return {**(r.get("FailedNodes") or {}), **(r.get("FailedAndUnresolvableNodes") or {})}


class _TLSConnection(http.client.HTTPConnection):
    """HTTPS to a loopback address, the certificate verified for ``name`` (the Service's DNS
    name, as kube-scheduler's ``tlsConfig.serverName`` does); Nagle off."""

    def __init__(self, addr: tuple[str, int], name: str, ctx: ssl.SSLContext) -> None:
        super().__init__(addr[0], addr[1], timeout=30)
        self._name, self._ctx = name, ctx

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._ctx.wrap_socket(raw, server_hostname=self._name)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    transport_errors: list[str]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke (kube-scheduler closing one mid-handshake, the relay stopped):
        kept, not printed."""
        self.transport_errors.append(repr(sys.exc_info()[1]))


class ExtenderRecorder:
    """Listens on 127.0.0.1 (``server_ctx``: the extender's TLS, requiring a client certificate)
    and relays to ``upstream`` (host, port) with ``client_ctx`` verified for ``upstream_name``."""

    def __init__(self, upstream: tuple[str, int], upstream_name: str, server_ctx: ssl.SSLContext,
                 client_ctx: ssl.SSLContext) -> None:
        self.upstream = upstream
        self.upstream_name = upstream_name
        self.client_ctx = client_ctx
        self.exchanges: list[Exchange] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._local = threading.local()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def setup(self) -> None:
                with recorder._lock:
                    recorder._conns.add(self.request)
                super().setup()

            def finish(self) -> None:
                with contextlib.suppress(OSError):
                    super().finish()
                with recorder._lock:
                    recorder._conns.discard(self.request)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                t0 = time.monotonic()
                try:
                    status, ctype, out = recorder._forward(self.path, body, self.headers.get("Content-Type"))
                except (OSError, http.client.HTTPException) as e:
                    recorder.errors.append(f"{self.path}: {e!r}")
                    status, ctype, out = 502, "text/plain", str(e).encode()
                # recorded before the answer goes out: once kube-scheduler has it (and may bind),
                # the exchange is on record
                recorder._record(self.path, body, status, out, t0, time.monotonic() - t0)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler, bind_and_activate=True)
        self._server.transport_errors = self.transport_errors = []
        self._server.socket = server_ctx.wrap_socket(self._server.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name="extender-recorder")
        self._running = False

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ExtenderRecorder:
        self._thread.start()
        self._running = True
        return self

    def stop(self) -> None:
        """Close the listener and every open connection (the extender is down)."""
        if not self._running:
            return
        self._running = False
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                c.close()

    # ---- relaying ------------------------------------------------------------------------------
    def _forward(self, path: str, body: bytes, ctype: str | None) -> tuple[int, str, bytes]:
        """One request upstream on this thread's keep-alive connection (one retry on a fresh
        connection when the kept one was closed)."""
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = _TLSConnection(self.upstream, self.upstream_name, self.client_ctx)
            try:
                conn.request("POST", path, body, {"Content-Type": ctype or "application/json"})
                r = conn.getresponse()
                return r.status, r.headers.get("Content-Type", "application/json"), r.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _record(self, path: str, body: bytes, status: int, out: bytes, t0: float, held: float) -> None:
        try:
            req = json.loads(body) if body else {}
        except ValueError:
            req = {}
        try:
            resp = json.loads(out) if out else None
        except ValueError:
            resp = out.decode(errors="replace")
        pod = req.get("Pod") or {}
        meta = pod.get("metadata") or {}
        ex = Exchange(path.rsplit("/", 1)[-1], str(meta.get("uid", "")),
                      f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                      str((pod.get("spec") or {}).get("schedulerName", "")), req, status, resp, t0, held)
        with self._lock:
            self.exchanges.append(ex)

    # ---- reading the record ----------------------------------------------------------------------
    def snapshot(self) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges)

    def of_pod(self, uid: str, verb: str | None = None) -> list[Exchange]:
        return [e for e in self.snapshot() if e.pod_uid == uid and (verb is None or e.verb == verb)]

    def pods_seen(self) -> set[str]:
        return {e.pod_uid for e in self.snapshot()}


@contextlib.contextmanager
def recording(upstream: tuple[str, int], upstream_name: str, server_ctx: ssl.SSLContext,
              client_ctx: ssl.SSLContext) -> Iterator[ExtenderRecorder]:
    rec = ExtenderRecorder(upstream, upstream_name, server_ctx, client_ctx).start()
    try:
        yield rec
    finally:
        rec.stop()
