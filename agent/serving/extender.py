"""The kube-scheduler extender: HTTP(S) filter / prioritize / bind / preempt verbs.

The wire format is k8s.io/kube-scheduler/extender/v1 (its structs have no json tags): POST
``{prefix}/{verb}`` with a JSON body whose keys are Go field names (``Pod``, ``Nodes``,
``NodeNames``); with ``nodeCacheCapable: true`` the scheduler sends ``NodeNames`` only and the
agent answers from its own cache; with full ``Nodes`` the agent learns nodes it does not know
from the request and answers ``Nodes`` back. Filter returns ``{"Nodes", "NodeNames",
"FailedNodes", "FailedAndUnresolvableNodes", "Error"}``; prioritize returns a bare
``[{"Host", "Score"}]`` with every candidate exactly once, scores 0..10; bind (local mode
only: binds into the simulated cluster) returns ``{"Error"}``; preempt has no objection and
returns the victims it was given as ``NodeNameToMetaVictims``.

Errors: a body that is not a valid request gets a 400 with ``{"Error": "..."}`` naming what
is wrong, one over the size limit a 413; an unknown path a 404; the only 5xx is a 503 for a
request the server has no room for (connections or large bodies, below): an internal failure
answers a neutral result (filter: every node passes with ``Error`` set, which an
``ignorable`` extender skips; prioritize: zero scores) and is counted.

Also served: ``GET /metrics`` (Prometheus), ``/healthz`` (the process answers), ``/readyz``
(200 once the cache is synced and a model is loaded), ``/openapi.json`` (the verbs' schema),
``POST /admin/reload`` (reload the policy file; optional JSON ``{"path": "..."}``; a body of the
wrong shape gets a 400, a file that cannot be served a 422, and the old model stays).

Admin verbs (``/admin/...``) answer an authenticated caller only, anyone else a 403: over mutual
TLS a client certificate with a name (its subject CN or a DNS SAN) in ``admin_clients`` (the CA
also signs kube-scheduler's and other clients' certificates, which must not reload the model);
over plain HTTP (local mode) a loopback caller. ``/admin/reload`` loads only files in the policy
directory and the shipped policy names (:meth:`ModelStore.admin_path`); every other path gets one
403 whose text does not depend on the path, so it tells nobody which files exist.

Transport: HTTP/1.1 keep-alive (kube-scheduler reuses connections) with Nagle's algorithm
off (otherwise every response waits ~40 ms for a delayed ACK), one thread per connection
(``socketserver.ThreadingTCPServer``). With certificates it serves HTTPS and, given a CA,
requires and verifies the client certificate (mutual TLS: kube-scheduler's ``tlsConfig``
certFile/keyFile/caFile); the handshake runs in the connection's thread.

Connections are bounded (:class:`ConnectionLimits`): at most ``max_connections`` open (so at most
as many threads); one more closes the oldest idle one (or, with none idle, one whose request head
is still coming) and, with every connection working on a request, gets a 503 and is closed. A
watchdog thread closes (``shutdown``) a connection idle past ``idle_timeout_s``, one whose TLS
handshake, request line and headers take longer than ``header_timeout_s`` from their first byte
(a deadline, not a per-read timeout: a byte a second does not extend it), and one whose body, or
whose answer, takes longer than ``body_timeout_s`` to pass. The counts are in ``/metrics``
(``fedsched_connections_*``).

Memory is bounded by bytes, not only by count: a body longer than ``max_body_bytes`` (2 MiB by
default: a Pod object is at most 1.5 MiB in etcd, and kube-scheduler's ``nodeCacheCapable``
requests add only the candidates' names, a few hundred) gets a 413 and the connection closes
unread. Bodies of more than 64 KiB are read and worked on only while the bytes of all such bodies
in flight stay within ``body_budget_bytes`` (by default ``max_body_bytes``: a JSON body parses into
up to ~40 times its size in Python objects, so the budget, not the connection count, bounds that);
one that finds no room within a second gets a 503 and the connection closes unread
(``fedsched_request_bodies_refused_total``). Parsing such a body holds the interpreter's lock for
tens of ms (a 2 MiB body of empty objects: ~35 ms, and ~12 ms to free), so when another request is
in progress, a large body's share of the budget is held, idle, as long again as its parsing and
answer took (at most a second): large bodies sent without pause then take about half of the
interpreter, not all of it, from the requests beside them. A node name longer than a Kubernetes
name may be (253 characters) is a 400, and the prioritize answer's per-node entries are kept for
the nodes the cache knows only. Nodes learned from full ``Nodes`` requests are bounded by count
(``ClusterCache.max_learned_nodes``, ``fedsched serve --max-learned-nodes``: the least recently
named are forgotten, ``fedsched_learned_nodes_dropped_total``); the watch's nodes never are. In
local mode a pod is kept for its bind as the few fields the bind reads (its name, uid, owner,
creation time, resources and the GPU and QoS annotations), at most 64 KiB of them a pod and
64 MiB in all, the oldest dropped first.

The HTTP/1.1 layer is this module's own (:class:`_Connection`), because the stdlib's
``BaseHTTPRequestHandler`` cost about 100 us of every request's round trip, more than the
loopback network: it parses each request's headers with the ``email`` package, and formats,
encodes and logs each response header (and the Date) by a call of its own. Here the request
line and the header lines are read from a 64 KiB buffer (one read takes a whole 500-candidate
request) and split by hand, strictly: the stdlib's limits (65,536 bytes a line: 414/431, 100
headers: 431), no obs-fold or space before the colon, ``Content-Length`` of digits only, given
twice only with one value, no ``Transfer-Encoding`` (kube-scheduler never chunks: a 400); each
gets a JSON 4xx after which the connection closes, as one whose framing cannot be trusted (the
stdlib answered HTTP/2 with a 505, and a bare request line it could not read with an HTML page).
HTTP/1.0 (keep-alive only when asked), ``Connection: close``, ``Expect: 100-continue`` and a bare
``GET /path`` (HTTP/0.9: the body alone) are read as the stdlib read them, ``//path`` too. The
answer (status line, Server, Date formatted once a second, Content-Type, Content-Length, body)
is one write.

JSON: orjson (C) reads the bodies, strictly (no NaN/Infinity, valid UTF-8, at most 1024 levels;
integers past 64 bits read as floats), about twice as fast as the stdlib on a 500-candidate
request; what it refuses is read again by the stdlib's strict decoder, so what was accepted
before still is (a BOM, UTF-16, lone surrogates) and the 400 names the stdlib's reason. Answers
are written by orjson (compact UTF-8; a 500-name filter answer in 2 us against 27), falling back
to the stdlib's encoder for what only it can write (integers past 64 bits, more than 254 levels,
lone surrogates); the prioritize answer is joined from per-node entries made once
(:meth:`ExtenderServer.encode_priorities`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import math
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from json.encoder import encode_basestring_ascii as _enc
from operator import getitem
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fedsched.agent.cluster.apps import TEMPLATE_HASH_LABEL
from fedsched.agent.cluster.cache import created_time, pod_ref
from fedsched.agent.cluster.k8s_objects import (
    GPU_COUNT_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    QOS_ANNOTATION,
    NodeInfo,
    ObjectError,
    node_from_json,
    node_table,
)
from fedsched.agent.serving.decider import MAX_EXTENDER_SCORE, Decider
from fedsched.agent.serving.model_store import PathNotAllowed
from fedsched.common.learning.checkpoint import CheckpointError
from fedsched.common.model.cluster import Pod

log = logging.getLogger("fedsched.serve")

MAX_NODE_NAME = 253  # a Kubernetes object name (a DNS subdomain) is at most this long
SMALL_BODY = 64 * 1024  # bodies up to this size are outside the in-flight body budget
BODY_BUDGET_WAIT_S = 1.0  # the longest a larger body waits for room in the budget (then a 503)
MAX_PENDING_POD = 64 * 1024  # local mode: the most bytes kept of one pod for its bind
MAX_PENDING_BYTES = 64 * 1024 * 1024  # ... and of all pods waiting for their bind
MAX_PENDING_PODS = 100_000
_BIND_ANNOTATIONS = (GPU_MILLI_ANNOTATION, GPU_COUNT_ANNOTATION, GPU_MODEL_ANNOTATION, QOS_ANNOTATION)


class _Raw(bytes):
    """A response body that is already JSON."""


class BadRequest(ValueError):
    """A request the extender cannot answer (a 400, or ``status``, with this message)."""

    status = 400


class BodyTooLarge(BadRequest):
    """A body longer than ``ConnectionLimits.max_body_bytes`` (a 413)."""

    status = 413


class BodyBudgetFull(BadRequest):
    """No room in the in-flight body budget within ``BODY_BUDGET_WAIT_S`` (a 503)."""

    status = 503


def _check_names(names: list[str]) -> None:
    if names and max(map(len, names)) > MAX_NODE_NAME:
        k = next(k for k, n in enumerate(names) if len(n) > MAX_NODE_NAME)
        raise BadRequest(f"node name {k} is {len(names[k])} characters long "
                         f"(a Kubernetes name has at most {MAX_NODE_NAME})")


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
        _check_names(out)
        return out, items
    if names is None:
        return [], None
    if not isinstance(names, list):
        raise BadRequest("NodeNames must be a list of strings")
    try:
        "".join(names)  # a TypeError unless every item is a str (in C: 4x a set of the types)
    except TypeError:
        raise BadRequest("NodeNames must be a list of strings") from None
    _check_names(names)
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
    (``{"Host":"n1","Score":7}``), made on first use and kept for the names in ``known()`` (the
    cache's nodes) only: the names a request makes up cost their bytes only while it is answered."""

    def __init__(self, known: Callable[[], Container[str]]) -> None:
        super().__init__()
        self.known = known

    def __missing__(self, host: str) -> tuple[str, ...]:
        head = '{"Host":' + _enc(host) + ',"Score":'
        e = tuple(f"{head}{s}}}" for s in range(MAX_EXTENDER_SCORE + 1))
        if host in self.known():
            self[host] = e
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
        admin_clients: Iterable[str] = (),
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.decider = decider
        self.admin_clients = frozenset(admin_clients)  # certificate names allowed /admin/* over TLS
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.allow_bind = allow_bind
        self.tls = tls
        self.started = time.time()
        handler = _make_handler(self)
        self.limits = limits or ConnectionLimits()
        self.httpd = _Server((host, port), handler, self.limits, decider.metrics)
        decider.metrics.connections_open.set_function(lambda: len(self.httpd.conns))
        decider.metrics.body_bytes_in_flight.set_function(lambda: self.httpd.bodies.used)
        decider.metrics.learned_nodes.set_function(lambda: len(self.decider.cache.learned))
        if tls is not None:
            # The handshake runs in the connection's thread (Handler.setup), not in accept().
            self.httpd.socket = tls.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self.httpd.server_address[1]
        self.host = host
        self._thread: threading.Thread | None = None
        # node name -> '{"Host":"name","Score":S}' for each S, for the names the cache knows
        self._host_entries = _HostEntries(lambda: self.decider.cache.index)
        self.bind_log: deque[tuple[str, str]] = deque(maxlen=10_000)  # (pod uid, node), newest binds
        # local mode: pod uid -> what its bind reads (_bind_view, as JSON), oldest first; b"" for a
        # pod whose view is over MAX_PENDING_POD
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}{self.prefix}"

    def start(self) -> None:
        self.httpd.start_watchdog()
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="fedsched-extender", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        self.httpd.start_watchdog()
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.stop_watchdog()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ---- verbs ------------------------------------------------------------------------------
    def filter(self, body: Any) -> dict:
        pod = _pod(body)
        names, items = _names_and_nodes(body)
        if items is not None:
            self._learn(items, names)
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
            self._learn(items, names)
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
        if len(entries) > 2 * len(self.decider.cache.index) + 1000:
            entries.clear()  # the nodes that left the cache
        return ("[" + ",".join(map(getitem, map(entries.__getitem__, hosts), scores)) + "]").encode()

    def bind(self, body: Any) -> dict:
        if not self.allow_bind:
            return {"Error": "fedsched: the bind verb is served in the local (--cluster-csv) mode only"}
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        for k in ("PodName", "PodNamespace", "PodUID", "Node"):
            if not isinstance(body.get(k), str):
                raise BadRequest(f"{k} is missing or not a string")
        with self._pending_lock:
            raw = self._pending.pop(body["PodUID"], None)
            self._pending_bytes -= len(raw or b"")
        if raw is None:
            return {"Error": f"fedsched: pod {body['PodUID']} was not seen in filter or prioritize"}
        if not raw:
            return {"Error": f"fedsched: pod {body['PodUID']} was not kept for its bind (its "
                             f"resources, owner and annotations take more than {MAX_PENDING_POD} bytes)"}
        pod_obj = decode_body(raw)  # what remember() encoded
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
            if not cache.state.feasible(pod, np.array([i]))[0]:
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

    def _learn(self, items: list[dict], names: list[str]) -> None:
        """Add the request's nodes the cache does not know, all in one rebuild of its tables (one
        rebuild per node made learning n new nodes cost n rebuilds of up to n nodes), at most
        ``cache.max_learned_nodes`` of them kept (``ClusterCache`` module doc: the least recently
        named are forgotten; counted in ``fedsched_learned_nodes_dropped_total``)."""
        cache = self.decider.cache
        new: dict[str, NodeInfo] = {}
        over: set[str] = set()  # new names past the limit: neither read nor learned
        for item in items:
            name = item["metadata"]["name"]
            if name in cache.index or name in new:
                continue
            if len(new) >= cache.max_learned_nodes:
                over.add(name)
                continue
            try:
                info = node_from_json(item)
                # node_table raises for what the cluster model cannot hold (more than
                # MAX_GPUS_PER_NODE GPUs, capacities past int64), which would otherwise
                # fail the cache's rebuild.
                node_table([info])
            except (ValueError, OverflowError) as e:  # ObjectError is a ValueError
                raise BadRequest(f"Nodes: {e}") from e
            new[name] = info
        evicted = refused = 0
        if new or cache.learned:  # the learned nodes named here count as named now
            try:
                evicted, refused = cache.add_nodes(list(new.values()), names)
            except (ValueError, OverflowError) as e:  # what the nodes together cannot be
                raise BadRequest(f"Nodes: {e}") from e
        dropped = self.decider.metrics.learned_nodes_dropped
        if evicted:
            dropped.labels(reason="evicted").inc(evicted)
        if over or refused:
            dropped.labels(reason="over_limit").inc(len(over) + refused)

    def remember(self, pod: dict) -> None:
        """Keep what the pod's bind reads until its bind (local mode only: without the bind verb
        nothing would ever take it out again), bounded by count and by bytes."""
        meta = pod.get("metadata")
        if not self.allow_bind or not isinstance(meta, dict):
            return
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        # As bytes: a hundred thousand parsed pods are millions of objects for the garbage
        # collector to walk on every full pass (multi-millisecond pauses).
        try:
            raw = dumps(_bind_view(pod))
        except BadRequest as e:  # nested deeper than the stdlib's encoder goes
            raise BadRequest(f"Pod {e}") from None
        if len(raw) > MAX_PENDING_POD:
            raw = b""
        with self._pending_lock:
            pending = self._pending
            self._pending_bytes += len(raw) - len(pending.get(uid, b""))
            pending[uid] = raw
            while len(pending) > MAX_PENDING_PODS or self._pending_bytes > MAX_PENDING_BYTES:
                self._pending_bytes -= len(pending.pop(next(iter(pending))))


def _bind_view(pod: dict) -> dict:
    """The fields of a Pod object that its bind reads (``ClusterCache.pod``: ``pod_from_json`` and
    ``owner_key``; ``created_time``, ``pod_ref``), the rest left out: an annotation or an
    environment of megabytes is not kept until the bind. A field of the wrong type is kept as it
    is, so that the bind's reader refuses it as it would have the whole pod."""
    meta = pod["metadata"]
    view_meta: dict[str, Any] = {k: meta[k] for k in ("uid", "name", "namespace", "creationTimestamp")
                                 if k in meta}
    refs = meta.get("ownerReferences")
    if isinstance(refs, list):
        ctrl = next((r for r in refs if isinstance(r, dict) and r.get("controller") is True), None)
        if ctrl is not None:
            view_meta["ownerReferences"] = [{"controller": True, "kind": ctrl.get("kind"),
                                             "name": ctrl.get("name")}]
    labels = meta.get("labels")
    if isinstance(labels, dict) and TEMPLATE_HASH_LABEL in labels:
        view_meta["labels"] = {TEMPLATE_HASH_LABEL: labels[TEMPLATE_HASH_LABEL]}
    ann = meta.get("annotations")
    if ann is not None:
        view_meta["annotations"] = ({k: ann[k] for k in _BIND_ANNOTATIONS if k in ann}
                                    if isinstance(ann, dict) else ann)
    view: dict[str, Any] = {"metadata": view_meta}
    spec = pod.get("spec")
    if isinstance(spec, dict):
        view_spec = {k: spec[k] for k in ("overhead",) if k in spec}
        for k in ("containers", "initContainers"):
            if k in spec:
                cs = spec[k]
                view_spec[k] = ([{"resources": c["resources"]} if isinstance(c, dict) and "resources" in c
                                 else {} if isinstance(c, dict) else c for c in cs]
                                if isinstance(cs, list) else cs)
        view["spec"] = view_spec
    elif spec is not None:
        view["spec"] = spec
    status = pod.get("status")
    if isinstance(status, dict):
        if "qosClass" in status:
            view["status"] = {"qosClass": status["qosClass"]}
    elif status is not None:
        view["status"] = status
    return view


def admin_caller_allowed(
    tls: bool, address: str, names: frozenset[str], admin_clients: frozenset[str]
) -> bool:
    """Whether a caller may use the admin verbs: over TLS one of its certificate's ``names`` is in
    ``admin_clients`` (the address does not count); over plain HTTP it calls from loopback (an
    IPv4-mapped IPv6 address counts as its IPv4 address; the names do not count)."""
    if tls:
        return not names.isdisjoint(admin_clients)
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:  # not an IP address (a Unix socket): not loopback as far as we know
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _certificate_names(cert: dict | None) -> frozenset[str]:
    """The subject CNs and DNS SANs of a peer certificate (``SSLSocket.getpeercert()``)."""
    if not cert:
        return frozenset()
    names = {v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"}
    names.update(v for k, v in cert.get("subjectAltName", ()) if k == "DNS")
    return frozenset(names)


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on the extender's connections and what they send (``fedsched serve
    --max-connections``, ``--idle-timeout``, ``--header-timeout``, ``--body-timeout``,
    ``--max-body``); see the module doc. ``body_budget_bytes`` (None: ``max_body_bytes``) bounds the
    bytes of the bodies over 64 KiB read and worked on at once."""

    max_connections: int = 128
    idle_timeout_s: float = 120.0  # longer than Go's IdleConnTimeout (90 s): the client closes first
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_body_bytes: int = 2 * 1024 * 1024
    body_budget_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_connections, int) or self.max_connections < 1:
            raise ValueError(f"max connections must be a positive integer, got {self.max_connections!r}")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ValueError(f"max body must be a positive number of bytes, got {self.max_body_bytes!r}")
        budget = self.body_budget_bytes
        if budget is None:
            object.__setattr__(self, "body_budget_bytes", self.max_body_bytes)
        elif not isinstance(budget, int) or budget < self.max_body_bytes:
            raise ValueError(f"body budget must be at least the max body ({self.max_body_bytes} "
                             f"bytes), got {budget!r}")
        for name in ("idle_timeout_s", "header_timeout_s", "body_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name.removesuffix('_s').replace('_', ' ')} must be a positive "
                                 f"number of seconds, got {v!r}")


# What a connection is doing; a watchdog closes it past its phase's deadline.
_IDLE, _HEAD, _BODY, _BUSY = "idle", "head", "body", "busy"
_TIMEOUT_REASON = {_IDLE: "idle_timeout", _HEAD: "header_timeout", _BODY: "body_timeout"}


class _Tracked:
    """One open connection's phase and the monotonic time by which it must have left it."""

    __slots__ = ("deadline", "phase", "since", "sock")

    def __init__(self, sock: Any, phase: str, deadline: float) -> None:
        self.sock, self.phase, self.since, self.deadline = sock, phase, time.monotonic(), deadline

    def enter(self, phase: str, timeout: float = math.inf) -> None:
        now = time.monotonic()
        self.deadline = now + timeout  # before the phase: the watchdog never sees a new phase's
        self.phase, self.since = phase, now  # name with the old phase's (maybe past) deadline


class _BodyBudget:
    """Bytes of request bodies being read and worked on at once, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._cond = threading.Condition(threading.Lock())

    def take(self, n: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until ``n`` more bytes fit, and take them."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.used + n <= self.limit, max(timeout, 0.0)):
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


class _Server(socketserver.ThreadingTCPServer):
    """Accepts connections, one daemon thread each, at most ``limits.max_connections`` (socketserver;
    no HTTP of its own), and closes those past their phase's deadline (a watchdog thread)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(
        self, address: tuple[str, int], handler: type, limits: ConnectionLimits, metrics: Any
    ) -> None:
        self.limits, self.metrics = limits, metrics
        self.bodies = _BodyBudget(limits.body_budget_bytes or limits.max_body_bytes)
        self.conns: dict[Any, _Tracked] = {}  # socket -> its phase; a connection leaves it when cut or closed
        self.conns_lock = threading.Lock()
        self._watch_stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection error from %s", client_address, exc_info=True)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conns_lock:
            if len(self.conns) >= self.limits.max_connections:
                # Make room: the oldest idle connection, else the oldest still sending its head.
                waiting = [t for t in self.conns.values() if t.phase in (_IDLE, _HEAD)]
                if not waiting:
                    self._refuse(request)
                    return
                self._cut(min(waiting, key=lambda t: (t.phase != _IDLE, t.since)), "evicted")
            self.conns[request] = _Tracked(request, _IDLE, time.monotonic() + self.limits.idle_timeout_s)
        self.metrics.connections_accepted.inc()
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.conns_lock:  # out of the table before its socket closes: _cut never touches a closed one
            self.conns.pop(request, None)
        super().shutdown_request(request)

    def others_busy(self, me: _Tracked) -> bool:
        """Whether a connection other than ``me`` is in the middle of a request."""
        with self.conns_lock:
            return any(t.phase != _IDLE and t is not me for t in self.conns.values())

    def _refuse(self, request: Any) -> None:
        """Past the limit with every connection working: a 503 (plain HTTP; over TLS that would cost
        a handshake) and the connection closes."""
        self.metrics.connections_refused.inc()
        if not isinstance(request, ssl.SSLSocket):
            body = dumps({"Error": f"fedsched: too many connections (limit {self.limits.max_connections})"})
            try:
                request.setblocking(False)  # never wait on a client that does not read
                request.send(b"".join((_STATUS[503], _date(), b"Content-Type: application/json\r\n"
                                       b"Content-Length: ", str(len(body)).encode(), b"\r\n", _CLOSE,
                                       b"\r\n", body)))
            except OSError:
                pass
        socketserver.TCPServer.shutdown_request(self, request)

    def _cut(self, t: _Tracked, reason: str) -> None:
        """Close a connection from outside its thread (held: ``conns_lock``): its blocked read or
        write returns, and the thread ends. The socket is still open (see shutdown_request)."""
        del self.conns[t.sock]
        self.metrics.connections_closed.labels(reason=reason).inc()
        with contextlib.suppress(OSError):
            socket.socket.shutdown(t.sock, socket.SHUT_RDWR)  # the socket's own, also under TLS

    def start_watchdog(self) -> None:
        if self._watchdog is not None:
            return
        limits = self.limits
        shortest = min(limits.idle_timeout_s, limits.header_timeout_s, limits.body_timeout_s)
        tick = max(0.02, min(1.0, shortest / 4))

        def watch() -> None:
            while not self._watch_stop.wait(tick):
                now = time.monotonic()
                with self.conns_lock:
                    for t in [t for t in self.conns.values() if t.deadline < now]:
                        self._cut(t, _TIMEOUT_REASON[t.phase])

        self._watchdog = threading.Thread(target=watch, name="fedsched-extender-watchdog", daemon=True)
        self._watchdog.start()

    def stop_watchdog(self) -> None:
        self._watch_stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)


# ---- HTTP/1.1 ---------------------------------------------------------------------------------

MAX_LINE = 65536  # the request line and each header line (the stdlib's limits)
MAX_HEADERS = 100
_JSON = b"application/json"
_TEXT = b"text/plain"
_SERVER_LINE = f"Server: fedsched-extender Python/{sys.version.split()[0]}\r\n".encode()
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"Connection: close\r\n"
_KEEP_ALIVE = b"Connection: keep-alive\r\n"


class _StatusLines(dict):
    """code -> ``HTTP/1.1 {code} {reason}`` and the Server header, encoded once."""

    def __missing__(self, code: int) -> bytes:
        try:
            reason = HTTPStatus(code).phrase
        except ValueError:
            reason = ""
        line = self[code] = f"HTTP/1.1 {code} {reason}\r\n".encode() + _SERVER_LINE
        return line


_STATUS = _StatusLines()
_date_line: tuple[int, bytes] = (-1, b"")


def _date() -> bytes:
    """The ``Date`` header line of this second (RFC 9110 IMF-fixdate), formatted once a second."""
    global _date_line
    now = int(time.time())
    if _date_line[0] != now:
        _date_line = (now, f"Date: {formatdate(now, usegmt=True)}\r\n".encode())
    return _date_line[1]


def _version(word: str) -> tuple[int, int] | None:
    """``HTTP/1.1`` -> (1, 1); None unless ``HTTP/`` and two dot-separated numbers (RFC 2145, as the
    stdlib reads it: leading zeros ignored, at most 10 digits each)."""
    if word == "HTTP/1.1":
        return 1, 1
    if not word.startswith("HTTP/"):
        return None
    parts = word[5:].split(".")
    if len(parts) != 2 or not all(p.isdigit() and p.isascii() and len(p) <= 10 for p in parts):
        return None
    return int(parts[0]), int(parts[1])


class _Connection(socketserver.StreamRequestHandler):
    """One client connection: its requests read and answered one after the other (keep-alive)
    until the client closes it, asks to (``Connection: close``, HTTP/1.0 without keep-alive), or a
    request breaks the framing (an answer, then the connection closes)."""

    disable_nagle_algorithm = True
    rbufsize = 1 << 16  # a whole 500-candidate request in one read
    # set per server by _make_handler:
    app: ExtenderServer
    decider: Decider
    metrics: Any
    prefix: str
    counters: dict[tuple[str, int], Any]  # (verb, code) -> the requests counter's child
    latencies: dict[tuple[str, str], Any]  # (verb, model version) -> the latency histogram's child

    close_connection = True
    method = ""
    path = ""
    http09 = False  # a bare "GET /path" request line: the answer is the body alone
    http10 = False
    headers: dict[bytes, bytes]
    _last_body: Any = None  # the request's decoded body, for _neutral; dropped once answered
    _budget_taken = 0  # bytes the request's body holds of the in-flight body budget
    _read_at = 0.0  # when the request's body had been read (monotonic)
    peer_names: frozenset[str] = frozenset()  # the client certificate's names (mutual TLS)
    server: _Server
    tracked: _Tracked

    def setup(self) -> None:
        limits = self.server.limits
        # Cut (evicted) before this thread started: a record of its own, its socket already shut.
        self.tracked = self.server.conns.get(self.request) or _Tracked(self.request, _BUSY, math.inf)
        if isinstance(self.request, ssl.SSLSocket):
            self.tracked.enter(_HEAD, limits.header_timeout_s)  # the watchdog bounds the handshake
            self.request.do_handshake()
            self.peer_names = _certificate_names(self.request.getpeercert())
        super().setup()

    def _admin_allowed(self) -> bool:
        return admin_caller_allowed(self.app.tls is not None, str(self.client_address[0]),
                                    self.peer_names, self.app.admin_clients)

    def handle(self) -> None:
        tracked, limits = self.tracked, self.server.limits
        while True:
            tracked.enter(_IDLE, limits.idle_timeout_s)
            if not self.rfile.peek(1):
                return  # the client closed the connection
            tracked.enter(_HEAD, limits.header_timeout_s)  # from the request's first byte
            if not self._serve_one():
                return

    # ---- reading --------------------------------------------------------------------------
    def _serve_one(self) -> bool:
        """Read and answer one request; whether the connection stays open for the next."""
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            return False  # the client closed the connection
        if len(line) > MAX_LINE:
            return self._refuse(414, f"the request line is longer than {MAX_LINE} bytes")
        words = line.decode("latin-1").split()
        if not words:
            return False  # a blank line: closed without an answer, as the stdlib did
        self.http09 = self.http10 = False
        keep = False  # HTTP/1.1: keep-alive unless asked otherwise; HTTP/1.0: only when asked
        if len(words) >= 3:
            number = _version(words[-1])
            if number is None:
                return self._refuse(400, f"bad request version {words[-1][:100]!r}")
            if number >= (2, 0):
                return self._refuse(400, f"{words[-1][:20]} is not served (HTTP/1.1 and 1.0 are)")
            keep = number >= (1, 1)
            self.http10 = not keep
        if not 2 <= len(words) <= 3:
            return self._refuse(400, f"bad request line {line[:200]!r}")
        method, path = words[0], words[1]
        if len(words) == 2:
            if method != "GET":
                return self._refuse(400, f"bad HTTP/0.9 request type {method[:100]!r}")
            self.http09 = True
        if path.startswith("//"):  # as the stdlib (gh-87389): one leading slash
            path = "/" + path.lstrip("/")
        headers = self._read_headers()
        if headers is None:
            return False
        self.tracked.enter(_BODY, self.server.limits.body_timeout_s)
        self.headers = headers
        conn = headers.get(b"connection")
        if conn is not None and not self.http09:
            tokens = [t.strip() for t in conn.lower().split(b",")]
            if b"close" in tokens:
                keep = False
            elif b"keep-alive" in tokens:
                keep = True
        self.close_connection = not keep
        if b"transfer-encoding" in headers:
            self.close_connection = True
            return self._refuse(400, "Transfer-Encoding is not supported: send a Content-Length")
        if not (self.http09 or self.http10) and headers.get(b"expect", b"").lower() == b"100-continue":
            self.request.sendall(_CONTINUE)
        self.method, self.path = method, path
        if method == "POST":
            try:
                self._post(path.split("?", 1)[0])
            finally:
                self._last_body = None  # not kept while the connection waits for its next request
                if self._budget_taken:
                    if self.server.others_busy(self.tracked):
                        # Held as long again, idle: beside other requests, large bodies get about
                        # half of the interpreter, whose lock their parsing holds for tens of ms.
                        time.sleep(min(time.monotonic() - self._read_at, 1.0))
                    self.server.bodies.give(self._budget_taken)
                    self._budget_taken = 0
        elif method == "GET":
            self._get(path.split("?", 1)[0])
        else:
            self._not_allowed()
        return not self.close_connection

    def _read_headers(self) -> dict[bytes, bytes] | None:
        """The header fields up to the blank line, names lower-cased, values stripped (of a name
        given twice the first value counts, as in the stdlib's message object; a Content-Length
        given twice with different values is refused); None when the request was refused or the
        client went away in the middle of it."""
        headers: dict[bytes, bytes] = {}
        readline = self.rfile.readline
        for _ in range(MAX_HEADERS + 1):
            line = readline(MAX_LINE + 1)
            if line == b"\r\n" or line == b"\n":
                return headers
            if not line:
                return None
            if len(line) > MAX_LINE:
                self._refuse(431, f"a header line is longer than {MAX_LINE} bytes")
                return None
            name, sep, value = line.partition(b":")
            if not sep or not name or name.strip() != name:  # also obs-fold (RFC 9112 5.2)
                self._refuse(400, f"bad header line {line[:200]!r}")
                return None
            key = name.lower()
            value = value.strip()
            if headers.setdefault(key, value) != value and key == b"content-length":
                self._refuse(400, "two different Content-Length headers")
                return None
        self._refuse(431, f"more than {MAX_HEADERS} header lines")
        return None

    def _length(self, allow_missing: bool = False) -> int:
        raw = self.headers.get(b"content-length")
        if raw is None:
            if allow_missing:
                return 0
            self.close_connection = True
            raise BadRequest("Content-Length is required")
        try:
            if not raw.isdigit():
                raise ValueError
            n = int(raw)
        except ValueError:
            self.close_connection = True
            raise BadRequest(f"bad Content-Length {raw.decode('latin-1')!r}") from None
        limit = self.server.limits.max_body_bytes
        if n > limit:
            self.close_connection = True  # unread: what follows is not a request
            self.metrics.bodies_refused.labels(reason="too_large").inc()
            raise BodyTooLarge(f"body of {n} bytes (limit {limit}: fedsched serve --max-body)")
        return n

    def _drain_quietly(self) -> None:
        """Read and drop the body, a buffer at a time; a bad Content-Length closes the connection
        after the answer."""
        try:
            n = self._length(allow_missing=True)
        except BadRequest:
            return
        while n > 0:
            chunk = self.rfile.read(min(n, SMALL_BODY))
            if not chunk:
                break
            n -= len(chunk)
        self.tracked.enter(_BUSY)

    def _body(self) -> Any:
        """Read and decode the body; one over ``SMALL_BODY`` bytes first takes its size from the
        in-flight body budget (given back by :meth:`_post` once answered: ``_budget_taken``)."""
        self._last_body = None
        n = self._length()
        if n > SMALL_BODY:
            wait = min(BODY_BUDGET_WAIT_S, self.tracked.deadline - time.monotonic())
            if not self.server.bodies.take(n, wait):
                self.close_connection = True  # unread
                self.metrics.bodies_refused.labels(reason="busy").inc()
                raise BodyBudgetFull(f"too many large bodies at once (at most {self.server.bodies.limit} "
                                     f"bytes of those over {SMALL_BODY}): try again")
            self._budget_taken = n
        raw = self.rfile.read(n)
        self.tracked.enter(_BUSY)
        if self._budget_taken:
            self._read_at = time.monotonic()
        if len(raw) != n:
            self.close_connection = True
            raise BadRequest(f"the body ended after {len(raw)} of its {n} bytes")
        body = self._last_body = decode_body(raw)
        return body

    # ---- writing --------------------------------------------------------------------------
    def _send(self, code: int, body: bytes, ctype: bytes = _JSON, extra: bytes = b"",
              head_only: bool = False) -> None:
        """The answer in one write: status line, Server, Date, ``extra``, Content-Type,
        Content-Length (and Connection where it is not the version's default), body."""
        self.tracked.enter(_BODY, self.server.limits.body_timeout_s)  # a client that does not read
        if self.http09:
            self.request.sendall(body)
            return
        conn = _CLOSE if self.close_connection else _KEEP_ALIVE if self.http10 else b""
        self.request.sendall(b"".join((
            _STATUS[code], _date(), extra, b"Content-Type: ", ctype, b"\r\nContent-Length: ",
            str(len(body)).encode(), b"\r\n", conn, b"\r\n", b"" if head_only else body)))
        if log.isEnabledFor(logging.DEBUG):
            log.debug('%s "%s %s" %d %d', self.client_address[0], self.method, self.path, code, len(body))

    def _refuse(self, code: int, msg: str) -> bool:
        """A request whose HTTP framing cannot be trusted: a JSON error, then the connection
        closes (returns False, for ``_serve_one``)."""
        self.close_connection, self.http09, self.method, self.path = True, False, "-", "-"
        self._send(code, dumps({"Error": f"fedsched: bad HTTP request: {msg}"}))
        return False

    def _count(self, verb: str, code: int) -> None:
        c = self.counters.get((verb, code))
        if c is None:
            c = self.counters[verb, code] = self.metrics.requests.labels(verb=verb, code=str(code))
        c.inc()

    # ---- routes ---------------------------------------------------------------------------
    def _not_allowed(self) -> None:
        # Every method but GET and POST gets a 405 (the stdlib answered 501 Not Implemented).
        self._drain_quietly()
        body = dumps({"Error": f"method {self.method} not allowed (GET or POST)"})
        self._send(405, body, extra=b"Allow: GET, POST\r\n", head_only=self.method == "HEAD")
        self._count("unknown", 405)

    def _get(self, path: str) -> None:
        self._drain_quietly()  # a body left unread would be taken for the next request
        decider = self.decider
        if path == "/metrics":
            c = decider.cache
            self.metrics.cache_nodes.set(len(c.index))
            self.metrics.cache_pods.set(len(c.pods) - len(c.assumed))
            self.metrics.cache_assumed_pods.set(len(c.assumed))
            self._send(200, self.metrics.render(), b"text/plain; version=0.0.4; charset=utf-8")
        elif path == "/healthz":
            self._send(200, b"ok\n", _TEXT)
        elif path == "/readyz":
            ok, msg = decider.ready()
            self._send(200 if ok else 503, (msg + "\n").encode(), _TEXT)
        elif path == "/openapi.json":
            self._send(200, dumps(openapi(self.prefix)))
        else:
            self._send(404, dumps({"Error": f"no such path {path}"}))

    def _post(self, path: str) -> None:
        t0 = time.perf_counter()
        prefix, server, decider = self.prefix, self.app, self.decider
        verb = path[len(prefix) + 1 :] if path.startswith(prefix + "/") else ""
        if verb == "reload":
            verb = ""  # only /admin/reload reloads
        if path == "/admin/reload":
            verb = "reload"
        if verb not in ("filter", "prioritize", "bind", "preempt", "reload"):
            self._drain_quietly()
            self._send(404, dumps({
                "Error": f"no such verb: POST {path} (expected {prefix}/filter, "
                f"{prefix}/prioritize, {prefix}/bind or {prefix}/preempt)"
            }))
            self._count("unknown", 404)
            return
        if verb == "reload" and not self._admin_allowed():
            self._drain_quietly()
            self._send(403, dumps({"Error": "fedsched: the admin verbs need an admin caller (a client "
                                   "certificate named in --admin-clients; in plain-HTTP mode: loopback)"}))
            self._count(verb, 403)
            return
        code = 200
        try:
            body = self._body()
            if verb == "prioritize":
                out: Any = server.prioritize(body, t0)
                server.remember(body["Pod"])
            elif verb == "filter":
                out = server.filter(body)
                server.remember(body["Pod"])
            elif verb == "bind":
                out = server.bind(body)
            elif verb == "preempt":
                out = server.preempt(body)
            else:
                out = self._reload(body)
            data = out if isinstance(out, bytes) else dumps(out)
        except BadRequest as e:
            code, data = e.status, dumps({"Error": f"fedsched: bad {verb} request: {e}"})
            if verb == "reload":  # counted as a failed reload, not as a decision's fallback
                decider.metrics.reloads.labels(result="error", reason="bad_request").inc()
                data = dumps({"Error": f"fedsched: bad reload request: {e}", "changed": False,
                              "model_version": decider.models.version})
        except PathNotAllowed as e:  # the same answer for every path outside the policy directory
            decider.metrics.reloads.labels(result="error", reason="forbidden").inc()
            code, data = 403, dumps({"Error": f"fedsched: reload refused, the model stays: {e}",
                                     "changed": False, "model_version": decider.models.version})
        except CheckpointError as e:  # /admin/reload of a file that cannot be served: counted by the store
            code, data = 422, dumps({"Error": f"fedsched: reload refused, the model stays: {e}",
                                     "changed": False, "model_version": decider.models.version})
        except Exception as e:  # never a 5xx: a neutral answer, counted
            log.exception("internal error in %s", verb)
            decider.metrics.fallbacks.labels(reason="internal", model_version=decider.models.version).inc()
            data = self._neutral(verb, e)
        self._send(code, data)
        self._count(verb, code)
        version = decider.models.version
        h = self.latencies.get((verb, version))
        if h is None:
            h = self.latencies[verb, version] = self.metrics.latency.labels(verb=verb, model_version=version)
        h.observe(time.perf_counter() - t0)

    def _reload(self, body: Any) -> dict[str, Any]:
        """``POST /admin/reload``: the policy file again, or ``{"path": "..."}``. A body of the wrong
        shape is a :class:`BadRequest`; a file that cannot be served raises its
        :class:`CheckpointError` (counted by the model store) and the old model stays."""
        models = self.decider.models
        if body is not None and not isinstance(body, dict):
            raise BadRequest(f"the body must be a JSON object, not {type(body).__name__}")
        path_arg = (body or {}).get("path")
        if path_arg is not None and not isinstance(path_arg, str):
            raise BadRequest(f"path must be a string, not {type(path_arg).__name__}")
        changed, msg = models.reload(models.admin_path(path_arg) if path_arg else None, strict=True)
        return {"changed": changed, "message": msg, "model_version": models.version}

    def _neutral(self, verb: str, e: Exception) -> bytes:
        error = {"Error": f"fedsched: internal error ({type(e).__name__})"}
        body = self._last_body
        names: list[str] = []
        if isinstance(body, dict):
            try:
                names, _ = _names_and_nodes(body)
            except Exception:  # the neutral answer must not fail in turn (no answer at all)
                names = []
        try:
            if verb == "prioritize":
                return dumps([{"Host": n, "Score": 0} for n in names])
            if verb == "filter":
                return dumps({
                    "Nodes": body.get("Nodes") if isinstance(body, dict) else None,
                    "NodeNames": names if isinstance(body, dict) and body.get("Nodes") is None else None,
                    "FailedNodes": {},
                    "FailedAndUnresolvableNodes": {},
                    **error,
                })
        except BadRequest:  # the request's Nodes cannot be encoded back
            pass
        return dumps(error)


def _make_handler(server: ExtenderServer) -> type[_Connection]:
    """The connection handler class of one server (its extender, decider, metrics, prefix)."""
    return type("Handler", (_Connection,), {
        "app": server, "decider": server.decider, "metrics": server.decider.metrics,
        "prefix": server.prefix, "counters": {}, "latencies": {},
    })


# ---- JSON -------------------------------------------------------------------------------------


def reject_constant(name: str) -> float:
    """``json.loads(..., parse_constant=)``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON")


def decode_body(raw: bytes) -> Any:
    """A request body -> its JSON value; :class:`BadRequest` when it is not JSON.

    orjson first (strict RFC 8259: no NaN/Infinity, valid UTF-8 only, at most 1024 levels; of a
    key given twice the last value counts, as in the stdlib; integers past 64 bits read as
    floats). What it refuses is read again by the stdlib's strict decoder, so that what was
    accepted before still is (UTF-8 with a BOM, UTF-16/32, lone surrogates) and what was refused
    gets the stdlib's message, as before."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw, parse_constant=reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BadRequest(f"body is not valid JSON ({e})") from None


def dumps(obj: Any) -> bytes:
    """A JSON value -> compact UTF-8 JSON bytes; :class:`BadRequest` when it cannot be encoded.

    orjson first; what it cannot encode (integers past 64 bits, more than 254 levels, lone
    surrogates: values from bodies only the stdlib's decoder read) goes to the stdlib's encoder
    (ASCII escapes, no NaN/Infinity), which fails only past the recursion limit."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError
        pass
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError) as e:
        raise BadRequest(f"cannot be encoded as JSON ({e})") from None


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
