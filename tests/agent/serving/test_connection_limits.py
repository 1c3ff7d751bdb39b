"""The extender's connections are bounded (issue 26, item 2): by count (past the limit the oldest
idle connection makes room, and with none idle a new one gets a 503 and is closed), by idle time,
by the time a request's head and its body may take (a slow-loris connection is cut however often
it sends a byte), and counted in ``/metrics``. Loopback only, a few sockets, each test bounded by
the limits it sets plus margins that a loaded machine cannot eat (nothing asserts a speed)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Callable, Iterator

import pytest

from bench.harness.extender_client import Client, metric
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.extender import ConnectionLimits, ExtenderServer, server_tls
from fedsched.agent.serving.model_store import ModelStore
from tests.extender_support import agent_pki, payload

GIVE_UP_S = 10.0  # how long a test waits for what must happen (a margin, never the expectation)


@pytest.fixture(scope="module")
def cache() -> ClusterCache:
    c = ClusterCache()
    c.replace_all(payload("03-prioritize-request.full-nodes.json")["Nodes"]["items"], [])
    return c


@contextlib.contextmanager
def serving(
    cache: ClusterCache, tls: ssl.SSLContext | None = None, **limits: float
) -> Iterator[ExtenderServer]:
    decider = Decider(cache, ModelStore("learned"), DeciderConfig(budget_ms=2000.0))
    server = ExtenderServer(decider, port=0, tls=tls, limits=ConnectionLimits(**limits))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        decider.close()


def connect(server: ExtenderServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=GIVE_UP_S)


def closed_by_server(sock: socket.socket, between_tries: Callable[[], None] = lambda: None) -> bool:
    """Wait (at most GIVE_UP_S) until the server closes ``sock``; ``between_tries`` runs every
    0.2 s while it is open (a slow-loris byte)."""
    deadline = time.monotonic() + GIVE_UP_S
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionError:
            return True
        try:
            between_tries()
        except (BrokenPipeError, ConnectionError):
            return True
    return False


def scrape(server: ExtenderServer) -> str:
    c = Client(server)
    try:
        status, text = c.get("/metrics")
        assert status == 200
        return text
    finally:
        c.close()


def test_idle_connections_beyond_the_limit_do_not_stop_healthz(cache) -> None:
    with serving(cache, max_connections=4, idle_timeout_s=600) as server:
        idle = [connect(server) for _ in range(12)]
        try:
            c = Client(server)
            assert c.get("/healthz") == (200, "ok\n")
            status, text = c.get("/metrics")
            c.close()
            assert status == 200
            assert closed_by_server(idle[0])  # the oldest idle connection made room
        finally:
            for s in idle:
                s.close()
    # 12 idle connections and the client's, 4 at a time: each one past the fourth evicted one.
    assert metric(text, "fedsched_connections_accepted_total") == 13
    assert metric(text, "fedsched_connections_closed_total", reason="evicted") == 9
    assert metric(text, "fedsched_connections_open") <= 4
    assert metric(text, "fedsched_connections_refused_total") == 0


def test_a_slow_loris_is_cut_after_the_header_timeout(cache) -> None:
    with serving(cache, header_timeout_s=2.0, idle_timeout_s=600) as server:
        s = connect(server)
        t0 = time.monotonic()
        s.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        assert closed_by_server(s, lambda: s.sendall(b"a")), "a byte every 0.2 s kept the head open"
        held = time.monotonic() - t0
        s.close()
        text = scrape(server)
    assert held >= 2.0  # not before its time
    assert metric(text, "fedsched_connections_closed_total", reason="header_timeout") == 1


def test_a_tls_handshake_that_never_comes_is_cut_after_the_header_timeout(cache, tmp_path) -> None:
    pki = agent_pki(tmp_path)
    tls = server_tls(pki.server.files.cert, pki.server.files.key, pki.ca)
    with serving(cache, tls=tls, header_timeout_s=2.0, idle_timeout_s=600) as server:
        s = connect(server)
        s.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, then nothing
        assert closed_by_server(s)
        s.close()
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(str(pki.client.files.cert), str(pki.client.files.key))
        with ctx.wrap_socket(connect(server), server_hostname="localhost") as c:
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
    text = answer.split(b"\r\n\r\n", 1)[1].decode()
    assert metric(text, "fedsched_connections_closed_total", reason="header_timeout") == 1


def test_an_idle_connection_is_closed_after_the_idle_timeout(cache) -> None:
    with serving(cache, idle_timeout_s=2.0) as server:
        s = connect(server)
        t0 = time.monotonic()  # before the request: the idle time starts after its answer
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed_by_server(s)
        held = time.monotonic() - t0
        s.close()
        text = scrape(server)
    assert held >= 2.0
    assert metric(text, "fedsched_connections_closed_total", reason="idle_timeout") >= 1


def test_a_body_that_stops_coming_is_cut_after_the_body_timeout(cache) -> None:
    with serving(cache, body_timeout_s=2.0, idle_timeout_s=600) as server:
        s = connect(server)
        s.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"Pod\"")
        assert closed_by_server(s, lambda: s.sendall(b" "))
        s.close()
        text = scrape(server)
    assert metric(text, "fedsched_connections_closed_total", reason="body_timeout") == 1


def test_past_the_limit_with_none_idle_a_new_connection_gets_a_503(cache) -> None:
    with serving(cache, max_connections=2, idle_timeout_s=600, body_timeout_s=600) as server:
        busy = [connect(server) for _ in range(2)]
        for s in busy:  # each in the middle of a body: working, not idle
            s.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.1 100 ")  # the server has read the head
            s.sendall(b"{")
        extra = connect(server)
        answer = b""
        with contextlib.suppress(ConnectionError):
            while chunk := extra.recv(65536):
                answer += chunk
        extra.close()
        for s in busy:
            s.close()
        deadline = time.monotonic() + GIVE_UP_S
        while True:  # the two closed connections go away, and the server answers again
            try:
                text = scrape(server)
                break
            except (ConnectionError, AssertionError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in answer, answer
    assert metric(text, "fedsched_connections_refused_total") >= 1
