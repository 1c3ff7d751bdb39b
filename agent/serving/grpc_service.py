"""The agent's gRPC decision service (``fedsched.decision.v1.DecisionService``).

The seed design's Score-plugin path: a Go Score plugin inside kube-scheduler asks the agent
for node scores over gRPC. The HTTP extender (``agent/serving/extender.py``) is the main path; both
are answered by one :class:`~fedsched.agent.serving.decider.Decider` over one cluster cache, so for
the same state the node a ``ScoreNodes`` answer gives 100 is the node the extender's
prioritize answer gives 10, and the nodes a ``FilterNodes`` answer refuses are the nodes the
extender's filter refuses.

RPCs (``common/proto/decision.proto``):

- ``ScoreNodes``: the node-scoring policy's scores, 0..100 (kube's ``MaxNodeScore``), every
  candidate once in request order. When the policy answered, the scores come from the same
  ranking as the extender's 0..10: its pick gets 100 and every other feasible node a linear
  map of its policy score onto 0..99 (the extender's map onto 0..9, at finer resolution);
  nodes unknown to the cache or not fitting get 0. A fallback (kube-default scores) or a
  neutral answer (a pod of another profile) is the extender's 0..10 answer times 10.
- ``GetSchedulingWeights``: the weight policy's weights over ``WEIGHT_TERMS``, or kube's
  default weighting with the fallback reason. A node-scoring model answers FAILED_PRECONDITION.
- ``FilterNodes``: the safety filter's refusals, :meth:`Decider.filter` itself (the extender's
  filter verb): a node above the hard measured CPU or memory limit (``--cpu-threshold``, 90% by
  default), cordoned, NotReady, excluded, unknown to the cache, without room for the pod's GPUs,
  or with stale telemetry; only the refused candidates are sent back, with the extender's reason.
  The plugin's Filter refuses them (``agent/scoreplugin``). The pod is handed to the decider's
  filter without its uid, so it starts no early ranking (the decider's module doc): the plugin's
  PreScore candidates are those of every Filter plugin, not this one's, and a ranking of other
  candidates would only keep the worker from the coming ``ScoreNodes``; the assumption of the
  pod's last attempt is ended first all the same, as the extender's filter ends it.

The pod is either a :class:`PodSpec` (the plugin fills it from the v1.Pod; it is turned into
the equivalent Pod object, so both forms go through the same reader,
:func:`fedsched.agent.cluster.k8s_objects.pod_from_json`) or the raw v1.Pod JSON.

Status codes: a pod that cannot be read, a request without a pod, or a node named twice is
INVALID_ARGUMENT with a message naming the field (the duplicate check is one pass over the names:
40,000 names cost what 40,000 set insertions cost); ``GetSchedulingWeights`` without a weight
policy is FAILED_PRECONDITION; a deadline already past on arrival is DEADLINE_EXCEEDED.
Nothing the client sends produces UNKNOWN or INTERNAL: an internal failure answers neutrally
(zero scores, the default weights, nothing refused) with ``fallback_reason = "internal"``, and is
counted in ``fedsched_fallbacks_total``, as the extender does.

Deadlines: the decider's budget (``DeciderConfig.budget_ms``) runs from the request's arrival;
when the client's deadline (``context.time_remaining()``) is closer than that, the budget is
cut to it less a margin for the response (:data:`DEADLINE_MARGIN_S` plus
:data:`DEADLINE_MARGIN_PER_NODE_S` per candidate, and at least :data:`DEADLINE_SHARE` of the time
left: a loaded machine's thread hand-offs grow with its load, not with the candidates), so a slow
policy still gets a fallback answer to the client in time. The decider measures its budget from the
``t0`` it is given (module doc of ``agent/serving/decider.py``: "from the request's arrival"); the
service passes an earlier ``t0`` when the deadline is the tighter bound, which leaves
``decider.py`` as it is.

Health: ``grpc.health.v1.Health`` reports SERVING for ``""`` and the service name once the
cache is synced and has nodes (polled), NOT_SERVING before and from :meth:`DecisionServer.stop`.
``Check`` only (kubelet's gRPC probes use it): ``Watch`` answers UNIMPLEMENTED, as the health
protocol allows, because each watch is a stream held open for as long as its client likes, and
a few of them would take every one of the ``max_concurrent_rpcs`` places.
Metrics go to the decider's :class:`~fedsched.agent.serving.metrics.ServingMetrics`:
``fedsched_requests_total{verb, code}`` with the gRPC status name as ``code`` and
``fedsched_decision_seconds{verb, model_version}``, verbs ``ScoreNodes``,
``GetSchedulingWeights`` and ``FilterNodes`` (whose refusals the decider counts in
``fedsched_refused_nodes_total{reason}``, beside the extender's).

Limits (:class:`GrpcLimits`, ``fedsched serve --grpc-*``): a fixed pool of worker threads; at
most ``max_concurrent_rpcs`` RPCs in the server at once (running or waiting for a worker; one more
gets RESOURCE_EXHAUSTED at once); at most ``max_connections`` connections (one more is closed as it
arrives) and ``max_streams`` concurrent RPCs on one of them; requests and answers of at most
``max_message_bytes`` (RESOURCE_EXHAUSTED); a connection whose TLS and HTTP/2 handshake takes longer
than ``handshake_timeout_s`` is closed, one without an RPC for ``idle_timeout_s`` is sent GOAWAY
(the plugin reconnects at once), one silent for ``keepalive_s`` is pinged and closed when the ping
is not answered within ``keepalive_timeout_s``, and a client pinging more often than every
``min_client_ping_s`` without an RPC is sent GOAWAY (gRPC's ping-abuse rule).

Transport security: mutual TLS with PEM files (e.g. from ``fedsched certs``): the server's
certificate and key and the CA that must have signed the client's certificate.
:class:`DecisionClient` is the matching client (tests, benchmarks, debugging).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from os import PathLike
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedsched.agent.cluster.k8s_objects import (
    GPU_COUNT_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    GPU_RESOURCE,
    QOS_ANNOTATION,
    ObjectError,
    model_names,
)
from fedsched.agent.serving.decider import Decider, Decision, to_extender_scores
from fedsched.agent.serving.extender import reject_constant
from fedsched.common.learning.nets import WEIGHT_TERMS
from fedsched.common.model.cluster import MILLI_PER_GPU, QOS_CLASSES, Pod
from fedsched.common.proto import decision_pb2, decision_pb2_grpc

log = logging.getLogger("fedsched.serve")

SERVICE_NAME = decision_pb2.DESCRIPTOR.services_by_name["DecisionService"].full_name
MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore
# Kept free of the budget when the client's deadline binds: the fallback's scores and the response
# (about 2.5 us per candidate node here, on top of the decider's own 1 ms reservation).
DEADLINE_MARGIN_S = 0.005  # thread hand-offs on a loaded 2-core machine took up to a few ms
DEADLINE_MARGIN_PER_NODE_S = 2.5e-6
DEADLINE_SHARE = 0.1  # ... and at least this share of the client's remaining time
READY_POLL_S = 0.5
HEALTH = health_pb2.HealthCheckResponse

PEM = str | PathLike | bytes
ServerTLS = tuple[PEM, PEM, PEM | None]  # (certificate, private key, client CA or None)
ClientTLS = tuple[PEM, PEM | None, PEM | None]  # (CA, client certificate, client key)


class _Refused(Exception):
    """A request refused with a gRPC status other than OK (never UNKNOWN/INTERNAL)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> _Refused:
    return _Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


# ---- pods on the wire ---------------------------------------------------------------------------


def pod_spec_to_json(spec: decision_pb2.PodSpec) -> dict:
    """The v1.Pod object a :class:`PodSpec` describes, as :func:`pod_from_json` reads it.

    Raises :class:`ObjectError` for values no pod can have.
    """
    if spec.cpu_milli < 0:
        raise ObjectError(f"spec.cpu_milli: must be >= 0, got {spec.cpu_milli}")
    if spec.memory_mib < 0:
        raise ObjectError(f"spec.memory_mib: must be >= 0, got {spec.memory_mib}")
    if spec.num_gpu < 0:
        raise ObjectError(f"spec.num_gpu: must be >= 0, got {spec.num_gpu}")
    if not 0 <= spec.gpu_milli <= MILLI_PER_GPU:
        raise ObjectError(f"spec.gpu_milli: must be in 0..{MILLI_PER_GPU}, got {spec.gpu_milli}")
    if spec.gpu_milli and not spec.num_gpu:
        raise ObjectError(f"spec.gpu_milli is {spec.gpu_milli} but spec.num_gpu is 0")
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.cpu_milli:
        requests["cpu"] = f"{spec.cpu_milli}m"
    if spec.memory_mib:
        requests["memory"] = f"{spec.memory_mib}Mi"
    ann: dict[str, str] = {}
    if spec.qos:
        ann[QOS_ANNOTATION] = spec.qos
    if spec.num_gpu:
        if 0 < spec.gpu_milli < MILLI_PER_GPU:
            ann[GPU_MILLI_ANNOTATION] = str(spec.gpu_milli)
            ann[GPU_COUNT_ANNOTATION] = str(spec.num_gpu)
        else:
            requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(spec.num_gpu)
        models = [m for m in spec.gpu_models if m.strip()]
        if models:
            ann[GPU_MODEL_ANNOTATION] = ",".join(models)
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    pod_spec: dict[str, Any] = {"containers": [{"name": "main", "resources": resources}]}
    if spec.scheduler_name:
        pod_spec["schedulerName"] = spec.scheduler_name
    return {
        "metadata": {"name": spec.name, "namespace": spec.namespace, "uid": spec.uid, "annotations": ann},
        "spec": pod_spec,
    }


def pod_spec_from_pod(
    pod: Pod,
    models: Sequence[str] = (),
    name: str = "",
    namespace: str = "default",
    uid: str = "",
    scheduler_name: str = "fedsched",
) -> decision_pb2.PodSpec:
    """The :class:`PodSpec` of a fedsched :class:`Pod` (``models``: the cluster's GPU models,
    for the pod's model constraint); the agent reads it back as ``pod`` (index aside)."""
    gpu_models = model_names(pod.spec_mask, tuple(models)) if pod.num_gpu else []
    return decision_pb2.PodSpec(
        name=name,
        namespace=namespace,
        uid=uid,
        scheduler_name=scheduler_name,
        cpu_milli=pod.cpu,
        memory_mib=pod.mem,
        num_gpu=pod.num_gpu,
        gpu_milli=pod.gpu_milli if pod.num_gpu else 0,
        gpu_models=gpu_models,
        qos=QOS_CLASSES[pod.qos],
    )


def _pod_object(request: Any) -> dict:
    """The request's pod as a v1.Pod object (raises :class:`_Refused`)."""
    which = request.WhichOneof("pod")
    if which is None:
        raise _bad("the request has no pod: set spec or pod_json")
    if which == "spec":
        try:
            return pod_spec_to_json(request.spec)
        except ObjectError as e:
            raise _bad(f"pod: {e}") from None
    try:
        obj = json.loads(request.pod_json, parse_constant=reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise _bad(f"pod_json is not valid JSON ({e})") from None
    if not isinstance(obj, dict) or not obj:
        raise _bad("pod_json must be a non-empty JSON object (a v1.Pod)")
    return obj


def _names(request: Any) -> list[str]:
    """The request's node names; INVALID_ARGUMENT naming the first one named twice. One pass:
    a hash per name (the first duplicate is looked for only when there is one)."""
    names = list(request.node_names)
    if len(set(names)) != len(names):
        seen: set[str] = set()
        for n in names:
            if n in seen:
                raise _bad(f"node_names: node {n!r} is named twice")
            seen.add(n)
    return names


def _without_uid(obj: dict) -> dict:
    """``obj`` with no ``metadata.uid`` (shallow copies): the decider's filter then starts no early
    ranking for the pod (see the module doc)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "uid" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "uid"}}


# ---- scores -------------------------------------------------------------------------------------


def decision_scores(d: Decision) -> list[int]:
    """The 0..100 scores of one decision, in ``d.hosts`` order (see the module doc)."""
    r = d.ranking
    if d.source != "policy" or r is None or r.best < 0 or d.positions is None:
        return (np.asarray(d.scores, dtype=np.int64) * (MAX_NODE_SCORE // 10)).tolist()
    out = np.zeros(len(d.hosts), dtype=np.int64)
    out[d.positions] = to_extender_scores(r.scores, r.best, MAX_NODE_SCORE)
    return out.tolist()


# ---- the servicer -------------------------------------------------------------------------------


class DecisionServicer(decision_pb2_grpc.DecisionServiceServicer):
    """``fedsched.decision.v1.DecisionService`` over a :class:`Decider` (see the module doc)."""

    def __init__(
        self,
        decider: Decider,
        deadline_margin_s: float = DEADLINE_MARGIN_S,
        deadline_margin_per_node_s: float = DEADLINE_MARGIN_PER_NODE_S,
        deadline_share: float = DEADLINE_SHARE,
    ) -> None:
        self.decider = decider
        self.deadline_margin_s = deadline_margin_s
        self.deadline_margin_per_node_s = deadline_margin_per_node_s
        self.deadline_share = deadline_share

    # -- helpers
    def _budget_start(self, t0: float, context: grpc.ServicerContext, n_nodes: int) -> float:
        """The ``t0`` to give the decider: the arrival time, or earlier when the client's
        deadline, less the margin for answering ``n_nodes``, leaves less than the configured
        budget (so the budget ends in time)."""
        remaining = context.time_remaining()
        if remaining is None:
            return t0
        if remaining <= 0:
            raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the request ran")
        now = time.perf_counter()
        budget = self.decider.cfg.budget_ms / 1000.0
        margin = max(self.deadline_margin_s + self.deadline_margin_per_node_s * n_nodes,
                     self.deadline_share * remaining)
        return min(t0, now + remaining - margin - budget)

    def _finish(self, verb: str, code: grpc.StatusCode, version: str, t0: float) -> None:
        m = self.decider.metrics
        m.requests.labels(verb=verb, code=code.name).inc()
        m.latency.labels(verb=verb, model_version=version).observe(time.perf_counter() - t0)

    def _serve(
        self,
        verb: str,
        request: Any,
        context: grpc.ServicerContext,
        version: str,
        answer: Callable[[Any, grpc.ServicerContext, float], Any],
        neutral: Callable[[Any, str], Any],
    ) -> Any:
        """Run ``answer``; a refusal aborts with its status, an internal failure answers
        ``neutral`` (counted as fallback reason "internal"); every outcome is measured."""
        t0 = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            resp = answer(request, context, t0)
            version = getattr(resp, "model_version", "") or version  # FilterNodes has none
            return resp
        except _Refused as e:
            code = e.code
            context.abort(e.code, f"fedsched: {e.message}")
        except Exception:  # never UNKNOWN/INTERNAL: a neutral answer, counted
            log.exception("internal error in %s", verb)
            self.decider.metrics.fallbacks.labels(reason="internal", model_version=version).inc()
            return neutral(request, version)
        finally:
            self._finish(verb, code, version, t0)

    # -- RPCs
    def ScoreNodes(
        self, request: decision_pb2.ScoreNodesRequest, context: grpc.ServicerContext
    ) -> decision_pb2.ScoreNodesResponse:
        return self._serve(
            "ScoreNodes", request, context, self.decider.models.version, self._score_nodes, _neutral_scores
        )

    def GetSchedulingWeights(
        self, request: decision_pb2.GetSchedulingWeightsRequest, context: grpc.ServicerContext
    ) -> decision_pb2.GetSchedulingWeightsResponse:
        store = self.decider.weights_models or self.decider.models
        return self._serve(
            "GetSchedulingWeights", request, context, store.version, self._weights, _default_weights
        )

    def FilterNodes(
        self, request: decision_pb2.FilterNodesRequest, context: grpc.ServicerContext
    ) -> decision_pb2.FilterNodesResponse:
        return self._serve(
            "FilterNodes", request, context, self.decider.models.version, self._filter_nodes, _nothing_refused
        )

    def _score_nodes(
        self, request: decision_pb2.ScoreNodesRequest, context: grpc.ServicerContext, t0: float
    ) -> decision_pb2.ScoreNodesResponse:
        decider = self.decider
        names = _names(request)
        obj = _pod_object(request)
        start = self._budget_start(t0, context, len(names))
        try:
            d = decider.prioritize(obj, names, start)
        except ObjectError as e:
            raise _bad(f"pod: {e}") from None
        scores = decision_scores(d)
        return decision_pb2.ScoreNodesResponse(
            # dicts, not NodeScore objects: the message is built in C (2.4x faster at 500 nodes)
            scores=[{"node": h, "score": s} for h, s in zip(d.hosts, scores, strict=True)],
            model_version=d.model_version,
            source=d.source,
            fallback_reason=d.reason,
        )

    def _filter_nodes(
        self, request: decision_pb2.FilterNodesRequest, context: grpc.ServicerContext, t0: float
    ) -> decision_pb2.FilterNodesResponse:
        names = _names(request)
        obj = _pod_object(request)
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the request ran")
        try:
            # The filter still ends an assumption left by the pod's last attempt, as the extender's
            # does (the uid is what matches it), before the nodes are judged without it.
            self.decider._new_attempt(obj)
            ans = self.decider.filter(_without_uid(obj), names)
        except ObjectError as e:
            raise _bad(f"pod: {e}") from None
        return decision_pb2.FilterNodesResponse(
            refused=[{"node": n, "reason": r} for n, r in ans.failed.items()]
        )

    def _weights(
        self, request: decision_pb2.GetSchedulingWeightsRequest, context: grpc.ServicerContext, t0: float
    ) -> decision_pb2.GetSchedulingWeightsResponse:
        decider = self.decider
        store = decider.weights_models or decider.models
        model = store.current
        if model.kind != "weights":
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the agent serves model {model.version} ({model.path}), a node-scoring policy, "
                "not a weight policy: start it with --weights-policy",
            )
        names = _names(request)
        obj = _pod_object(request)
        try:
            pod = decider.cache.pod(obj)
        except ObjectError as e:
            raise _bad(f"pod: {e}") from None
        start = self._budget_start(t0, context, len(names))
        try:
            weights, version, reason = decider.weights(pod, names, start)
        except TypeError:
            if store.current.kind == "weights":
                raise
            raise _Refused(  # the model was swapped for a node-scoring one in the meantime
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the agent now serves model {store.current.version}, a node-scoring policy",
            ) from None
        return decision_pb2.GetSchedulingWeightsResponse(
            weights=weights, model_version=version, fallback_reason=reason
        )


def _neutral_scores(request: decision_pb2.ScoreNodesRequest, version: str) -> decision_pb2.ScoreNodesResponse:
    return decision_pb2.ScoreNodesResponse(
        scores=[decision_pb2.NodeScore(node=n, score=0) for n in dict.fromkeys(request.node_names)],
        model_version=version,
        source="fallback",
        fallback_reason="internal",
    )


def _nothing_refused(
    request: decision_pb2.FilterNodesRequest, version: str
) -> decision_pb2.FilterNodesResponse:
    """Fail open: an internal failure refuses no node (kube-scheduler's own filters still run)."""
    return decision_pb2.FilterNodesResponse()


def _default_weights(
    request: decision_pb2.GetSchedulingWeightsRequest, version: str
) -> decision_pb2.GetSchedulingWeightsResponse:
    """kube's default weighting (the decider's fallback): equal weight on free CPU and memory."""
    default = {t: (0.5 if t in ("free_cpu", "free_mem") else 0.0) for t in WEIGHT_TERMS}
    return decision_pb2.GetSchedulingWeightsResponse(
        weights=default, model_version=version, fallback_reason="internal"
    )


# ---- the server ---------------------------------------------------------------------------------


class _CheckOnlyHealth(health.HealthServicer):
    """grpc.health.v1 without ``Watch`` (module doc: Health)."""

    def Watch(self, request: Any, context: grpc.ServicerContext, send_response_callback: Any = None) -> None:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "fedsched: health Watch is not served; use Check")


def _pem(x: PEM) -> bytes:
    if isinstance(x, bytes):
        return x
    with open(x, "rb") as f:
        return f.read()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class DecisionServer(grpc.Server):
    """A started ``grpc.Server`` with the decision and health services; ``port`` is the bound
    port. :meth:`stop` turns health to NOT_SERVING before it stops the server."""

    def __init__(
        self,
        server: grpc.Server,
        port: int,
        servicer: DecisionServicer,
        health_servicer: health.HealthServicer,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self._server = server
        self._pool = pool
        self.port = port
        self.servicer = servicer
        self.health = health_servicer
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None

    # readiness -> health
    def _watch(self, interval_s: float) -> None:
        last: int | None = None
        while True:
            ok, _ = self.servicer.decider.ready()
            status = HEALTH.SERVING if ok else HEALTH.NOT_SERVING
            if status != last and not self._stopped.is_set():
                for name in ("", SERVICE_NAME):
                    self.health.set(name, status)
                last = status
            if self._stopped.wait(interval_s):
                return

    def _start_watch(self, interval_s: float) -> None:
        self._watcher = threading.Thread(
            target=self._watch, args=(interval_s,), name="fedsched-grpc-health", daemon=True
        )
        self._watcher.start()

    # grpc.Server
    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        self._server.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._server.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self._server.add_secure_port(address, server_credentials)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None) -> threading.Event:
        self._stopped.set()
        self.health.enter_graceful_shutdown()  # NOT_SERVING for every service, and stays so
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        done = self._server.stop(grace)
        if self._pool is not None:  # in-flight RPCs finish; the idle workers go
            self._pool.shutdown(wait=False)
        return done

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)


@dataclass(frozen=True)
class GrpcLimits:
    """The gRPC server's bounds (module doc; ``fedsched serve --grpc-*``)."""

    workers: int = 4  # threads answering RPCs
    max_concurrent_rpcs: int = 32  # RPCs running or waiting for a worker; one more: RESOURCE_EXHAUSTED
    max_connections: int = 64  # open connections; one more is closed as it arrives
    max_streams: int = 16  # concurrent RPCs on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)
    max_message_bytes: int = 4 * 1024 * 1024  # a larger request or answer: RESOURCE_EXHAUSTED
    idle_timeout_s: float = 300.0  # a connection without an RPC this long is sent GOAWAY
    handshake_timeout_s: float = 10.0  # a connection's TLS + HTTP/2 handshake must end within this
    keepalive_s: float = 60.0  # a connection silent this long is pinged ...
    keepalive_timeout_s: float = 20.0  # ... and closed when the ping is not answered within this
    min_client_ping_s: float = 10.0  # a client pinging more often than this without an RPC: GOAWAY

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"gRPC limit {f.name} must be positive, got {getattr(self, f.name)}")

    def options(self) -> list[tuple[str, int]]:
        """The grpc core channel arguments of these limits."""

        def ms(s: float) -> int:
            return max(1, round(s * 1000))

        return [
            # so_reuseport off: a second agent on the same port must fail to bind, not share it.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", self.max_streams),
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            ("grpc.max_connection_idle_ms", ms(self.idle_timeout_s)),
            ("grpc.server_handshake_timeout_ms", ms(self.handshake_timeout_s)),
            ("grpc.keepalive_time_ms", ms(self.keepalive_s)),
            ("grpc.keepalive_timeout_ms", ms(self.keepalive_timeout_s)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", ms(self.min_client_ping_s)),
            ("grpc.http2.max_ping_strikes", 2),
        ]


def serve_grpc(
    decider: Decider,
    host: str = "127.0.0.1",
    port: int = 0,
    tls: ServerTLS | None = None,
    ready_poll_s: float = READY_POLL_S,
    limits: GrpcLimits | None = None,
) -> tuple[DecisionServer, int]:
    """Start the decision service (and grpc.health.v1) on ``host:port``; (the started server,
    the bound port) -- port 0 picks a free one. ``tls`` = (certificate, private key, client CA)
    as PEM bytes or file paths: TLS, and with a client CA mutual TLS (a client certificate
    signed by it is required). ``limits``: :class:`GrpcLimits` (default: its defaults)."""
    limits = limits or GrpcLimits()
    pool = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="fedsched-grpc")
    server = grpc.server(pool, options=limits.options(), maximum_concurrent_rpcs=limits.max_concurrent_rpcs)
    servicer = DecisionServicer(decider)
    decision_pb2_grpc.add_DecisionServiceServicer_to_server(servicer, server)
    health_servicer = _CheckOnlyHealth()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, HEALTH.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = _address(host, port)
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            cert, key, client_ca = tls
            creds = grpc.ssl_server_credentials(
                [(_pem(key), _pem(cert))],
                root_certificates=_pem(client_ca) if client_ca is not None else None,
                require_client_auth=client_ca is not None,
            )
            bound = server.add_secure_port(address, creds)
    except RuntimeError as e:  # grpcio raises where older versions returned port 0
        bound, why = 0, str(e)
    else:
        why = "no port bound"
    if not bound:
        pool.shutdown(wait=False)
        raise OSError(f"gRPC: cannot bind {address} ({why})")
    out = DecisionServer(server, bound, servicer, health_servicer, pool)
    out.start()
    out._start_watch(ready_poll_s)
    log.info(
        "gRPC decision service on %s (%s)",
        _address(host, bound),
        "mTLS" if tls and tls[2] else "TLS" if tls else "plaintext",
    )
    return out, bound


# ---- the client ---------------------------------------------------------------------------------

PodArg = decision_pb2.PodSpec | dict | bytes | str


def _set_pod(request: Any, pod: PodArg) -> None:
    if isinstance(pod, decision_pb2.PodSpec):
        request.spec.CopyFrom(pod)
    elif isinstance(pod, dict):
        request.pod_json = json.dumps(pod).encode()
    elif isinstance(pod, str):
        request.pod_json = pod.encode()
    elif isinstance(pod, bytes):
        request.pod_json = pod
    else:
        raise TypeError(f"pod must be a PodSpec, a Pod object (dict) or its JSON, got {type(pod).__name__}")


class DecisionClient:
    """A client of the decision service. ``tls`` = (CA, client certificate, client key), PEM
    bytes or paths (certificate and key None: TLS without a client certificate);
    ``server_name`` overrides the name checked against the server's certificate; ``options``:
    more gRPC channel arguments."""

    def __init__(
        self,
        target: str,
        tls: ClientTLS | None = None,
        server_name: str | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.target = target
        options = list(options)
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if tls is None:
            self.channel = grpc.insecure_channel(target, options=options)
        else:
            ca, cert, key = tls
            creds = grpc.ssl_channel_credentials(
                root_certificates=_pem(ca),
                private_key=_pem(key) if key is not None else None,
                certificate_chain=_pem(cert) if cert is not None else None,
            )
            self.channel = grpc.secure_channel(target, creds, options=options)
        self.stub = decision_pb2_grpc.DecisionServiceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def wait_ready(self, timeout: float = 5.0) -> None:
        """Block until the channel is connected (raises grpc.FutureTimeoutError)."""
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def score_nodes(
        self, pod: PodArg, names: Iterable[str], timeout: float | None = 1.0
    ) -> decision_pb2.ScoreNodesResponse:
        """``pod``: a PodSpec, a v1.Pod object (dict) or its JSON; raises grpc.RpcError."""
        req = decision_pb2.ScoreNodesRequest(node_names=list(names))
        _set_pod(req, pod)
        return self.stub.ScoreNodes(req, timeout=timeout)

    def weights(
        self, pod: PodArg, names: Iterable[str], timeout: float | None = 1.0
    ) -> decision_pb2.GetSchedulingWeightsResponse:
        req = decision_pb2.GetSchedulingWeightsRequest(node_names=list(names))
        _set_pod(req, pod)
        return self.stub.GetSchedulingWeights(req, timeout=timeout)

    def filter_nodes(
        self, pod: PodArg, names: Iterable[str], timeout: float | None = 1.0
    ) -> dict[str, str]:
        """{refused node: reason} of the safety filter (every other candidate passes)."""
        req = decision_pb2.FilterNodesRequest(node_names=list(names))
        _set_pod(req, pod)
        return {r.node: r.reason for r in self.stub.FilterNodes(req, timeout=timeout).refused}

    def health(self, service: str = "", timeout: float | None = 1.0) -> str:
        """The health status name (SERVING, NOT_SERVING, ...)."""
        resp = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> DecisionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
