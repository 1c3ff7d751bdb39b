"""Phase 6, forced fallback: on a server started with a budget the policy always misses, the
cluster refilled, prioritize at one candidate count; the latency and how the fallbacks were
counted (``fedsched_fallbacks_total{reason="timeout"|"busy"}``)."""

from __future__ import annotations

from typing import Any

from harness.serve import Agent
from harness.stats import timing_stats

from extender.metrics import diff, scrape
from extender.workload import Log, Workload, connect, prefill, timed_requests


def fallback_phase(
    server: Agent, wl: Workload, n_nodes: int, requests: int, fill: float, budget_ms: float,
    git: dict[str, Any], log: Log,
) -> dict[str, Any]:
    """``git``: the commit as the server started (the code it loaded)."""
    conn = connect(server)
    filled = prefill(conn, wl, fill, log)
    conn.close()
    before = scrape(server)
    bodies = wl.bodies(n_nodes, min(requests, 400))
    conn = connect(server)
    timed_requests(conn, "prioritize", bodies, min(200, requests), "fbwarm")
    mid_before = scrape(server)
    lat, errors = timed_requests(conn, "prioritize", bodies, requests, "fb")
    conn.close()
    d = diff(scrape(server), mid_before)
    decisions = sum(d["decisions"].values())
    return {
        "git": git,
        "budget_ms": budget_ms,
        "nodes": n_nodes,
        "prefill": filled,
        "prioritize": timing_stats(lat),
        "errors": errors,
        "metrics_delta": d,
        "metrics_delta_with_warmup": diff(scrape(server), before),
        "timeout_or_busy_share": (
            d["fallbacks"].get("timeout", 0) + d["fallbacks"].get("busy", 0)
        ) / max(decisions, 1),
    }
