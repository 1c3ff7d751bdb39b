"""Phase 3, gRPC: ``ScoreNodes`` latency at each candidate count through the agent's
``DecisionClient`` (the server started with ``--grpc-port``), when ``grpc_service`` has it."""

from __future__ import annotations

import gc
import json
import time
from typing import Any

from harness.stats import timing_stats

from extender.workload import UID_TOKEN, Workload

SEED_GRPC_P99_MS = 3.2  # the seed design's ScoreNodes p99


def grpc_available() -> tuple[bool, str]:
    try:
        from fedsched.agent.serving import grpc_service
    except ImportError as e:
        return False, f"agent/serving/grpc_service.py cannot be imported ({e})"
    missing = [n for n in ("serve_grpc", "DecisionClient") if not hasattr(grpc_service, n)]
    if missing:
        return False, f"agent/serving/grpc_service.py has no {', '.join(missing)}"
    return True, ""


def grpc_phase(grpc_port: int, wl: Workload, sizes: list[int], requests: int) -> dict[str, Any]:
    from fedsched.agent.serving.grpc_service import DecisionClient

    out: dict[str, Any] = {}
    with DecisionClient(f"127.0.0.1:{grpc_port}") as client:
        client.wait_ready(10.0)
        for n in sizes:
            bodies = wl.bodies(n, min(requests, 400))
            reqs = [(pod, json.loads(body)["NodeNames"]) for body, pod in bodies]
            lat: list[float] = []
            errors = 0
            gc.disable()
            try:
                for k in range(min(200, requests) + requests):
                    pod, names = reqs[k % len(reqs)]
                    pod = pod.replace(UID_TOKEN.encode(), f"grpc{n}-{k:09d}".encode())
                    t0 = time.perf_counter()
                    resp = client.score_nodes(pod, names, timeout=5.0)
                    dt = time.perf_counter() - t0
                    if k >= min(200, requests):
                        lat.append(dt)
                        if k % 25 == 0 and [s.node for s in resp.scores] != names:
                            errors += 1
            finally:
                gc.enable()
            out[str(n)] = {"score_nodes": timing_stats(lat), "errors": errors}
    return out
