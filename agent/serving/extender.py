"""The kube-scheduler extender: HTTP(S) filter / prioritize / bind / preempt verbs.

The wire format is k8s.io/kube-scheduler/extender/v1 (reference section 2): POST
``{prefix}/{verb}`` with a JSON body whose keys are Go field names (``Pod``, ``Nodes``,
``NodeNames``); with ``nodeCacheCapable: true`` the scheduler sends ``NodeNames`` only and the
agent answers from its own cache; with full ``Nodes`` the agent learns nodes it does not know
from the request and answers ``Nodes`` back. Filter returns ``{"Nodes", "NodeNames",
"FailedNodes", "FailedAndUnresolvableNodes", "Error"}``; prioritize returns a bare
``[{"Host", "Score"}]`` with every candidate exactly once, scores 0..10; bind (local mode
only: binds into the simulated cluster) returns ``{"Error"}``; preempt has no objection and
returns the victims it was given as ``NodeNameToMetaVictims``.

Errors: a body that is not a valid request gets a 400 with ``{"Error": "..."}`` naming what
is wrong; an unknown path a 404; nothing the client sends produces a 5xx: an internal failure
answers a neutral result (filter: every node passes with ``Error`` set, which an
``ignorable`` extender skips; prioritize: zero scores) and is counted.

Also served: ``GET /metrics`` (Prometheus), ``/healthz`` (the process answers), ``/readyz``
(200 once the cache is synced and a model is loaded), ``/openapi.json`` (the verbs' schema),
``POST /admin/reload`` (reload the policy file; optional JSON ``{"path": "..."}``).

Transport: HTTP/1.1 keep-alive (kube-scheduler reuses connections) with Nagle's algorithm
off (otherwise every response waits ~40 ms for a delayed ACK), one thread per connection. With
certificates it serves HTTPS and, given a CA, requires and verifies the client certificate
(mutual TLS: kube-scheduler's ``tlsConfig`` certFile/keyFile/caFile).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from json.encoder import encode_basestring_ascii as _enc
from operator import getitem
from pathlib import Path
from typing import Any

from fedsched.agent.cluster.cache import created_time, pod_ref
from fedsched.agent.cluster.k8s_objects import ObjectError, node_from_json, node_table
from fedsched.agent.serving.decider import MAX_EXTENDER_SCORE, Decider
from fedsched.common.model.cluster import Pod

log = logging.getLogger("fedsched.serve")

MAX_BODY = 32 * 1024 * 1024


class _Raw(bytes):
    """A response body that is already JSON."""


class BadRequest(ValueError):
    """A request the extender cannot answer (a 400 with this message)."""


def _names_and_nodes(body: dict) -> tuple[list[str], list[dict] | None]:
    names = body.get("NodeNames")
    nodes = body.get("Nodes")
    if nodes is not None:
        if not isinstance(nodes, dict) or not isinstance(nodes.get("items", []), list):
            raise BadRequest("Nodes must be a NodeList object with an items list")
        items = nodes.get("items") or []
        out = []
        for k, item in enumerate(items):
            meta = item.get("metadata") if isinstance(item, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest(f"Nodes.items[{k}] has no metadata.name")
            out.append(name)
        return out, items
    if names is None:
        return [], None
    if not isinstance(names, list) or not set(map(type, names)) <= {str}:
        raise BadRequest("NodeNames must be a list of strings")
    return list(names), None


def _meta_victims(node: str, victims: Any) -> dict:
    """One node's entry of NodeNameToVictims (full pods) as a MetaVictims entry (UIDs)."""
    pods = victims.get("Pods") if isinstance(victims, dict) else None
    if not isinstance(victims, dict) or not isinstance(pods or [], list):
        raise BadRequest(f"NodeNameToVictims[{node}] must be an object with a Pods list")
    uids = []
    for k, p in enumerate(pods or []):
        meta = p.get("metadata") if isinstance(p, dict) else None
        if not isinstance(p, dict) or not isinstance(meta or {}, dict):
            raise BadRequest(f"NodeNameToVictims[{node}].Pods[{k}] is not a Pod object")
        uids.append({"UID": (meta or {}).get("uid", "")})
    return {"Pods": uids, "NumPDBViolations": victims.get("NumPDBViolations", 0)}


def _pod(body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    pod = body.get("Pod")
    if not isinstance(pod, dict) or not pod:
        raise BadRequest("Pod is missing or not an object")
    return pod


class _HostEntries(dict):
    """node name -> its encoded answer entry for every score 0..MAX_EXTENDER_SCORE
    (``{"Host":"n1","Score":7}``), made on first use."""

    def __missing__(self, host: str) -> tuple[str, ...]:
        head = '{"Host":' + _enc(host) + ',"Score":'
        e = self[host] = tuple(f"{head}{s}}}" for s in range(MAX_EXTENDER_SCORE + 1))
        return e


class ExtenderServer:
    """Routes requests to a :class:`Decider`; wraps an HTTP server (see the module doc)."""

    def __init__(
        self,
        decider: Decider,
        host: str = "127.0.0.1",
        port: int = 8888,
        prefix: str = "/scheduler",
        tls: ssl.SSLContext | None = None,
        allow_bind: bool = False,
    ) -> None:
        self.decider = decider
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.allow_bind = allow_bind
        self.tls = tls
        self.started = time.time()
        handler = _make_handler(self)
        self.httpd = _Server((host, port), handler)
        if tls is not None:
            # The handshake runs in the connection's thread (Handler.setup), not in accept().
            self.httpd.socket = tls.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self.httpd.server_address[1]
        self.host = host
        self._thread: threading.Thread | None = None
        self._host_entries = _HostEntries()  # node name -> '{"Host":"name","Score":S}' for each S
        self.bind_log: deque[tuple[str, str]] = deque(maxlen=10_000)  # (pod uid, node), newest binds

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}{self.prefix}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="fedsched-extender", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ---- verbs ------------------------------------------------------------------------------
    def filter(self, body: Any) -> dict:
        pod = _pod(body)
        names, items = _names_and_nodes(body)
        if items is not None:
            self._learn(items)
        try:
            ans = self.decider.filter(pod, names)
        except ObjectError as e:
            raise BadRequest(f"Pod: {e}") from e
        if items is not None:
            keep = set(ans.passed)
            return {
                "Nodes": {"metadata": {}, "items": [n for n in items if n["metadata"]["name"] in keep]},
                "NodeNames": None,
                "FailedNodes": ans.failed,
                "FailedAndUnresolvableNodes": ans.unresolvable,
                "Error": "",
            }
        return {
            "Nodes": None,
            "NodeNames": ans.passed,
            "FailedNodes": ans.failed,
            "FailedAndUnresolvableNodes": ans.unresolvable,
            "Error": "",
        }

    def prioritize(self, body: Any, t0: float) -> bytes:
        pod = _pod(body)
        names, items = _names_and_nodes(body)
        if len(set(names)) != len(names):
            raise BadRequest("a node is named twice in the request")
        if items is not None:
            self._learn(items)
        try:
            d = self.decider.prioritize(pod, names, t0)
        except ObjectError as e:
            raise BadRequest(f"Pod: {e}") from e
        return _Raw(self.encode_priorities(d.hosts, d.scores))

    def encode_priorities(self, hosts: list[str], scores: list[int]) -> bytes:
        """The prioritize answer ``[{"Host": h, "Score": s}, ...]`` as JSON bytes; ``scores`` are
        ints in 0..10 (``to_extender_scores``). Encoded by hand with C-level loops from entries
        kept per node and score (json.dumps of 500 small dicts costs more than the policy's
        forward pass; joining a cached head and tail per host three times this)."""
        entries = self._host_entries
        if len(entries) > 4 * len(self.decider.cache.index) + 10_000:
            entries.clear()  # names the cache does not know (bounded)
        return ("[" + ",".join(map(getitem, map(entries.__getitem__, hosts), scores)) + "]").encode()

    def bind(self, body: Any) -> dict:
        if not self.allow_bind:
            return {"Error": "fedsched: the bind verb is served in the local (--cluster-csv) mode only"}
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        for k in ("PodName", "PodNamespace", "PodUID", "Node"):
            if not isinstance(body.get(k), str):
                raise BadRequest(f"{k} is missing or not a string")
        raw = self._pending.pop(body["PodUID"], None)
        if raw is None:
            return {"Error": f"fedsched: pod {body['PodUID']} was not seen in filter or prioritize"}
        pod_obj = json.loads(raw)
        cache = self.decider.cache
        try:
            pod = cache.pod(pod_obj)  # with its application code (per-app observed use)
            gpus = self._select_gpus(pod, body["Node"])
            cache.bind(body["PodUID"], pod, body["Node"], gpus, created=created_time(pod_obj),
                       ref=pod_ref(pod_obj))
        except KeyError:
            return {"Error": f"fedsched: unknown node {body['Node']}"}
        except (ValueError, ObjectError) as e:
            return {"Error": f"fedsched: {e}"}
        self.bind_log.append((body["PodUID"], body["Node"]))
        return {"Error": ""}

    def _select_gpus(self, pod: Pod, node: str) -> tuple[int, ...]:
        """The GPUs the policy's own rule picks (as the simulator's place() does)."""
        cache = self.decider.cache
        with cache.lock:
            i = cache.index[node]
            if not cache.state.feasible(pod)[i]:
                raise ValueError(f"pod does not fit on {node}")
            return self.decider.models.current.scheduler.select_gpus(cache.state, pod, i)

    @staticmethod
    def preempt(body: Any) -> dict:
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        meta = body.get("NodeNameToMetaVictims")
        if meta is None and body.get("NodeNameToVictims") is not None:
            full = body["NodeNameToVictims"]
            if not isinstance(full, dict):
                raise BadRequest("NodeNameToVictims must be an object")
            meta = {node: _meta_victims(node, v) for node, v in full.items()}
        if meta is not None and not isinstance(meta, dict):
            raise BadRequest("NodeNameToMetaVictims must be an object")
        return {"NodeNameToMetaVictims": meta or {}}

    def _learn(self, items: list[dict]) -> None:
        cache = self.decider.cache
        for item in items:
            name = item["metadata"]["name"]
            if name not in cache.index:
                try:
                    # node_table raises for what the cluster model cannot hold (more than
                    # MAX_GPUS_PER_NODE GPUs, capacities past int64), which would otherwise
                    # fail the cache's rebuild after it had changed its node list.
                    node_table([node_from_json(item)])
                except (ValueError, OverflowError) as e:  # ObjectError is a ValueError
                    raise BadRequest(f"Nodes: {e}") from e
                cache.upsert_node(item)

    _pending: dict[str, bytes]

    def remember(self, pod: dict) -> None:
        """Keep the pod JSON until its bind (local mode only: without the bind verb nothing
        would ever take it out again), bounded."""
        meta = pod.get("metadata")
        if not self.allow_bind or not isinstance(meta, dict):
            return
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        # As bytes: a hundred thousand parsed pods are millions of objects for the garbage
        # collector to walk on every full pass (multi-millisecond pauses).
        self._pending[uid] = json.dumps(pod, separators=(",", ":")).encode()
        if len(self._pending) > 100_000:
            self._pending.pop(next(iter(self._pending)))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address) -> None:
        log.debug("connection error from %s", client_address, exc_info=True)


def _make_handler(server: ExtenderServer) -> type[BaseHTTPRequestHandler]:
    server._pending = {}
    decider = server.decider
    metrics = decider.metrics
    prefix = server.prefix

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        server_version = "fedsched-extender"

        def setup(self) -> None:
            if isinstance(self.request, ssl.SSLSocket):
                self.request.settimeout(10)
                self.request.do_handshake()
                self.request.settimeout(None)
            super().setup()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, code: int, payload: Any, ctype: str = "application/json") -> None:
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if self.request_version != "HTTP/0.9":  # headers and body in one write (one segment)
                self._headers_buffer.extend((b"\r\n", body))
                self.flush_headers()
            else:
                self.wfile.write(body)

        def __getattr__(self, name: str) -> Any:
            # Every method but GET and POST gets a 405 (the stdlib answers 501 Not Implemented).
            if name.startswith("do_"):
                return self._not_allowed
            raise AttributeError(name)

        def _not_allowed(self) -> None:
            self._drain_quietly()
            body = json.dumps({"Error": f"method {self.command} not allowed (GET or POST)"}).encode()
            self.send_response(405)
            self.send_header("Allow", "GET, POST")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            metrics.requests.labels(verb="unknown", code="405").inc()

        def do_GET(self) -> None:
            self._drain_quietly()  # a body left unread would be taken for the next request
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                c = decider.cache
                metrics.cache_nodes.set(len(c.index))
                metrics.cache_pods.set(len(c.pods))
                self._send(200, metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif path == "/readyz":
                ok, msg = decider.ready()
                self._send(200 if ok else 503, (msg + "\n").encode(), "text/plain")
            elif path == "/openapi.json":
                self._send(200, openapi(prefix))
            else:
                self._send(404, {"Error": f"no such path {path}"})

        def do_POST(self) -> None:
            t0 = time.perf_counter()
            path = self.path.split("?", 1)[0]
            verb = path[len(prefix) + 1 :] if path.startswith(prefix + "/") else ""
            if verb == "reload":
                verb = ""  # only /admin/reload reloads
            if path == "/admin/reload":
                verb = "reload"
            if verb not in ("filter", "prioritize", "bind", "preempt", "reload"):
                self._drain_quietly()
                self._send(
                    404,
                    {
                        "Error": f"no such verb: POST {path} (expected {prefix}/filter, "
                        f"{prefix}/prioritize, {prefix}/bind or {prefix}/preempt)"
                    },
                )
                metrics.requests.labels(verb="unknown", code="404").inc()
                return
            code, out = 200, None
            try:
                body = self._body()
                if verb == "filter":
                    out = server.filter(body)
                    server.remember(body["Pod"])
                elif verb == "prioritize":
                    out = server.prioritize(body, t0)
                    server.remember(body["Pod"])
                elif verb == "bind":
                    out = server.bind(body)
                elif verb == "preempt":
                    out = server.preempt(body)
                else:
                    path_arg = body.get("path") if isinstance(body, dict) else None
                    changed, msg = decider.models.reload(path_arg)
                    out = {"changed": changed, "message": msg, "model_version": decider.models.version}
            except BadRequest as e:
                code, out = 400, {"Error": f"fedsched: bad {verb} request: {e}"}
            except Exception as e:  # never a 5xx: a neutral answer, counted
                log.exception("internal error in %s", verb)
                metrics.fallbacks.labels(reason="internal", model_version=decider.models.version).inc()
                out = self._neutral(verb, e)
            self._send(code, out)
            metrics.requests.labels(verb=verb, code=str(code)).inc()
            metrics.latency.labels(verb=verb, model_version=decider.models.version).observe(
                time.perf_counter() - t0
            )

        def _neutral(self, verb: str, e: Exception) -> Any:
            body = getattr(self, "_last_body", None)
            names: list[str] = []
            if isinstance(body, dict):
                try:
                    names, _ = _names_and_nodes(body)
                except Exception:  # the neutral answer must not fail in turn (no answer at all)
                    names = []
            if verb == "prioritize":
                return [{"Host": n, "Score": 0} for n in names]
            if verb == "filter":
                return {
                    "Nodes": body.get("Nodes") if isinstance(body, dict) else None,
                    "NodeNames": names if isinstance(body, dict) and body.get("Nodes") is None else None,
                    "FailedNodes": {},
                    "FailedAndUnresolvableNodes": {},
                    "Error": f"fedsched: internal error ({type(e).__name__})",
                }
            return {"Error": f"fedsched: internal error ({type(e).__name__})"}

        def _drain_quietly(self) -> None:
            """Read and drop the body; a bad Content-Length closes the connection after the answer."""
            try:
                n = self._length(allow_missing=True)
            except BadRequest:
                return
            if n:
                self.rfile.read(n)

        def _length(self, allow_missing: bool = False) -> int:
            raw = self.headers.get("Content-Length")
            if raw is None:
                if allow_missing:
                    return 0
                self.close_connection = True
                raise BadRequest("Content-Length is required")
            try:
                n = int(raw)
            except ValueError:
                self.close_connection = True
                raise BadRequest(f"bad Content-Length {raw!r}") from None
            if n < 0 or n > MAX_BODY:
                self.close_connection = True
                raise BadRequest(f"body of {n} bytes (limit {MAX_BODY})")
            return n

        def _body(self) -> Any:
            self._last_body = None
            n = self._length()
            raw = self.rfile.read(n)
            try:
                body = json.loads(raw, parse_constant=reject_constant)
            except (ValueError, UnicodeDecodeError, RecursionError) as e:
                raise BadRequest(f"body is not valid JSON ({e})") from None
            self._last_body = body
            return body

    return Handler


def reject_constant(name: str) -> float:
    """``json.loads(..., parse_constant=)``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON")


# ---- TLS ----------------------------------------------------------------------------------------


def server_tls(cert: str | Path, key: str | Path, client_ca: str | Path | None) -> ssl.SSLContext:
    """HTTPS; with ``client_ca`` the client must present a certificate signed by it (mTLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        ctx.load_verify_locations(str(client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


# ---- OpenAPI ------------------------------------------------------------------------------------


def openapi(prefix: str = "/scheduler") -> dict:
    """The verbs' request/response schema (OpenAPI 3.0), for clients and fuzzers."""
    obj = {"type": "object"}
    names = {"type": "array", "items": {"type": "string"}, "nullable": True}
    node_list = {"type": "object", "nullable": True, "properties": {"items": {"type": "array", "items": obj}}}
    args = {
        "type": "object",
        "required": ["Pod"],
        "properties": {"Pod": obj, "Nodes": node_list, "NodeNames": names},
    }
    reasons = {"type": "object", "additionalProperties": {"type": "string"}}
    filter_result = {
        "type": "object",
        "properties": {
            "Nodes": node_list,
            "NodeNames": names,
            "FailedNodes": reasons,
            "FailedAndUnresolvableNodes": reasons,
            "Error": {"type": "string"},
        },
    }
    host_priority = {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["Host", "Score"],
            "properties": {
                "Host": {"type": "string"},
                "Score": {"type": "integer", "minimum": 0, "maximum": 10},
            },
        },
    }
    error = {"type": "object", "properties": {"Error": {"type": "string"}}}
    bind_args = {
        "type": "object",
        "required": ["PodName", "PodNamespace", "PodUID", "Node"],
        "properties": {k: {"type": "string"} for k in ("PodName", "PodNamespace", "PodUID", "Node")},
    }

    def op(req: dict, resp: dict) -> dict:
        return {
            "post": {
                "requestBody": {"required": True, "content": {"application/json": {"schema": req}}},
                "responses": {
                    "200": {"description": "answer", "content": {"application/json": {"schema": resp}}},
                    "400": {"description": "bad request", "content": {"application/json": {"schema": error}}},
                },
            }
        }

    return {
        "openapi": "3.0.3",
        "info": {"title": "fedsched scheduler extender", "version": "1"},
        "paths": {
            f"{prefix}/filter": op(args, filter_result),
            f"{prefix}/prioritize": op(args, host_priority),
            f"{prefix}/bind": op(bind_args, error),
            f"{prefix}/preempt": op({"type": "object"}, {"type": "object"}),
        },
    }
