"""Prometheus metrics of the serving agent (``/metrics`` of the extender and the gRPC service).

Each server owns a :class:`ServingMetrics` with its own registry, so tests and several
servers in one process never share counters. Every decision metric carries the model
version that made (or failed to make) the decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Sub-millisecond resolution where the goals are (p99 <= 2 ms), up to past the 10 ms budget.
LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)


class ServingMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.latency = Histogram(
            "fedsched_decision_seconds",
            "Time to answer one scheduling request",
            ["verb", "model_version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "fedsched_requests_total", "Requests by verb and HTTP/gRPC status", ["verb", "code"], registry=r
        )
        self.decisions = Counter(
            "fedsched_decisions_total",
            "Decisions by mode and source of the scores",
            ["mode", "source", "model_version"],
            registry=r,
        )
        self.fallbacks = Counter(
            "fedsched_fallbacks_total",
            "Requests answered with kube-default scores, by reason",
            ["reason", "model_version"],
            registry=r,
        )
        self.refused = Counter(
            "fedsched_refused_nodes_total",
            "Candidate nodes refused by the safety filter",
            ["reason"],
            registry=r,
        )
        self.early_rankings = Counter(
            "fedsched_early_rankings_total",
            "Rankings started when filter answered: used by prioritize, stale (the cache changed "
            "in between: ranked again) or unused",
            ["result"],
            registry=r,
        )
        self.searches = Counter(
            "fedsched_search_decisions_total",
            "Decisions of the decision-time search (--search): switched (it moved the pod off the "
            "model's pick), kept (it tried other candidates and kept the pick), single (one distinct "
            "candidate) or no-pool (too few pods asked for yet to draw arrivals from)",
            ["result"],
            registry=r,
        )
        self.shadow = Counter(
            "fedsched_shadow_decisions_total",
            "Shadow mode: whether the policy's pick equals the default scores' pick",
            ["agree", "model_version"],
            registry=r,
        )
        self.model_info = Gauge(
            "fedsched_model_info", "The model in use (value 1)", ["model_version", "path"], registry=r
        )
        self.packing_check = Gauge(
            "fedsched_packing_check_allocation_percent",
            "Packing check (--packing-check): the allocation (%) a packing simulation of the pods asked "
            "for on this cluster's nodes reaches with the model (scheduler=policy) and with the "
            "scheduler it replaces and each alternative (--packing-alternatives), means over the "
            "simulated workloads; the model is served in shadow mode unless it allocates more with evidence "
            "(a one-sided 95% paired lower bound above 0)",
            ["model_version", "scheduler"],
            registry=r,
        )
        self.packing_serving = Gauge(
            "fedsched_packing_check_serving",
            "Packing check: the scheduler serving this cluster's decisions after the latest verdict "
            "(value 1): policy (the model), an alternative, or the one the model replaces (shadow mode)",
            ["model_version", "scheduler"],
            registry=r,
        )
        self.policy_active = Gauge(
            "fedsched_policy_active",
            "Roll-out gate: 1 when the model is served actively on this cluster's profile, 0 in "
            "shadow mode (the reason label says why)",
            ["model_version", "profile", "reason"],
            registry=r,
        )
        self.model_loaded = Gauge(
            "fedsched_model_loaded_timestamp_seconds", "When the model was loaded", registry=r
        )
        self.reloads = Counter(
            "fedsched_model_reloads_total",
            "Model reloads by result; a failed one (the old model serves on) by reason: missing, "
            "unreadable, schema, malformed, non_finite, bad_request (/admin/reload's body), forbidden "
            "(a path outside the policy directory) or internal",
            ["result", "reason"],
            registry=r,
        )
        self.telemetry_up = Gauge(
            "fedsched_telemetry_up",
            "1 when the last telemetry refresh succeeded; 0: working on requests alone",
            registry=r,
        )
        self.telemetry_age = Gauge(
            "fedsched_telemetry_age_seconds",
            "Seconds since the last successful telemetry refresh",
            registry=r,
        )
        self.cache_nodes = Gauge("fedsched_cache_nodes", "Nodes in the agent's cluster cache", registry=r)
        self.cache_pods = Gauge("fedsched_cache_pods", "Bound pods in the agent's cluster cache", registry=r)
        self.cache_assumed_pods = Gauge(
            "fedsched_cache_assumed_pods",
            "Pods the agent placed and counts on their node, their binding not seen yet",
            registry=r,
        )
        self.connections_open = Gauge(
            "fedsched_connections_open", "Extender connections open (at most --max-connections)", registry=r
        )
        self.connections_accepted = Counter(
            "fedsched_connections_accepted_total", "Extender connections accepted", registry=r
        )
        self.connections_refused = Counter(
            "fedsched_connections_refused_total",
            "Extender connections refused (a 503, then closed): --max-connections open, none idle",
            registry=r,
        )
        self.connections_closed = Counter(
            "fedsched_connections_closed_total",
            "Extender connections the agent closed, by reason: idle_timeout, header_timeout (the "
            "request line and headers, or the TLS handshake, took too long), body_timeout (a body "
            "or an answer took too long), evicted (the oldest idle one, to make room for a new one "
            "past --max-connections)",
            ["reason"],
            registry=r,
        )
        self.bodies_refused = Counter(
            "fedsched_request_bodies_refused_total",
            "Extender request bodies refused unread (the connection closed after the answer), by "
            "reason: too_large (over --max-body: a 413), busy (no room within a second in the "
            "budget of large bodies in flight: a 503)",
            ["reason"],
            registry=r,
        )
        self.body_bytes_in_flight = Gauge(
            "fedsched_request_body_bytes_in_flight",
            "Bytes of the extender's large request bodies (over 64 KiB) being read or worked on",
            registry=r,
        )
        self.learned_nodes = Gauge(
            "fedsched_learned_nodes",
            "Nodes learned from full Nodes requests that the watch has not reported (at most "
            "--max-learned-nodes)",
            registry=r,
        )
        self.learned_nodes_dropped = Counter(
            "fedsched_learned_nodes_dropped_total",
            "Nodes named by full Nodes requests and not kept, by reason: evicted (a learned node "
            "forgotten, the least recently named, to make room for a new one), over_limit (a request "
            "named more new nodes than --max-learned-nodes: the rest were not learned)",
            ["reason"],
            registry=r,
        )
        self.logged = Counter(
            "fedsched_decision_log_total",
            "Decisions written to the decision log with outcome",
            ["result"],
            registry=r,
        )

    def set_gate(self, version: str, profile: str, active: bool, reason: str) -> None:
        """The roll-out gate's verdict on a model for this cluster's profile."""
        self.policy_active.clear()
        self.policy_active.labels(model_version=version, profile=profile, reason=reason).set(
            1 if active else 0)

    def set_packing_check(self, version: str, figures: dict[str, float], serving: str) -> None:
        """The packing check's latest verdict: each simulated scheduler's figure (``policy``: the
        model) and what serves (the previous model's figures are dropped)."""
        self.packing_check.clear()
        for name, value in figures.items():
            self.packing_check.labels(model_version=version, scheduler=name).set(value)
        self.packing_serving.clear()
        self.packing_serving.labels(model_version=version, scheduler=serving).set(1)

    def set_model(self, version: str, path: str) -> None:
        self.model_info.clear()
        self.model_info.labels(model_version=version, path=path).set(1)
        self.model_loaded.set(time.time())

    def watch_telemetry(self, last_success: Callable[[], float], up: Callable[[], bool]) -> None:
        """Compute the telemetry gauges at scrape time."""
        self.telemetry_age.set_function(
            lambda: time.time() - last_success() if last_success() else float("inf")
        )
        self.telemetry_up.set_function(lambda: 1.0 if up() else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
