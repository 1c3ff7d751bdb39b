"""Phase 4, fuzz: requests a scheduler should never send, and what the server answered to them.

Most are drawn with the hypothesis strategies the test suite's fuzzer shares
(``bench/harness/fuzz_strategies.py``, as ``tests/agent/serving/test_extender_fuzz.py`` draws
them), on one keep-alive connection:

- ``verbs``: bodies of every verb (Pod, NodeNames and Nodes lists, bind and preempt bodies of the
  right shape most of the time, wrongly typed fields, bad quantities) or any JSON value;
- ``profiles``: pods of the fedsched profile, of another one, or of none that makes sense;
- ``bytes``: random methods, paths and byte strings.

Two guards keep the cluster the soak runs on as it is: a Node object under a name the agent does
not know always carries something it must refuse (more GPUs than it holds, capacities past
int64, quantities that do not parse), and a bind names a pod UID that no request carried. The
pods of ``verbs`` name the server's profile (``fedsched``) so that the agent reads them.

The rest is what ``http.client`` cannot send, written by hand on fresh connections (half-closed
after the request): a valid request cut short (``truncated``, with an honest or a lying
Content-Length) and bad request heads (``protocol``: no, bad, negative or huge Content-Length,
chunked, garbage request lines, a 70 KB header, 150 headers, HTTP/1.0, bad versions).
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
from collections import Counter
from typing import Any

from harness.extender_client import Endpoint
from harness.fuzz_strategies import (
    JSON,
    METHODS,
    NODE,
    PATHS,
    PREFIX,
    PROFILE_PODS,
    RAW_BODIES,
    VERBS,
    bind_bodies,
    fuzzed_pods,
    verb_bodies,
)
from harness.serve import get
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from extender.metrics import cache_nodes, diff, scrape
from extender.workload import Workload, connect
from fedsched.agent.cluster.k8s_objects import GPU_RESOURCE, pod_to_json

PROFILE = "fedsched"  # fedsched serve's --scheduler-name
MIX = {"verbs": 4, "profiles": 1, "bytes": 2, "truncated": 1, "protocol": 1}  # category weights
_WEIGHTED = [cat for cat, weight in MIX.items() for _ in range(weight)]
# A wide integer taken modulo: sampled_from would favour the first categories (it draws towards
# what it shrinks to), which would skew the mix.
CATEGORIES = st.integers(0, 2**32 - 1).map(lambda k: _WEIGHTED[k % len(_WEIGHTED)])

# Node quantities the agent must refuse, and the allocatable entries that carry them.
NODE_BAD_QUANTITIES: list[Any] = [
    "-1", "NaN", "Infinity", "abc", "", "0x10", "1e309", "9" * 400, "1e30", True, None, [], {}, -5, 1e308,
]
REFUSED_ALLOCATABLE = st.sampled_from(
    [(GPU_RESOURCE, str(n)) for n in (9, 16, 64)]
    + [("cpu", q) for q in ("1e18", "1e30", "9" * 30)]
    + [(r, q) for r in ("cpu", "memory", GPU_RESOURCE) for q in NODE_BAD_QUANTITIES]
)
GARBAGE_REQUEST_LINES = [b"\x00\x01\x02\r\n\r\n", b"GET\r\n\r\n", b"POST /scheduler/filter\r\n\r\n",
                         b"FOO BAR BAZ QUX\r\n\r\n", b"G" * 70000 + b"\r\n\r\n"]

Case = tuple[str, str, str, bytes | None, bytes | None]


def _request(method: str, path: str, body: bytes, head: dict[str, str | None]) -> bytes:
    """An HTTP/1.1 request with ``head`` over the usual headers (None: that header left out)."""
    hdrs: dict[str, str | None] = {"Host": "127.0.0.1", "Content-Type": "application/json",
                                   "Content-Length": str(len(body))}
    hdrs.update(head)
    lines = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items() if v is not None)
    return f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode() + body


def refused_node(drawn: tuple[Any, tuple[str, Any]]) -> Any:
    """A fuzzed Node object that the agent cannot learn: one whose name it could learn gets an
    allocatable entry it must refuse (the others fail on their metadata or status already)."""
    node, (resource, quantity) = drawn
    if not isinstance(node, dict):
        return node
    meta, status = node.get("metadata"), node.get("status")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return node
    if status is not None and not isinstance(status, dict):
        return node
    alloc = (status or {}).get("allocatable")
    if alloc is not None and not isinstance(alloc, dict):
        return node
    return {**node, "status": {**(status or {}), "allocatable": {**(alloc or {}), resource: quantity}}}


def unseen_uid(body: Any) -> Any:
    """A bind body whose PodUID (when it is a string) no filter or prioritize request carried."""
    if isinstance(body, dict) and isinstance(body.get("PodUID"), str):
        return {**body, "PodUID": f"never-seen-{body['PodUID']}"}
    return body


class Fuzzer:
    """Requests a scheduler should never send, and what the server answered to them."""

    def __init__(self, endpoint: Endpoint, wl: Workload, seed: int) -> None:
        self.endpoint = endpoint
        self.wl = wl
        self.seed = seed
        self.r = random.Random(seed)
        self.known = list(wl.nodes.names)
        self.conn = connect(endpoint, timeout=10.0)
        self.statuses: dict[str, Counter] = {}
        self.examples_5xx: list[dict[str, Any]] = []
        self.sent = 0
        self.bodies = verb_bodies(
            self.known,
            pod=fuzzed_pods(PROFILE),
            node=st.tuples(NODE, REFUSED_ALLOCATABLE).map(refused_node),
            bind=bind_bodies(self.known).map(unseen_uid),
        )
        self.candidates = st.lists(st.sampled_from(self.known), unique=True, max_size=5)

    def valid(self, r: random.Random) -> dict[str, Any]:
        """A valid request (an openb pod that fits somewhere, known names)."""
        pod = self.wl.random_pod()
        names = r.sample(self.known, r.choice([0, 1, 5, 50]))
        obj = pod_to_json(pod, "fuzz", self.wl.nodes.models, uid=f"fuzz-{r.getrandbits(64):x}")
        return {"Pod": obj, "NodeNames": names}

    def case(self, data: st.DataObject) -> Case:
        """(category, method or the kind of bad head, path, body, the whole request when it is
        written by hand or None when it goes through http.client)."""
        cat = data.draw(CATEGORIES, label="category")
        if cat == "verbs":
            verb = data.draw(st.sampled_from(VERBS), label="verb")
            body = data.draw(self.bodies[verb] | JSON, label="body")
            return cat, "POST", f"{PREFIX}/{verb}", json.dumps(body).encode(), None
        if cat == "profiles":
            verb = data.draw(st.sampled_from(["filter", "prioritize"]), label="verb")
            body = {"Pod": data.draw(PROFILE_PODS, label="pod"), "NodeNames": data.draw(self.candidates)}
            return cat, "POST", f"{PREFIX}/{verb}", json.dumps(body).encode(), None
        if cat == "bytes":
            method, path = data.draw(METHODS, label="method"), data.draw(PATHS, label="path")
            raw = data.draw(RAW_BODIES, label="body")
            return cat, method, path, raw if method not in ("GET", "HEAD") else None, None
        # Written by hand, with random choices seeded by hypothesis: each case is a new example
        # to it (a case that drew nothing would look like the only one there is).
        return self.by_hand(cat, random.Random(data.draw(st.integers(0, 2**64 - 1), label="seed")))

    def by_hand(self, cat: str, r: random.Random) -> Case:
        """A valid request cut short (``truncated``) or with a bad head (``protocol``)."""
        path = f"{PREFIX}/{r.choice(['filter', 'prioritize'])}"
        raw = json.dumps(self.valid(r)).encode()
        if cat == "truncated":
            cut = r.randrange(len(raw))
            if r.random() < 0.5:  # honest Content-Length of a cut body
                return cat, "POST", path, raw[:cut], None
            # announces the whole body, sends part of it, then half-closes
            lying = {"Content-Length": str(len(raw))}
            return cat, "POST", path, raw[:cut], _request("POST", path, raw[:cut], lying)
        kind = r.choice(["no_length", "bad_length", "negative_length", "huge_length", "chunked",
                         "garbage_line", "long_header", "many_headers", "http10", "bad_version"])
        heads: dict[str, dict[str, str | None]] = {
            "no_length": {"Content-Length": None},
            "bad_length": {"Content-Length": r.choice(["abc", "1.5", "", "0x10", "١٢"])},
            "negative_length": {"Content-Length": "-5"},
            "huge_length": {"Content-Length": str(10**12)},
            "chunked": {"Content-Length": None, "Transfer-Encoding": "chunked"},
        }
        if kind in heads:
            return cat, "POST", path, raw, _request("POST", path, raw, heads[kind])
        if kind == "garbage_line":
            req = r.choice(GARBAGE_REQUEST_LINES)
        elif kind == "long_header":
            req = f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Long: {'a' * 70000}\r\n\r\n".encode()
        elif kind == "many_headers":
            hs = "".join(f"X-H{i}: {i}\r\n" for i in range(150))
            req = f"POST {path} HTTP/1.1\r\nHost: x\r\n{hs}Content-Length: {len(raw)}\r\n\r\n".encode() + raw
        else:
            version = "HTTP/1.0" if kind == "http10" else r.choice(
                ["HTTP/1.x", "HTTP/abc", "HTTPS/1.1", "HTTP/1.1.1", "http/1.1"])
            req = f"POST {path} {version}\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw
        return cat, kind, path, raw, req

    def send(self, method: str, path: str, body: bytes | None, request: bytes | None) -> int:
        """The status, or -1 when the server closed the connection without answering; a request
        written by hand goes on a fresh connection (see :func:`raw_exchange`)."""
        if request is not None:
            return raw_exchange(self.endpoint.port, request)
        try:
            return self.conn.raw(method, path, body)[0]
        except (http.client.HTTPException, ConnectionError, TimeoutError):
            self.conn.close()  # http.client opens a new one for the next request
            return -1

    def _one(self, data: st.DataObject) -> None:
        cat, method, path, body, request = self.case(data)
        status = self.send(method, path, body, request)
        self.sent += 1
        self.statuses.setdefault(cat, Counter())[str(status)] += 1
        if status >= 500 and len(self.examples_5xx) < 10:
            self.examples_5xx.append({"category": cat, "method": method, "path": path[:200],
                                      "body": (body or b"")[:300].decode(errors="replace"), "status": status})

    def run(self, count: int) -> dict[str, Any]:
        before = scrape(self.endpoint)
        nodes_before = cache_nodes(self.endpoint)
        t0 = time.perf_counter()

        @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @hypothesis_seed(self.seed)
        @given(data=st.data())
        def fuzz(data: st.DataObject) -> None:
            self._one(data)

        fuzz()
        elapsed = time.perf_counter() - t0
        self.conn.close()
        d = diff(scrape(self.endpoint), before)
        total: Counter = Counter()
        for c in self.statuses.values():
            total.update(c)
        fivexx = sum(v for k, v in total.items() if int(k) >= 500)
        health = get(self.endpoint, "/healthz")[0]
        # and a correct answer afterwards
        valid = self.valid(self.r)
        valid["NodeNames"] = self.r.sample(self.known, 100)
        c = connect(self.endpoint)
        status, data = c.post_bytes("prioritize", json.dumps(valid).encode())
        c.close()
        correct = status == 200 and [h["Host"] for h in json.loads(data)] == valid["NodeNames"]
        return {
            "requests": self.sent,
            "seconds": round(elapsed, 1),
            "statuses": dict(sorted(total.items())),
            "by_category": {k: dict(sorted(v.items())) for k, v in sorted(self.statuses.items())},
            "5xx": fivexx,
            "no_response": total.get("-1", 0),
            "answered_without_status_line": total.get("0", 0),
            "internal_errors": d["fallbacks"].get("internal", 0),
            "healthz_after": health,
            "cluster_nodes_before_after": [nodes_before, cache_nodes(self.endpoint)],
            "prioritize_correct_after": correct,
            "examples_5xx": self.examples_5xx,
        }


def raw_exchange(port: int, req: bytes, timeout: float = 10.0) -> int:
    """Send ``req`` on a fresh connection, half-close, read to EOF: the first answer's status; 0
    when the answer has no status line (the stdlib's error page for a request line it cannot
    parse is written HTTP/0.9-style, body only); -1 when the server closed without answering."""
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(req)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before reading everything
            pass
        try:
            while data := s.recv(65536):
                chunks.append(data)
        except (ConnectionError, TimeoutError):
            pass
    data = b"".join(chunks)
    if not data:
        return -1
    if data.startswith(b"HTTP/1.") and len(data.split(b" ", 2)) > 1 and data.split(b" ", 2)[1].isdigit():
        return int(data.split(b" ", 2)[1])
    return 0


def probe_http2_request_line(port: int) -> int:
    """An HTTP/2.0 request line: the stdlib answers 505 (HTTP Version Not Supported)."""
    return raw_exchange(port, f"POST {PREFIX}/filter HTTP/2.0\r\nContent-Length: 2\r\n\r\n{{}}".encode())
