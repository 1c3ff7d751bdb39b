"""A small real HTTP server that speaks the Kubernetes API wire format for Nodes and Pods.

kube-apiserver cannot be installed here, so the watch tests point the official ``kubernetes``
client at this server instead. It implements the part of the API that a list + watch client
uses, as the API server does it:

- ``GET /api/v1/nodes``, ``/api/v1/pods`` and ``/api/v1/namespaces/{ns}/pods``: a ``NodeList`` /
  ``PodList`` with ``metadata.resourceVersion``, items without kind/apiVersion, paged with
  ``limit`` / ``continue`` (a consistent snapshot, ``remainingItemCount`` set);
- the same paths with ``watch=true`` (or ``1``): HTTP/1.1 chunked newline-delimited JSON events
  ``{"type": ..., "object": {...}}`` starting after ``resourceVersion`` (history replay), with
  ``kind``/``apiVersion`` on each object; the stream ends cleanly (terminating chunk) after
  ``timeoutSeconds``; a ``resourceVersion`` older than the compaction point gets an ERROR event
  carrying a 410 ``Expired`` Status, as the API server sends it;
- every mutation bumps one global resourceVersion and sets ``metadata.resourceVersion``.

Test controls: :meth:`KubeAPIStub.add` / :meth:`update` / :meth:`delete` (events to every
matching watch), ``notify=False`` (the state changes but no event is sent: a lost event),
:meth:`expire` (compact the history and send a 410 ERROR to open watches), :meth:`send_error`
(any ERROR Status), :meth:`bookmark`, :meth:`drop` (close open watch connections abruptly,
without the terminating chunk). :attr:`KubeAPIStub.requests` logs (path, query) of every request.
"""

from __future__ import annotations

import copy
import itertools
import json
import queue
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

KIND_OF = {"nodes": "Node", "pods": "Pod"}


def _key(kind: str, obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return str(meta["name"]) if kind == "nodes" else f"{meta.get('namespace', 'default')}/{meta['name']}"


def _namespace(obj: dict) -> str | None:
    return (obj.get("metadata") or {}).get("namespace")


def status_object(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


@dataclass
class _Watch:
    kind: str
    namespace: str | None
    commands: queue.Queue[tuple[str, Any]] = field(default_factory=queue.Queue)


class KubeAPIStub:
    """State, history and open watches of the test API server (see the module docstring)."""

    def __init__(self, nodes: list[dict] | None = None, pods: list[dict] | None = None,
                 first_resource_version: int = 1000) -> None:
        self._lock = threading.Lock()
        self._rv = first_resource_version
        self._objects: dict[str, dict[str, dict]] = {"nodes": {}, "pods": {}}
        self._history: dict[str, list[tuple[int, str, dict]]] = {"nodes": [], "pods": []}
        self._watches: list[_Watch] = []
        self._snapshots: dict[str, tuple[int, list[dict]]] = {}
        self._snapshot_ids = itertools.count(1)
        self.requests: list[tuple[str, dict[str, str]]] = []
        for kind, objs in (("nodes", nodes or []), ("pods", pods or [])):
            for obj in objs:
                self._store(kind, obj)
        self._compacted = {"nodes": self._rv, "pods": self._rv}
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- server ---------------------------------------------------------------------------
    def start(self) -> KubeAPIStub:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads = True
        httpd.api = self  # type: ignore[attr-defined]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kube-api-stub", daemon=True)
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        with self._lock:
            watches = list(self._watches)
        for w in watches:
            w.commands.put(("close", None))
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> KubeAPIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- state -----------------------------------------------------------------------------
    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    def objects(self, kind: str) -> list[dict]:
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects[kind].values()]

    def _store(self, kind: str, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        if kind == "pods":
            meta.setdefault("namespace", "default")
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._objects[kind][_key(kind, obj)] = obj
        return obj

    def _emit(self, kind: str, etype: str, obj: dict, notify: bool) -> None:
        if not notify:
            return
        self._history[kind].append((self._rv, etype, obj))
        event = {"type": etype, "object": _wire(kind, obj)}
        for w in self._watches:
            if w.kind == kind and (w.namespace is None or w.namespace == _namespace(obj)):
                w.commands.put(("event", event))

    def add(self, kind: str, obj: dict, notify: bool = True) -> str:
        """Create an object (ADDED); returns its resourceVersion."""
        with self._lock:
            if _key(kind, obj) in self._objects[kind]:
                raise KeyError(f"{kind} {_key(kind, obj)} exists")
            stored = self._store(kind, obj)
            self._emit(kind, "ADDED", stored, notify)
            return str(self._rv)

    def update(self, kind: str, obj: dict, notify: bool = True) -> str:
        """Replace an existing object (MODIFIED); uid and creationTimestamp are kept."""
        with self._lock:
            old = self._objects[kind][_key(kind, obj)]
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            stored = self._store(kind, obj)
            self._emit(kind, "MODIFIED", stored, notify)
            return str(self._rv)

    def delete(self, kind: str, key: str, notify: bool = True) -> str:
        """Delete by name (nodes) or ``namespace/name`` (pods) (DELETED, last state of the object)."""
        with self._lock:
            obj = self._objects[kind].pop(key)
            self._rv += 1
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._emit(kind, "DELETED", obj, notify)
            return str(self._rv)

    # ---- failures and bookmarks --------------------------------------------------------------
    def expire(self, kind: str) -> None:
        """Compact ``kind``'s history (older resourceVersions now get 410) and send open watches an
        ERROR 410 Expired event, as the API server does when a watch falls out of its window."""
        with self._lock:
            self._compacted[kind] = self._rv
            self._history[kind] = []
            for w in self._watches:
                if w.kind == kind:
                    w.commands.put(("error", status_object(
                        410, "Expired", f"too old resource version: {self._rv - 1} ({self._rv})")))

    def send_error(self, kind: str, code: int, reason: str, message: str) -> None:
        with self._lock:
            for w in self._watches:
                if w.kind == kind:
                    w.commands.put(("error", status_object(code, reason, message)))

    def bookmark(self, kind: str) -> str:
        with self._lock:
            rv = str(self._rv)
            event = {"type": "BOOKMARK", "object": {"kind": KIND_OF[kind], "apiVersion": "v1",
                                                    "metadata": {"resourceVersion": rv}}}
            for w in self._watches:
                if w.kind == kind:
                    w.commands.put(("event", event))
            return rv

    def drop(self, kind: str) -> int:
        """Close every open ``kind`` watch connection abruptly; returns how many."""
        with self._lock:
            n = 0
            for w in self._watches:
                if w.kind == kind:
                    w.commands.put(("drop", None))
                    n += 1
            return n

    def open_watches(self, kind: str) -> int:
        with self._lock:
            return sum(1 for w in self._watches if w.kind == kind)

    def wait_watching(self, kind: str, n: int = 1, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.open_watches(kind) >= n:
                return True
            time.sleep(0.01)
        return False

    def calls(self, kind: str, watch: bool) -> list[dict[str, str]]:
        """The queries of the list (``watch=False``) or watch requests made for ``kind``."""
        out = []
        for path, q in list(self.requests):
            if path.endswith("/" + kind) and (q.get("watch") in ("true", "1")) == watch:
                out.append(q)
        return out

    # ---- request handling (called by the handler threads) ---------------------------------------
    def _list(self, kind: str, namespace: str | None, q: dict[str, str]) -> tuple[int, dict]:
        with self._lock:
            token = q.get("continue")
            if token:
                if token not in self._snapshots:
                    return 410, status_object(410, "Expired", "The provided continue parameter is too old")
                rv, items = self._snapshots[token]
                start = int(token.rsplit(":", 1)[1])
            else:
                rv = self._rv
                items = [copy.deepcopy(o) for o in self._objects[kind].values()
                         if namespace is None or _namespace(o) == namespace]
                start = 0
            limit = int(q.get("limit") or 0)
            end = len(items) if limit <= 0 else min(len(items), start + limit)
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if end < len(items):
                nxt = f"{next(self._snapshot_ids)}:{end}"
                self._snapshots[nxt] = (rv, items)
                meta["continue"] = nxt
                meta["remainingItemCount"] = len(items) - end
            return 200, {"kind": KIND_OF[kind] + "List", "apiVersion": "v1", "metadata": meta,
                         "items": items[start:end]}

    def _open_watch(self, kind: str, namespace: str | None, rv_param: str) -> tuple[_Watch, list[dict]]:
        """Register a watch; returns it and the events to replay first (or an ERROR)."""
        with self._lock:
            w = _Watch(kind, namespace)
            self._watches.append(w)

            def match(o: dict) -> bool:
                return namespace is None or _namespace(o) == namespace

            if rv_param in ("", "0"):
                return w, [{"type": "ADDED", "object": _wire(kind, o)}
                           for o in self._objects[kind].values() if match(o)]
            rv = int(rv_param)
            if rv < self._compacted[kind]:
                return w, [{"type": "ERROR", "object": status_object(
                    410, "Expired", f"too old resource version: {rv} ({self._compacted[kind]})")}]
            return w, [{"type": t, "object": _wire(kind, o)} for r, t, o in self._history[kind]
                       if r > rv and match(o)]

    def _close_watch(self, w: _Watch) -> None:
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)


def _wire(kind: str, obj: dict) -> dict:
    """An object as a watch event carries it: with kind and apiVersion."""
    return {"kind": KIND_OF[kind], "apiVersion": "v1", **copy.deepcopy(obj)}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kube-api-stub/1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    @property
    def api(self) -> KubeAPIStub:
        return self.server.api  # type: ignore[attr-defined, no-any-return]

    def _route(self, path: str) -> tuple[str, str | None] | None:
        parts = [p for p in path.split("/") if p]
        if parts[:2] != ["api", "v1"]:
            return None
        rest = parts[2:]
        if rest in (["nodes"], ["pods"]):
            return rest[0], None
        if len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "pods":
            return "pods", rest[1]
        return None

    def _send_json(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self.api.requests.append((url.path, q))
        route = self._route(url.path)
        if route is None:
            self._send_json(404, status_object(404, "NotFound", f"the server could not find {url.path}"))
            return
        kind, namespace = route
        if q.get("watch") in ("true", "1"):
            self._watch(kind, namespace, q)
        else:
            self._send_json(*self.api._list(kind, namespace, q))

    def _chunk(self, event: dict) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, kind: str, namespace: str | None, q: dict[str, str]) -> None:
        timeout = float(q.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        w, first = self.api._open_watch(kind, namespace, q.get("resourceVersion", ""))
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            for event in first:
                self._chunk(event)
                if event["type"] == "ERROR":
                    self._end()
                    return
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._end()
                    return
                try:
                    cmd, arg = w.commands.get(timeout=min(remaining, 0.05))
                except queue.Empty:
                    if self._client_gone():  # as the API server does: a closed client ends the watch
                        self.close_connection = True
                        return
                    continue
                if cmd == "event":
                    self._chunk(arg)
                elif cmd == "error":
                    self._chunk({"type": "ERROR", "object": arg})
                    self._end()
                    return
                elif cmd == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                else:  # close
                    self._end()
                    return
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            self.api._close_watch(w)

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True
