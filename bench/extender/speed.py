"""Side-by-side speed of two extenders: the minimal Starlette + orjson LeastAllocated extender
(``bench/extender/minimal.py``) as a process pinned to one core, and the same client timing it
and ``fedsched serve`` in alternating rounds (so that another tenant's load or a frequency change
falls on both), each round a block of back-to-back prioritize requests on one keep-alive
connection; latency percentiles over all rounds, requests/s per round (median), and the ratios."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from harness.cpu import ONE_THREAD_ENV
from harness.extender_client import Endpoint
from harness.serve import get
from harness.stats import timing_stats

from extender.workload import connect, timed_requests

MINIMAL = Path(__file__).with_name("minimal.py")


@dataclass
class MinimalExtender:
    """A running ``bench/extender/minimal.py``."""

    proc: subprocess.Popen
    port: int
    json_lib: str
    prefix: str = "/scheduler"

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextlib.contextmanager
def minimal_extender(csv_path: Path, core: int, workdir: Path) -> Iterator[MinimalExtender]:
    """``taskset -c CORE python bench/extender/minimal.py --cluster-csv CSV``, until it answers."""
    log = open(workdir / "minimal.stderr.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        ["taskset", "-c", str(core), sys.executable, str(MINIMAL), "--cluster-csv", str(csv_path),
         "--port", "0"],
        stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **ONE_THREAD_ENV},
    )
    try:
        line = proc.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"minimal extender did not start: {line}"
                               f"{(workdir / 'minimal.stderr.log').read_text()[-2000:]}")
        url = line.split("listening on ")[1].split()[0]
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        ext = MinimalExtender(proc, port, line.split("json: ")[1].strip(" )\n"))
        end = time.monotonic() + 30
        while get(ext, "/healthz")[0] != 200:
            if time.monotonic() > end:
                raise RuntimeError("minimal extender never answered /healthz")
            time.sleep(0.1)
        yield ext
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        finally:
            log.close()


def side_by_side(
    servers: dict[str, Endpoint], bodies: list[tuple[bytes, bytes]], rounds: int, per_round: int,
    warmup: int = 300,
) -> dict[str, Any]:
    """Alternating rounds of ``per_round`` prioritize requests on each server (one connection
    each, kept open); per server: latency over every round, requests/s per round, errors."""
    conns = {name: connect(ep) for name, ep in servers.items()}
    lat: dict[str, list[float]] = {name: [] for name in servers}
    rates: dict[str, list[float]] = {name: [] for name in servers}
    errors = dict.fromkeys(servers, 0)
    for name, c in conns.items():
        timed_requests(c, "prioritize", bodies, warmup, f"warm-{name}")
    order = list(servers)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            got, e = timed_requests(conns[name], "prioritize", bodies, per_round, f"sbs{r}-{name}")
            rates[name].append(per_round / (time.perf_counter() - t0))
            lat[name] += got
            errors[name] += e
    for c in conns.values():
        c.close()
    return {
        name: {"latency": timing_stats(lat[name]), "requests_per_s": float(np.median(rates[name])),
               "requests_per_s_rounds": [round(x, 1) for x in rates[name]], "errors": errors[name]}
        for name in servers
    }


def ratios(res: dict[str, Any], ours: str, ref: str) -> dict[str, float]:
    """ours / ref for the median and p99 latency, and the throughput share (ours / ref)."""
    a, b = res[ours], res[ref]
    return {
        "p50_ratio": a["latency"]["p50_ms"] / b["latency"]["p50_ms"],
        "p99_ratio": a["latency"]["p99_ms"] / b["latency"]["p99_ms"],
        "throughput_share": a["requests_per_s"] / b["requests_per_s"],
    }
