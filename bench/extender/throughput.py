"""Phase 2, throughput: prioritize decisions per second at one candidate count, back to back
over a number of connections (one thread each), and the share answered by the fallback."""

from __future__ import annotations

import threading
import time
from typing import Any

from harness.extender_client import Endpoint
from harness.stats import timing_stats

from extender.metrics import diff, scrape
from extender.workload import Workload, connect, timed_requests


def throughput_phase(
    endpoint: Endpoint, wl: Workload, n_nodes: int, seconds: float, conns: int
) -> dict[str, Any]:
    bodies = wl.bodies(n_nodes, 300)
    before = scrape(endpoint)
    stop = time.perf_counter() + seconds
    results: list[tuple[list[float], int]] = [([], 0)] * conns

    def run(j: int) -> None:
        c = connect(endpoint)
        timed_requests(c, "prioritize", bodies, 50, f"tpw{conns}-{j}")
        lat: list[float] = []
        errors, k = 0, 0
        while time.perf_counter() < stop:
            got, e = timed_requests(c, "prioritize", bodies, 50, f"tp{conns}-{j}-{k}", check_every=1000)
            lat += got
            errors += e
            k += 1
        results[j] = (lat, errors)
        c.close()

    threads = [threading.Thread(target=run, args=(j,)) for j in range(conns)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    lat = [x for r in results for x in r[0]]
    d = diff(scrape(endpoint), before)
    decisions = sum(d["decisions"].values())
    return {
        "connections": conns,
        "seconds": round(elapsed, 2),
        "requests": len(lat),
        "decisions_per_s": len(lat) / elapsed,
        "latency": timing_stats(lat),
        "errors": sum(r[1] for r in results),
        "fallback_share": sum(d["fallbacks"].values()) / max(decisions, 1),
        "metrics_delta": d,
    }
