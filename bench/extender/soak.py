"""Phase 5, soak: back-to-back filter + prioritize pairs at 500 nodes for some minutes, a
/metrics scrape every 15 s (as Prometheus would), the server's RSS sampled every few seconds and
its slope over the second half; latency and memory minute by minute."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import numpy as np
from harness.serve import Agent, get
from harness.stats import timing_stats

from extender.metrics import diff, scrape
from extender.workload import UID_TOKEN, Log, Workload, connect


def soak_phase(server: Agent, wl: Workload, minutes: float, sample_s: float, unique: bool,
               log: Log) -> dict[str, Any]:
    bodies = wl.bodies(500, 300)
    rss: list[tuple[float, float]] = []
    per_minute: list[dict[str, Any]] = []
    stop = threading.Event()
    t_start = time.perf_counter()
    end = t_start + minutes * 60.0

    def sampler() -> None:
        while not stop.is_set():
            rss.append((time.perf_counter() - t_start, server.rss_mb()))
            stop.wait(sample_s)

    def scraper() -> None:  # Prometheus
        while not stop.wait(15.0):
            get(server, "/metrics")

    threads = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=scraper, daemon=True)]
    for t in threads:
        t.start()
    before = scrape(server)
    conn = connect(server)
    pairs, errors, k = 0, 0, 0
    minute_lat: list[float] = []
    next_minute = t_start + 60.0
    gc.disable()
    try:
        while time.perf_counter() < end:
            body, _ = bodies[k % len(bodies)]
            uid = f"soak-{k:09d}" if unique else f"soak-{k % 5000:09d}"
            raw = body.replace(UID_TOKEN.encode(), uid.encode())
            s1, _ = conn.post_bytes("filter", raw)
            t0 = time.perf_counter()
            s2, _ = conn.post_bytes("prioritize", raw)
            minute_lat.append(time.perf_counter() - t0)
            errors += (s1 != 200) + (s2 != 200)
            pairs += 1
            k += 1
            now = time.perf_counter()
            if now >= next_minute:
                gc.collect()
                per_minute.append({"minute": len(per_minute) + 1, "pairs": len(minute_lat),
                                   "prioritize": timing_stats(minute_lat), "rss_mb": rss[-1][1]})
                log(f"  soak minute {len(per_minute)}: {len(minute_lat)} pairs, prioritize p99 "
                    f"{per_minute[-1]['prioritize']['p99_ms']:.2f} ms, RSS {rss[-1][1]:.1f} MB")
                minute_lat = []
                next_minute += 60.0
    finally:
        gc.enable()
        stop.set()
        for t in threads:
            t.join(5)
        conn.close()
    elapsed = time.perf_counter() - t_start
    rss.append((elapsed, server.rss_mb()))
    t = np.array([x for x, _ in rss])
    m = np.array([y for _, y in rss])
    half = t >= elapsed / 2
    slope = float(np.polyfit(t[half] / 60.0, m[half], 1)[0]) if half.sum() >= 3 else float("nan")
    return {
        "minutes": round(elapsed / 60.0, 2),
        "unique_uids": unique,
        "pairs": pairs,
        "pairs_per_s": pairs / elapsed,
        "errors": errors,
        "rss_mb": {"start": float(m[0]), "end": float(m[-1]), "max": float(m.max()), "min": float(m.min())},
        "slope_mb_per_min_second_half": slope,
        "rss_samples": [[round(float(a), 1), round(float(b), 2)] for a, b in rss],
        "per_minute": per_minute,
        "metrics_delta": diff(scrape(server), before),
    }
