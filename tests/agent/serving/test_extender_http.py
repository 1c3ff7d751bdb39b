"""The extender's own HTTP/1.1 layer over raw sockets: framing, keep-alive, HTTP/1.0, Expect:
100-continue, the answers to broken requests (always a JSON 4xx, never a 5xx), and the JSON
decoder's edge cases (orjson with the stdlib's strict decoder behind it)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.serving import extender as ext
from tests.extender_support import payload, running

PREFIX = "/scheduler"


@pytest.fixture(scope="module")
def server() -> Iterator[ext.ExtenderServer]:
    items = payload("03-prioritize-request.full-nodes.json")["Nodes"]["items"]
    cache = ClusterCache()
    cache.replace_all(items, [])
    with running(cache, scheduler_name=None) as (srv, _client):
        yield srv


class Raw:
    """One TCP connection; answers read by their Content-Length."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def response(self, to_head: bool = False) -> tuple[int, dict[str, str], bytes]:
        """The next answer (to a HEAD request: no body whatever its Content-Length)."""
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"closed before an answer: {self.buf!r}"
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        version, code, _ = lines[0].split(" ", 2)
        assert version == "HTTP/1.1"
        headers = {}
        for line in lines[1:]:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
        if int(code) == 100:
            return 100, headers, b""
        n = 0 if to_head else int(headers["content-length"])
        while len(self.buf) < n:
            assert self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return int(code), headers, body

    def closed(self) -> bool:
        """Whether the server closed the connection (nothing more comes)."""
        return not self.buf and not self._fill()

    def close(self) -> None:
        self.sock.close()


def request(method: str, path: str, body: bytes | None = None, version: str = "HTTP/1.1",
            headers: dict[str, str] | None = None) -> bytes:
    h = {"Host": "x", **({"Content-Length": str(len(body))} if body is not None else {}), **(headers or {})}
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode("latin-1") + (body or b"")


def _prioritize_body(names: list[str]) -> bytes:
    pod = {"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": [
        {"resources": {"requests": {"cpu": "100m", "memory": "1Mi"}}}]}}
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


@pytest.fixture()
def conn(server: ext.ExtenderServer) -> Iterator[Raw]:
    c = Raw(server.port)
    yield c
    c.close()


def test_keep_alive_pipelined_requests_are_answered_in_order(conn: Raw) -> None:
    body = _prioritize_body(["node-a", "node-c"])
    conn.send(request("POST", f"{PREFIX}/prioritize", body) + request("GET", "/healthz")
              + request("POST", f"{PREFIX}/prioritize", _prioritize_body(["node-c"])))
    code, headers, out = conn.response()
    assert code == 200 and [h["Host"] for h in json.loads(out)] == ["node-a", "node-c"]
    assert headers["content-type"] == "application/json" and "connection" not in headers
    assert headers["server"].startswith("fedsched-extender") and headers["date"].endswith(" GMT")
    assert conn.response()[::2] == (200, b"ok\n")
    code, _, out = conn.response()
    assert code == 200 and [h["Host"] for h in json.loads(out)] == ["node-c"]


def test_connection_close_and_http10(server: ext.ExtenderServer) -> None:
    for version, extra, stays in (
        ("HTTP/1.1", {"Connection": "close"}, False),
        ("HTTP/1.0", {}, False),
        ("HTTP/1.0", {"Connection": "keep-alive"}, True),
        ("HTTP/1.1", {"Connection": "keep-alive"}, True),
    ):
        c = Raw(server.port)
        try:
            c.send(request("GET", "/healthz", version=version, headers=extra))
            code, headers, out = c.response()
            assert (code, out) == (200, b"ok\n")
            if stays:
                if version == "HTTP/1.0":
                    assert headers["connection"] == "keep-alive"
                c.send(request("GET", "/healthz", version=version, headers=extra))
                assert c.response()[0] == 200
            else:
                assert headers["connection"] == "close" and c.closed()
        finally:
            c.close()


def test_expect_100_continue(conn: Raw) -> None:
    body = _prioritize_body(["node-a"])
    conn.send(request("POST", f"{PREFIX}/prioritize", body=None,
                      headers={"Content-Length": str(len(body)), "Expect": "100-continue"}))
    assert conn.response()[0] == 100
    conn.send(body)
    code, _, out = conn.response()
    assert code == 200 and json.loads(out)[0]["Host"] == "node-a"


def test_http09_get_answers_the_body_alone(server: ext.ExtenderServer) -> None:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        s.sendall(b"GET /healthz\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert data == b"ok\n"
    finally:
        s.close()


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST /healthz\r\n\r\n", 400),  # HTTP/0.9 is GET only
        (b"GET / HTTP/1.1 extra\r\n\r\n", 400),
        (b"GET / HTTX/1.1\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 400),  # the stdlib answered 505: never a 5xx
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % k for k in range(101)) + b"\r\n", 431),
        (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\n folded: value\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400),
        (b"POST /scheduler/filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400),
        (b"POST /scheduler/filter HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        (b"POST /scheduler/filter HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}", 400),
        (b"POST /scheduler/filter HTTP/1.1\r\nContent-Length: 99999999999999\r\n\r\n{}", 413),
        (b"POST /scheduler/filter HTTP/1.1\r\n\r\n", 400),  # no Content-Length
    ],
)
def test_broken_framing_gets_a_json_4xx_and_the_connection_closes(conn: Raw, raw: bytes, code: int) -> None:
    conn.send(raw)
    got, headers, out = conn.response()
    assert got == code, out
    assert "Error" in json.loads(out)
    assert headers["connection"] == "close" and conn.closed()


def test_repeated_equal_content_length_and_other_headers_are_fine(conn: Raw) -> None:
    body = b'{"NodeNameToMetaVictims": {}}'
    conn.send(f"POST {PREFIX}/preempt HTTP/1.1\r\nContent-Length: {len(body)}\r\n"
              f"content-length: {len(body)}\r\nX-A: 1\r\nX-A: 2\r\n\r\n".encode() + body)
    assert conn.response()[::2] == (200, b'{"NodeNameToMetaVictims":{}}')


def test_methods_paths_and_leading_slashes(conn: Raw) -> None:
    conn.send(request("HEAD", f"{PREFIX}/filter"))
    code, headers, out = conn.response(to_head=True)
    assert code == 405 and headers["allow"] == "GET, POST" and out == b""  # HEAD: no body
    assert int(headers["content-length"]) > 0
    conn.send(request("DELETE", f"{PREFIX}/filter", b"{}"))
    code, headers, out = conn.response()
    assert code == 405 and "DELETE" in json.loads(out)["Error"]
    conn.send(request("GET", "//healthz?x=1"))  # one leading slash kept, the query ignored
    assert conn.response()[::2] == (200, b"ok\n")
    conn.send(request("GET", "/nope", b"ignored body"))  # a GET body is read and dropped
    code, _, out = conn.response()
    assert code == 404 and "/nope" in json.loads(out)["Error"]
    conn.send(request("GET", "/healthz"))
    assert conn.response()[0] == 200


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        (b"NaN", 400, "not valid JSON"),
        (b'{"Pod": {"x": Infinity}}', 400, "not valid JSON"),
        (b'{"Pod": {"x": -Infinity}}', 400, "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, 400, "not valid JSON"),
        (b'{"Pod": {"n": "\xff"}}', 400, "not valid JSON"),  # invalid UTF-8
        (b"", 400, "not valid JSON"),
        (b'{"Pod": {}, "NodeNames": [1]}', 400, "Pod is missing"),
        (b'{"Pod": {"a": 1}, "NodeNames": [1]}', 400, "NodeNames must be a list of strings"),
        (b'{"Pod": {"a": 1}, "NodeNames": ["node-a", "node-a"]}', 400, "named twice"),
        (b'{"Pod": {"a": 1}, "NodeNames": ["x"], "NodeNames": ["node-a"]}', 200, ""),  # the last counts
        (b'\xef\xbb\xbf{"Pod": {"a": 1}, "NodeNames": ["node-a"]}', 200, ""),  # a BOM, as the stdlib
        ('{"Pod": {"a": 1}, "NodeNames": ["node-a"]}'.encode("utf-16"), 200, ""),  # UTF-16, as the stdlib
        (b'{"Pod": {"a": "\\ud800"}, "NodeNames": ["node-a"]}', 200, ""),  # a lone surrogate
    ],
)
def test_json_edge_cases(conn: Raw, body: bytes, code: int, message: str) -> None:
    conn.send(request("POST", f"{PREFIX}/prioritize", body))
    got, _, out = conn.response()
    assert got == code, out
    ans = json.loads(out)
    if code == 400:
        assert message in ans["Error"], ans
    else:
        assert [h["Host"] for h in ans] == ["node-a"]


def test_answers_only_the_stdlib_encoder_can_write(conn: Raw) -> None:
    """Integers past 64 bits (the stdlib decoder's, in a body orjson refused) and lone surrogates
    are echoed by preempt as the stdlib wrote them."""
    body = b'\xef\xbb\xbf{"NodeNameToMetaVictims": {"n\\ud800": {"Pods": [], "NumPDBViolations": ' + \
        b"1" * 30 + b"}}}"
    conn.send(request("POST", f"{PREFIX}/preempt", body))
    code, _, out = conn.response()
    assert code == 200
    victims = {"n\ud800": {"Pods": [], "NumPDBViolations": int("1" * 30)}}
    assert json.loads(out) == {"NodeNameToMetaVictims": victims}


def test_deeply_nested_pods_are_kept_for_bind_or_refused(server: ext.ExtenderServer, conn: Raw) -> None:
    """orjson reads 1024 levels but writes 254: a deep field that bind reads (the pod's name here)
    is kept through the stdlib's encoder, and past its recursion limit the request is a 400 (the
    stdlib's decoder refused such bodies too); one that bind does not read is not kept at all."""
    for depth, field, code in ((300, b"name", 200), (1000, b"name", 400), (1000, b"x", 200)):
        deep = b"[" * depth + b'"leaf"' + b"]" * depth
        body = b'{"Pod": {"metadata": {"name": "deep", "uid": "deep-%d", "%s": %s}}, "NodeNames": ["node-a"]}'
        conn.send(request("POST", f"{PREFIX}/prioritize", body % (depth, field, deep)))
        got, _, out = conn.response()
        assert got == code, out
        assert "Error" in json.loads(out) if code == 400 else json.loads(out)[0]["Host"] == "node-a"
    assert b"leaf" not in server._pending["deep-1000"] and b"leaf" in server._pending["deep-300"]


def test_decode_and_dumps_helpers() -> None:
    assert ext.decode_body(b'{"a": 18446744073709551615}') == {"a": 18446744073709551615}
    assert ext.decode_body(b"1" * 25) == float("1" * 25)  # past 64 bits: orjson reads a float
    with pytest.raises(ext.BadRequest, match="not valid JSON"):
        ext.decode_body(b"1" * 5000)  # past the stdlib's 4300 digits
    assert ext.decode_body(b"1e400") == float("inf")  # as the stdlib read it (a quantity refuses it)
    assert ext.dumps({"a": [1, "b", None, True, 1.5]}) == b'{"a":[1,"b",null,true,1.5]}'
    assert json.loads(ext.dumps({"n": 2**70, "s": "\ud800"})) == {"n": 2**70, "s": "\ud800"}
