"""Phase 1, latency: prioritize and filter over each candidate count on one keep-alive
connection, requests back to back, each pod once; the client's view and the server's own mean."""

from __future__ import annotations

from typing import Any

import numpy as np
from harness.extender_client import Endpoint
from harness.stats import timing_stats

from extender.metrics import diff, scrape, server_mean_ms
from extender.workload import Workload, connect, timed_requests


def latency_phase(endpoint: Endpoint, wl: Workload, sizes: list[int], requests: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conn = connect(endpoint)
    for n in sizes:
        wl.fit_share.clear()
        bodies = wl.bodies(n, min(requests, 400))
        before = scrape(endpoint)
        timed_requests(conn, "prioritize", bodies, min(200, requests), f"warm{n}")
        after_warm = scrape(endpoint)
        lat, errors = timed_requests(conn, "prioritize", bodies, requests, f"lat{n}")
        flat, ferrors = timed_requests(conn, "filter", bodies, max(requests // 2, 1), f"flt{n}")
        after = scrape(endpoint)
        out[str(n)] = {
            "prioritize": timing_stats(lat),
            "filter": timing_stats(flat),
            "server_mean_ms": {v: server_mean_ms(after, after_warm, v) for v in ("prioritize", "filter")},
            "errors": errors + ferrors,
            "fitting_candidate_share": float(np.mean(wl.fit_share)),
            "metrics_delta": diff(after, before),
        }
    conn.close()
    return out
