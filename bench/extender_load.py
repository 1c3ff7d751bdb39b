"""End-to-end load on the scheduler extender: `fedsched serve` on one core, the client on another.

The agent runs as kube-scheduler would meet it: ``fedsched serve --policy learned --cluster-csv
NODES.csv --insecure`` in its own process, pinned to one core (``taskset -c 0``, one BLAS/OpenMP
thread), the shipped policy and a 2,000-node GPU cluster (the 1,213 openb GPU nodes plus 787 of
them again under new names). This process is the scheduler stand-in, pinned to another core: it
talks HTTP/1.1 keep-alive (``http.client``, Nagle off) with ``nodeCacheCapable`` requests
(``NodeNames`` only) and openb pods (GPU-sharing, whole-GPU and CPU pods, ``pod_to_json``).

Before measuring, it fills the cluster to ``--fill`` of its GPUs (default 60%) through the
extender itself, as a scheduler would: prioritize over up to 500 nodes where the pod fits, bind
(the bind verb) to the best-scored one. It keeps a mirror of the allocation (the same GPU rule as
the server) so that the candidates it sends are nodes where the pod fits, as kube-scheduler's
own filters would leave them; a pod that fits on fewer nodes than the candidate count gets
non-fitting nodes too (the share is reported).

Phases (goals from the agent issue; PASS/MISS printed):

1. latency: prioritize (and filter) over 100, 500, 2,000 candidates, one connection, requests
   back to back, each pod once (unique UIDs); p50/p99/p99.9/mean as the client sees them. Goal:
   prioritize p99 <= 2 ms at 500 nodes.
2. throughput: decisions/s at 500 nodes, back to back over 1 and 2 connections. Goal: >= 1000/s.
   The agent runs the policy on one worker: concurrent requests wait for it within their budget
   or get the kube-default answer (fallback ``busy``); the share of fallbacks is reported.
3. gRPC ``ScoreNodes`` p50/p99 at the same sizes when ``agent/grpc_service.py`` provides
   ``serve_grpc`` and ``DecisionClient`` (server started with ``--grpc-port``); compared with
   the seed design's 3.2 ms p99.
4. fuzz: ``--fuzz`` (10,000) malformed requests (broken JSON, wrong types, random node names,
   huge/negative quantities, missing fields, random methods/verbs/paths, truncated bodies, bad
   Content-Length, garbage request lines, bind/preempt junk, Node objects the agent cannot
   hold). Goal: no 5xx, no internal error, and the server answers /healthz (and a correct
   prioritize) afterwards. Node objects in fuzzed ``Nodes`` lists are either known nodes or
   invalid, so the fuzzing does not change the cluster the soak runs on.
5. soak: ``--soak-minutes`` (10; ``--quick``: 1) of back-to-back filter + prioritize pairs at
   500 nodes and a /metrics scrape every 15 s; the server's RSS (/proc/PID/status VmRSS) sampled
   every few seconds. Goal: memory flat, a linear-fit slope under 1 MB/min over the second half.
   The soak cycles through 5,000 pod UIDs: in the cluster mode the agent keeps nothing per pod
   between requests, while the local mode's bind verb keeps every unbound pod object until its
   bind (up to 100,000, about 3.3 KB each), which is bounded by design and would hide a leak;
   ``--soak-unique-uids`` measures that instead.
6. forced fallback: the server restarted with ``--budget-ms 0.05`` (the policy always misses its
   budget), refilled, prioritize at 500 nodes. Goal: p99 within the default 10 ms budget, and
   the fallbacks counted in /metrics (``fedsched_fallbacks_total{reason="timeout"|"busy"}``).

    python bench/extender_load.py [--quick] [--soak-minutes M] [--json OUT.json]

The figures are wall-clock times on whatever machine runs this: on a shared machine other
tenants' load shows in the tails. The JSON records the machine, the load average and the commit.
"""

from __future__ import annotations

import argparse
import csv
import gc
import http.client
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from fedsched.agent.cluster.k8s_objects import (
    GPU_COUNT_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    GPU_RESOURCE,
    pod_to_json,
)
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.cluster import ClusterState, NodeTable, Pod, PodTable
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods

PREFIX = "/scheduler"
UID_TOKEN = "@@UID@@"  # replaced in a prebuilt body by each request's pod UID (same length not needed)
HEADERS = {"Content-Type": "application/json"}
SEED_GRPC_P99_MS = 3.2  # the seed design's ScoreNodes p99
GOAL_P99_MS = 2.0
GOAL_RATE = 1000.0
GOAL_FALLBACK_P99_MS = 10.0
GOAL_SOAK_MB_PER_MIN = 1.0
CAVEAT = (
    "Shared, noisy 2-core VM (no GPU): server pinned to one core, client to the other; other "
    "tenants' load shows in the tails. Quote ratios and orders of magnitude, not the last digit."
)


# ---- the cluster ------------------------------------------------------------------------------


def write_nodes_csv(path: Path, n: int, seed: int) -> None:
    """The openb GPU nodes, plus copies of randomly chosen ones under new names, up to ``n``."""
    src = builtin_trace("openb_node_list_gpu_node.csv")
    with open(src, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], [r for r in rows[1:] if r]
    sn = header.index("sn")
    rng = np.random.default_rng(seed)
    out = list(body[:n])
    if n > len(body):
        for k, i in enumerate(rng.choice(len(body), n - len(body), replace=n - len(body) > len(body))):
            row = list(body[int(i)])
            row[sn] = f"{row[sn]}-copy{k}"
            out.append(row)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(out)


class Mirror:
    """The client's copy of the server's allocation (binds only), with the server's GPU rule."""

    def __init__(self, nodes: NodeTable, select_gpus: Callable[[ClusterState, Pod, int], tuple[int, ...]]):
        self.nodes = nodes
        self.state = ClusterState(nodes)
        self.select_gpus = select_gpus
        self.index = {n: i for i, n in enumerate(nodes.names)}

    def bind(self, pod: Pod, node: str) -> None:
        i = self.index[node]
        self.state.allocate(i, pod, self.select_gpus(self.state, pod, i))

    def allocation(self) -> dict[str, float]:
        s, t = self.state, self.nodes
        return {
            "gpu": 1.0 - float(s.gpu_free.sum()) / max(t.total_gpu_milli, 1),
            "cpu": float(s.cpu_req.sum()) / float(t.cpu.sum()),
            "mem": float(s.mem_req.sum()) / float(t.mem.sum()),
        }

    def candidates(self, pod: Pod, n: int, rng: np.random.Generator, fitting_only: bool = False) -> list[str]:
        fit = np.flatnonzero(self.state.feasible(pod))
        if len(fit) >= n:
            pick = rng.choice(fit, n, replace=False)
        elif fitting_only:
            pick = rng.permutation(fit)
        else:
            rest = np.setdiff1d(np.arange(len(self.nodes)), fit)
            pick = rng.permutation(np.concatenate([fit, rng.choice(rest, n - len(fit), replace=False)]))
        return [self.nodes.names[int(i)] for i in pick]

    def fits(self, pod: Pod, names: list[str]) -> int:
        ok = self.state.feasible(pod)
        return int(sum(ok[self.index[n]] for n in names))


# ---- the server -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def grpc_available() -> tuple[bool, str]:
    try:
        from fedsched.agent.serving import grpc_service
    except ImportError as e:
        return False, f"agent/grpc_service.py cannot be imported ({e})"
    missing = [n for n in ("serve_grpc", "DecisionClient") if not hasattr(grpc_service, n)]
    if missing:
        return False, f"agent/grpc_service.py has no {', '.join(missing)}"
    return True, ""


class Server:
    """``fedsched serve`` in a subprocess pinned to one core."""

    def __init__(
        self, csv_path: Path, policy: str, core: int, workdir: Path, budget_ms: float | None = None,
        grpc: bool = False, name: str = "server",
    ) -> None:
        self.port = free_port()
        self.grpc_port = free_port() if grpc else None
        cmd = [
            "taskset", "-c", str(core), sys.executable, "-m", "fedsched.common.cli.main", "serve",
            "--policy", policy, "--cluster-csv", str(csv_path), "--insecure", "--host", "127.0.0.1",
            "--port", str(self.port), "--log-level", "warning",
        ]
        if budget_ms is not None:
            cmd += ["--budget-ms", str(budget_ms)]
        if self.grpc_port is not None:
            cmd += ["--grpc-port", str(self.grpc_port)]
        env = dict(os.environ)
        for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
            env[k] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        self.stderr_path = workdir / f"{name}.stderr.log"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 (closed in stop)
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env)
        self._wait_listening(120.0)
        self._wait_ready(60.0)

    def _wait_listening(self, timeout: float) -> None:
        lines: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.append(line)
                if "listening on" in line:
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if not any("listening on" in x for x in lines):
            self.stop()
            raise RuntimeError(
                f"fedsched serve did not start: {''.join(lines)}{self.stderr_path.read_text()[-2000:]}"
            )

    def _wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if get(self.port, "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("fedsched serve never became ready")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS")

    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(self.proc.pid))

    def internal_error_lines(self) -> list[str]:
        text = self.stderr_path.read_text(errors="replace")
        return [x for x in text.splitlines() if "internal error" in x]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stderr.close()


# ---- HTTP -------------------------------------------------------------------------------------


class Conn:
    """One keep-alive connection, as kube-scheduler's extender client keeps them."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.port = port
        self.timeout = timeout
        self.c = self._open()

    def _open(self) -> http.client.HTTPConnection:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        c.connect()
        assert c.sock is not None
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self.c.sock is None:  # the server closed it after an error answer
            self.c = self._open()
        self.c.request(method, path, body, HEADERS)
        r = self.c.getresponse()
        return r.status, r.read()

    def post(self, verb: str, body: bytes) -> tuple[int, bytes]:
        return self.request("POST", f"{PREFIX}/{verb}", body)

    def close(self) -> None:
        self.c.close()


def get(port: int, path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


Scrape = dict[str, dict[str, float]]


def scrape(port: int) -> Scrape:
    """fallbacks by reason, decisions by source, requests by verb/code, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, data = get(port, "/metrics")
    assert status == 200
    out: Scrape = {"fallbacks": {}, "decisions": {}, "requests": {}, "server_seconds": {}}
    for fam in text_string_to_metric_families(data.decode()):
        for s in fam.samples:
            if s.name == "fedsched_fallbacks_total":
                key, which = s.labels["reason"], "fallbacks"
            elif s.name == "fedsched_decisions_total":
                key, which = s.labels["source"], "decisions"
            elif s.name == "fedsched_requests_total":
                key, which = f"{s.labels['verb']}:{s.labels['code']}", "requests"
            elif s.name in ("fedsched_decision_seconds_sum", "fedsched_decision_seconds_count"):
                key, which = f"{s.labels['verb']}:{s.name.rsplit('_', 1)[1]}", "server_seconds"
            else:
                continue
            out[which][key] = out[which].get(key, 0.0) + s.value
    return out


def cache_nodes(port: int) -> int:
    """fedsched_cache_nodes: the nodes the agent knows."""
    for line in get(port, "/metrics")[1].decode().splitlines():
        if line.startswith("fedsched_cache_nodes "):
            return int(float(line.split()[1]))
    raise RuntimeError("no fedsched_cache_nodes in /metrics")


def diff(after: Scrape, before: Scrape) -> dict[str, dict[str, int]]:
    return {
        k: {x: int(v - before[k].get(x, 0.0)) for x, v in after[k].items() if v - before[k].get(x, 0.0)}
        for k in after
        if k != "server_seconds"
    }


def server_mean_ms(after: Scrape, before: Scrape, verb: str) -> float:
    """Mean time the server itself took (fedsched_decision_seconds: from reading the request
    line to writing the answer), over the requests between two scrapes."""
    a, b = after["server_seconds"], before["server_seconds"]
    n = a.get(f"{verb}:count", 0.0) - b.get(f"{verb}:count", 0.0)
    return 1e3 * (a.get(f"{verb}:sum", 0.0) - b.get(f"{verb}:sum", 0.0)) / n if n else float("nan")


# ---- requests ---------------------------------------------------------------------------------


@dataclass
class Workload:
    nodes: NodeTable
    pods: PodTable
    mirror: Mirror
    rng: np.random.Generator
    counter: int = 0
    fit_share: list[float] = field(default_factory=list)

    def uid(self, tag: str) -> str:
        self.counter += 1
        return f"{tag}-{self.counter:09d}"

    def random_pod(self) -> Pod:
        while True:
            pod = Pod.from_table(self.pods, int(self.rng.integers(len(self.pods))))
            if self.mirror.state.feasible(pod).any():  # kube-scheduler would not call us otherwise
                return pod

    def bodies(self, n_nodes: int, count: int) -> list[tuple[bytes, bytes]]:
        """(prioritize/filter body with a UID placeholder, the same for the gRPC pod JSON)."""
        out = []
        for _ in range(count):
            pod = self.random_pod()
            names = self.mirror.candidates(pod, n_nodes, self.rng)
            self.fit_share.append(self.mirror.fits(pod, names) / len(names))
            obj = pod_to_json(pod, f"bench-{pod.index}", self.nodes.models, uid=UID_TOKEN)
            out.append((json.dumps({"Pod": obj, "NodeNames": names}).encode(), json.dumps(obj).encode()))
        return out


def stats(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples) * 1e3
    return {
        "n": len(a),
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "p999_ms": float(np.percentile(a, 99.9)),
        "max_ms": float(a.max()),
        "mean_ms": float(a.mean()),
    }


def timed_requests(
    conn: Conn, verb: str, bodies: list[tuple[bytes, bytes]], count: int, tag: str, check_every: int = 25
) -> tuple[list[float], int]:
    """``count`` requests back to back (bodies cycled, each with a fresh UID); (latencies, errors)."""
    lat: list[float] = []
    errors = 0
    gc.disable()  # the client's own collections would show up as server latency
    try:
        for k in range(count):
            body, _ = bodies[k % len(bodies)]
            raw = body.replace(UID_TOKEN.encode(), f"{tag}-{k:09d}".encode())
            t0 = time.perf_counter()
            status, data = conn.post(verb, raw)
            lat.append(time.perf_counter() - t0)
            if status != 200:
                errors += 1
            elif k % check_every == 0:
                errors += not _valid(verb, raw, data)
    finally:
        gc.enable()
    return lat, errors


def _valid(verb: str, body: bytes, data: bytes) -> bool:
    names = json.loads(body)["NodeNames"]
    out = json.loads(data)
    if verb == "prioritize":
        return [h["Host"] for h in out] == names and all(0 <= h["Score"] <= 10 for h in out)
    return set(out["NodeNames"] or []) | set(out["FailedNodes"]) == set(names)


# ---- phases -----------------------------------------------------------------------------------


def prefill(conn: Conn, wl: Workload, fill: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Fill the cluster to ``fill`` of its GPUs through prioritize + bind, as a scheduler would."""
    t0 = time.perf_counter()
    bound = failed = unschedulable = 0
    order = wl.rng.permutation(len(wl.pods))
    k = 0
    while wl.mirror.allocation()["gpu"] < fill:
        pod = Pod.from_table(wl.pods, int(order[k % len(order)]))
        k += 1
        names = wl.mirror.candidates(pod, 500, wl.rng, fitting_only=True)
        if not names:
            unschedulable += 1
            if unschedulable > 20 * len(wl.pods):
                break
            continue
        uid = wl.uid("fill")
        obj = pod_to_json(pod, f"fill-{k}", wl.nodes.models, uid=uid)
        status, data = conn.post("prioritize", json.dumps({"Pod": obj, "NodeNames": names}).encode())
        if status != 200:
            failed += 1
            continue
        scores = json.loads(data)
        best = max(scores, key=lambda h: h["Score"])["Host"]
        bind = {"PodName": obj["metadata"]["name"], "PodNamespace": "default", "PodUID": uid, "Node": best}
        status, data = conn.post("bind", json.dumps(bind).encode())
        if status == 200 and json.loads(data)["Error"] == "":
            wl.mirror.bind(pod, best)
            bound += 1
        else:
            failed += 1
        if bound and bound % 2000 == 0:
            log(f"  prefill: {bound} pods bound, GPU allocation {wl.mirror.allocation()['gpu']:.1%}")
    return {
        "pods_bound": bound,
        "bind_failures": failed,
        "pods_fitting_nowhere_skipped": unschedulable,
        "allocation": wl.mirror.allocation(),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def latency_phase(port: int, wl: Workload, sizes: list[int], requests: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conn = Conn(port)
    for n in sizes:
        wl.fit_share.clear()
        bodies = wl.bodies(n, min(requests, 400))
        before = scrape(port)
        timed_requests(conn, "prioritize", bodies, min(200, requests), f"warm{n}")
        after_warm = scrape(port)
        lat, errors = timed_requests(conn, "prioritize", bodies, requests, f"lat{n}")
        flat, ferrors = timed_requests(conn, "filter", bodies, max(requests // 2, 1), f"flt{n}")
        after = scrape(port)
        out[str(n)] = {
            "prioritize": stats(lat),
            "filter": stats(flat),
            "server_mean_ms": {v: server_mean_ms(after, after_warm, v) for v in ("prioritize", "filter")},
            "errors": errors + ferrors,
            "fitting_candidate_share": float(np.mean(wl.fit_share)),
            "metrics_delta": diff(after, before),
        }
    conn.close()
    return out


def throughput_phase(port: int, wl: Workload, n_nodes: int, seconds: float, conns: int) -> dict[str, Any]:
    bodies = wl.bodies(n_nodes, 300)
    before = scrape(port)
    stop = time.perf_counter() + seconds
    results: list[tuple[list[float], int]] = [([], 0)] * conns

    def run(j: int) -> None:
        c = Conn(port)
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
    d = diff(scrape(port), before)
    decisions = sum(d["decisions"].values())
    return {
        "connections": conns,
        "seconds": round(elapsed, 2),
        "requests": len(lat),
        "decisions_per_s": len(lat) / elapsed,
        "latency": stats(lat),
        "errors": sum(r[1] for r in results),
        "fallback_share": sum(d["fallbacks"].values()) / max(decisions, 1),
        "metrics_delta": d,
    }


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
            out[str(n)] = {"score_nodes": stats(lat), "errors": errors}
    return out


# ---- fuzz -------------------------------------------------------------------------------------

BAD_QUANTITIES: list[Any] = [
    "-1", "1e309", "1e18", "99999999999999Ei", "-0", "0.0000001", "NaN", "Infinity", "1.5", "abc", "",
    " 4", "0x10", "1e-400", 1e308, -5, 3.7, True, None, [], {}, "9" * 400, "12345678901234567890",
]
# Node quantities the agent must refuse (a fuzzed node under a new name is never learned).
NODE_BAD_QUANTITIES: list[Any] = [
    "-1", "NaN", "Infinity", "abc", "", "0x10", "1e309", "9" * 400, "1e30", True, None, [], {}, -5, 1e308,
]
BAD_ANNOTATIONS: list[Any] = ["0", "5000", "-3", "abc", "1.5", "", 7, None, "1000", "65", "999"]
GARBAGE_JSON = [
    b"{", b"}", b"[", b"{\"Pod\": }", b"NaN", b"Infinity", b"-Infinity", b"{'Pod': 1}", b"\xff\xfe\x00",
    b"[" * 5000, b"{\"a\":" * 3000, b"nul", b"tru", b"\"unterminated", b"{\"Pod\": {\"spec\": {}}, }",
    b"\x00" * 64, "\u2028{}".encode(), b"{\"Pod\": {\"spec\": {\"containers\": [{]}}}",
]


class Fuzzer:
    """Requests a scheduler should never send, and what the server answered to them."""

    def __init__(self, port: int, wl: Workload, seed: int) -> None:
        self.port = port
        self.wl = wl
        self.r = random.Random(seed)
        self.known = list(wl.nodes.names)
        self.conn = Conn(port, timeout=10.0)
        self.statuses: dict[str, Counter] = {}
        self.examples_5xx: list[dict[str, Any]] = []

    # a valid request to corrupt
    def valid(self) -> dict[str, Any]:
        pod = self.wl.random_pod()
        names = self.r.sample(self.known, self.r.choice([0, 1, 5, 50]))
        obj = pod_to_json(pod, "fuzz", self.wl.nodes.models, uid=f"fuzz-{self.r.getrandbits(64):x}")
        return {"Pod": obj, "NodeNames": names}

    def junk(self, depth: int = 0) -> Any:
        kind = self.r.randrange(8 if depth < 3 else 5)
        if kind == 0:
            return None
        if kind == 1:
            return self.r.choice([True, False])
        if kind == 2:
            return self.r.choice([0, -1, 2**63, -(2**70), 1.5, -1e300, 10**30])
        if kind == 3:
            return "".join(chr(self.r.randrange(1, 0x3000)) for _ in range(self.r.randrange(12)))
        if kind == 4:
            return self.r.choice(["", "Pod", "cpu", "x" * 10000, "\u0000", "null"])
        if kind == 5:
            return [self.junk(depth + 1) for _ in range(self.r.randrange(4))]
        return {str(self.junk(depth + 1))[:20]: self.junk(depth + 1) for _ in range(self.r.randrange(4))}

    def _containers(self, body: dict) -> list[dict]:
        return body["Pod"]["spec"]["containers"]

    def case(self) -> tuple[str, str, str, bytes | None, dict[str, str] | None]:
        """(category, method, path, body, raw headers or None for a normal request)."""
        cat = self.r.choice(
            ["malformed_json", "wrong_types", "random_names", "quantities", "missing_fields",
             "verbs_paths", "truncated", "bind", "preempt", "full_nodes", "protocol"]
        )
        verb = self.r.choice(["filter", "prioritize"])
        path = f"{PREFIX}/{verb}"
        b = self.valid()
        if cat == "malformed_json":
            choice = self.r.randrange(3)
            if choice == 0:
                raw = self.r.choice(GARBAGE_JSON)
            elif choice == 1:
                raw = bytes(self.r.getrandbits(8) for _ in range(self.r.randrange(1, 300)))
            else:
                raw = json.dumps(b).encode().replace(b'"', b"'", 1 + self.r.randrange(5))
            return cat, "POST", path, raw, None
        if cat == "wrong_types":
            target = self.r.choice(["Pod", "NodeNames", "Nodes", "metadata", "spec", "containers",
                                    "resources", "requests", "annotations", "items", "name"])
            if target in ("Pod", "NodeNames", "Nodes"):
                b[target] = self.r.choice([self.junk(), "node-a", 1, [1, 2], {"items": 3}, [None]])
            elif target == "items":
                b["Nodes"] = {"items": self.r.choice([{}, "x", [1], [[]], [{"metadata": 5}]])}
                b.pop("NodeNames")
            elif target in ("metadata", "spec"):
                b["Pod"][target] = self.r.choice([self.junk(), "x", [], 3])
            elif target == "containers":
                b["Pod"]["spec"]["containers"] = self.r.choice([self.junk(), {}, "c", [1], [None]])
            elif target == "resources":
                self._containers(b)[0]["resources"] = self.r.choice([self.junk(), [], "r"])
            elif target == "requests":
                self._containers(b)[0]["resources"]["requests"] = self.r.choice([self.junk(), [], 7])
            elif target == "annotations":
                b["Pod"]["metadata"]["annotations"] = self.r.choice([self.junk(), [], "a"])
            else:
                b["NodeNames"] = [self.junk() for _ in range(3)]
            return cat, "POST", path, json.dumps(b).encode(), None
        if cat == "random_names":
            gen = self.r.randrange(4)
            if gen == 0:
                names = [str(self.junk()) for _ in range(self.r.randrange(1, 50))]
            elif gen == 1:
                names = ["", "x" * 100_000, "\u0000", "../../etc/passwd", "a" * 253]
            elif gen == 2:
                names = self.r.sample(self.known, 30) + [f"ghost-{i}" for i in range(30)]
            else:
                names = self.r.sample(self.known, 10) * 2  # duplicates
            b["NodeNames"] = list(dict.fromkeys(names)) if self.r.random() < 0.5 else names
            return cat, "POST", path, json.dumps(b).encode(), None
        if cat == "quantities":
            c = self._containers(b)[0]
            req = c["resources"].setdefault("requests", {})
            res = self.r.choice(["cpu", "memory", GPU_RESOURCE, "ephemeral-storage"])
            req[res] = self.r.choice(BAD_QUANTITIES)
            if self.r.random() < 0.4:
                ann = b["Pod"]["metadata"]["annotations"]
                ann[self.r.choice([GPU_MILLI_ANNOTATION, GPU_COUNT_ANNOTATION, GPU_MODEL_ANNOTATION])] = (
                    self.r.choice(BAD_ANNOTATIONS)
                )
            if self.r.random() < 0.3:
                b["Pod"]["spec"]["overhead"] = {"cpu": self.r.choice(BAD_QUANTITIES)}
            return cat, "POST", path, json.dumps(b, allow_nan=False, default=str).encode(), None
        if cat == "missing_fields":
            drop = self.r.choice(["Pod", "NodeNames", "metadata", "spec", "containers", "resources", "all"])
            if drop == "all":
                b = {}
            elif drop in ("Pod", "NodeNames"):
                b.pop(drop)
            elif drop in ("metadata", "spec"):
                b["Pod"].pop(drop)
            elif drop == "containers":
                b["Pod"]["spec"].pop("containers")
            else:
                self._containers(b)[0].pop("resources")
            return cat, "POST", path, json.dumps(b).encode(), None
        if cat == "verbs_paths":
            method = self.r.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE"])
            p = self.r.choice([
                f"{PREFIX}/{self.r.choice(['filterx', 'Filter', 'PRIORITIZE', '', 'bind/', 'x' * 3000])}",
                "/", "//scheduler/filter", f"{PREFIX}/filter/extra", f"{PREFIX}/filter?x=1&y=%00",
                f"{PREFIX}%2Ffilter", "/scheduler/../scheduler/filter", "/metrics", "/healthz", "/readyz",
                "/openapi.json", "/admin", f"{PREFIX}/reload", f"{PREFIX}/preempt#frag",
            ])
            body = json.dumps(b).encode() if method not in ("GET", "HEAD") or self.r.random() < 0.3 else None
            return cat, method, p, body, None
        if cat == "truncated":
            raw = json.dumps(b).encode()
            cut = self.r.randrange(len(raw))
            if self.r.random() < 0.5:  # honest Content-Length of a cut body
                return cat, "POST", path, raw[:cut], None
            # announces the whole body, sends part of it, then half-closes
            return cat, "POST", path, raw[:cut], {"Content-Length": str(len(raw))}
        if cat == "bind":
            bind: dict[str, Any] = {"PodName": "p", "PodNamespace": "default",
                                    "PodUID": self.r.choice(["never-seen", "", b["Pod"]["metadata"]["uid"]]),
                                    "Node": self.r.choice([*self.r.sample(self.known, 2), "ghost", ""])}
            for k in self.r.sample(list(bind), self.r.randrange(3)):
                if self.r.random() < 0.5:
                    bind.pop(k)
                else:
                    bind[k] = self.junk()
            body = bind if self.r.random() < 0.9 else self.junk()
            return cat, "POST", f"{PREFIX}/bind", json.dumps(body).encode(), None
        if cat == "preempt":
            victims = {
                str(self.junk())[:10]: self.r.choice([
                    self.junk(), {"Pods": self.junk()}, {"Pods": [self.junk()]},
                    {"Pods": [{"metadata": self.junk()}], "NumPDBViolations": self.junk()},
                ]) for _ in range(self.r.randrange(3))
            }
            key = self.r.choice(["NodeNameToVictims", "NodeNameToMetaVictims"])
            body = {"Pod": b["Pod"], key: self.r.choice([victims, self.junk()])}
            return cat, "POST", f"{PREFIX}/preempt", json.dumps(body).encode(), None
        if cat == "full_nodes":
            items = []
            for _ in range(self.r.randrange(1, 4)):
                name = self.r.choice(self.known) if self.r.random() < 0.5 else f"fuzz-node-{self.r.random()}"
                alloc: dict[str, Any] = {"cpu": "32", "memory": "64Gi"}
                # a new name always carries something the agent must refuse (the cluster stays as it is)
                bad = self.r.choice(["cpu", "memory", GPU_RESOURCE, "gpus9", "huge", "meta"])
                if bad == "gpus9":
                    alloc[GPU_RESOURCE] = str(self.r.choice([9, 16, 64]))
                elif bad == "huge":
                    alloc["cpu"] = self.r.choice(["1e18", "1e30", "9" * 30])
                elif bad != "meta":
                    alloc[bad] = self.r.choice(NODE_BAD_QUANTITIES)
                meta: Any = {"name": name} if bad != "meta" else self.r.choice([{"name": 5}, {}, "n"])
                items.append({"metadata": meta, "status": {"allocatable": alloc}})
            b.pop("NodeNames")
            b["Nodes"] = {"metadata": {}, "items": items}
            return cat, "POST", path, json.dumps(b, default=str).encode(), None
        # protocol: raw request heads
        raw = json.dumps(b).encode()
        kind = self.r.choice(["no_length", "bad_length", "negative_length", "huge_length", "chunked",
                              "garbage_line", "long_header", "many_headers", "http10", "bad_version"])
        heads = {
            "no_length": {"Content-Length": None},
            "bad_length": {"Content-Length": self.r.choice(["abc", "1.5", "", "0x10", "١٢"])},
            "negative_length": {"Content-Length": "-5"},
            "huge_length": {"Content-Length": str(10**12)},
            "chunked": {"Content-Length": None, "Transfer-Encoding": "chunked"},
        }
        if kind in heads:
            return cat, "POST", path, raw, heads[kind]
        return cat, kind, path, raw, {}

    def send(self, method: str, path: str, body: bytes | None, head: dict[str, str | None] | None) -> int:
        """The status, or -1 when the server closed the connection without answering."""
        if head is None:
            try:
                return self.conn.request(method, path, body)[0]
            except (http.client.HTTPException, ConnectionError, TimeoutError):
                self.conn.close()
                self.conn = Conn(self.port, timeout=10.0)
                return -1
        return self._raw(method, path, body or b"", head)

    def _raw(self, method: str, path: str, body: bytes, head: dict[str, str | None]) -> int:
        """A request written by hand on a fresh connection; the write side half-closed after it."""
        if method == "garbage_line":
            req = self.r.choice([b"\x00\x01\x02\r\n\r\n", b"GET\r\n\r\n", b"POST /scheduler/filter\r\n\r\n",
                                 b"FOO BAR BAZ QUX\r\n\r\n", b"G" * 70000 + b"\r\n\r\n"])
        elif method == "long_header":
            req = f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Long: {'a' * 70000}\r\n\r\n".encode()
        elif method == "many_headers":
            hs = "".join(f"X-H{i}: {i}\r\n" for i in range(150))
            head_ = f"POST {path} HTTP/1.1\r\nHost: x\r\n{hs}Content-Length: {len(body)}\r\n\r\n"
            req = head_.encode() + body
        elif method == "http10":
            req = f"POST {path} HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        elif method == "bad_version":
            v = self.r.choice(["HTTP/1.x", "HTTP/abc", "HTTPS/1.1", "HTTP/1.1.1", "http/1.1"])
            req = f"POST {path} {v}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        else:
            hdrs = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body))}
            hdrs.update(head)
            lines = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items() if v is not None)
            req = f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode() + body
        return raw_exchange(self.port, req)

    def run(self, count: int) -> dict[str, Any]:
        before = scrape(self.port)
        nodes_before = cache_nodes(self.port)
        t0 = time.perf_counter()
        for _ in range(count):
            cat, method, path, body, head = self.case()
            status = self.send(method, path, body, head)
            self.statuses.setdefault(cat, Counter())[str(status)] += 1
            if status >= 500 and len(self.examples_5xx) < 10:
                self.examples_5xx.append({"category": cat, "method": method, "path": path[:200],
                                          "body": (body or b"")[:300].decode(errors="replace"),
                                          "status": status})
        elapsed = time.perf_counter() - t0
        self.conn.close()
        d = diff(scrape(self.port), before)
        total: Counter = Counter()
        for c in self.statuses.values():
            total.update(c)
        fivexx = sum(v for k, v in total.items() if int(k) >= 500)
        health = get(self.port, "/healthz")[0]
        # and a correct answer afterwards
        valid = self.valid()
        valid["NodeNames"] = self.r.sample(self.known, 100)
        c = Conn(self.port)
        st, data = c.post("prioritize", json.dumps(valid).encode())
        c.close()
        correct = st == 200 and [h["Host"] for h in json.loads(data)] == valid["NodeNames"]
        return {
            "requests": count,
            "seconds": round(elapsed, 1),
            "statuses": dict(sorted(total.items())),
            "by_category": {k: dict(sorted(v.items())) for k, v in sorted(self.statuses.items())},
            "5xx": fivexx,
            "no_response": total.get("-1", 0),
            "answered_without_status_line": total.get("0", 0),
            "internal_errors": d["fallbacks"].get("internal", 0),
            "healthz_after": health,
            "cluster_nodes_before_after": [nodes_before, cache_nodes(self.port)],
            "prioritize_correct_after": correct,
            "examples_5xx": self.examples_5xx,
        }


def raw_exchange(port: int, req: bytes, timeout: float = 10.0) -> int:
    """Send ``req`` on a fresh connection, half-close, read to EOF: the first answer's status; 0
    when the answer has no status line (the stdlib's error page for a request line it cannot
    parse is written HTTP/0.9-style, body only); -1 when the server closed without answering."""
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(req)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before reading everything
            pass
        try:
            while data := s.recv(65536):
                chunks.append(data)
        except (ConnectionError, TimeoutError):
            pass
    data = b"".join(chunks)
    if not data:
        return -1
    if data.startswith(b"HTTP/1.") and len(data.split(b" ", 2)) > 1 and data.split(b" ", 2)[1].isdigit():
        return int(data.split(b" ", 2)[1])
    return 0


def probe_http2_request_line(port: int) -> int:
    """An HTTP/2.0 request line: the stdlib answers 505 (HTTP Version Not Supported)."""
    return raw_exchange(port, f"POST {PREFIX}/filter HTTP/2.0\r\nContent-Length: 2\r\n\r\n{{}}".encode())


# ---- soak -------------------------------------------------------------------------------------


def soak_phase(server: Server, wl: Workload, minutes: float, sample_s: float, unique: bool,
               log: Callable[[str], None]) -> dict[str, Any]:
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
            get(server.port, "/metrics")

    threads = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=scraper, daemon=True)]
    for t in threads:
        t.start()
    before = scrape(server.port)
    conn = Conn(server.port)
    pairs, errors, k = 0, 0, 0
    minute_lat: list[float] = []
    next_minute = t_start + 60.0
    gc.disable()
    try:
        while time.perf_counter() < end:
            body, _ = bodies[k % len(bodies)]
            uid = f"soak-{k:09d}" if unique else f"soak-{k % 5000:09d}"
            raw = body.replace(UID_TOKEN.encode(), uid.encode())
            s1, _ = conn.post("filter", raw)
            t0 = time.perf_counter()
            s2, _ = conn.post("prioritize", raw)
            minute_lat.append(time.perf_counter() - t0)
            errors += (s1 != 200) + (s2 != 200)
            pairs += 1
            k += 1
            now = time.perf_counter()
            if now >= next_minute:
                gc.collect()
                per_minute.append({"minute": len(per_minute) + 1, "pairs": len(minute_lat),
                                   "prioritize": stats(minute_lat), "rss_mb": rss[-1][1]})
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
        "metrics_delta": diff(scrape(server.port), before),
    }


# ---- main -------------------------------------------------------------------------------------


class CpuMeter:
    """Who used the machine during a phase: the server, this client, and everyone else (other
    tenants of a shared machine: their share is what to judge the tails by)."""

    def __init__(self) -> None:
        self.tick = float(os.sysconf("SC_CLK_TCK"))
        self.pid = os.getpid()
        self._start: tuple[float, float, float, float] | None = None

    def _busy(self) -> float:
        vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return (sum(vals) - vals[3] - vals[4]) / self.tick  # all but idle and iowait

    def _proc(self, pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def start(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self._start = (time.monotonic(), self._busy(), self._proc(server_pid), self._proc(self.pid))

    def take(self) -> dict[str, float]:
        """Cores used on average since start (and start again)."""
        assert self._start is not None
        t0, b0, s0, c0 = self._start
        t, b, sv, c = time.monotonic(), self._busy(), self._proc(self.server_pid), self._proc(self.pid)
        wall = max(t - t0, 1e-9)
        self._start = (t, b, sv, c)
        return {
            "wall_s": round(wall, 1),
            "server_cores": round((sv - s0) / wall, 3),
            "client_cores": round((c - c0) / wall, 3),
            "other_cores": round(max(b - b0 - (sv - s0) - (c - c0), 0.0) / wall, 3),
        }



def git_commit() -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": sha, "dirty": bool(dirty), "dirty_files": dirty.splitlines()}


def machine() -> dict[str, Any]:
    cpu = next((x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith("model name")), platform.processor())
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_start": list(os.getloadavg())}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", dest="json_out", help="write every figure here")
    ap.add_argument("--quick", action="store_true", help="fewer requests, a 1-minute soak")
    ap.add_argument("--policy", default="learned")
    ap.add_argument("--nodes", type=int, default=2000, help="cluster size")
    ap.add_argument("--sizes", default="100,500,2000", help="candidate counts")
    ap.add_argument("--requests", type=int, help="timed requests per size (default 3000, quick 600)")
    ap.add_argument("--throughput-seconds", type=float, help="per connection count (default 20, quick 5)")
    ap.add_argument("--fuzz", type=int, default=10_000, help="fuzzed requests")
    ap.add_argument("--soak-minutes", type=float, help="default 10 (quick: 1)")
    ap.add_argument("--soak-unique-uids", action="store_true", help="a new pod UID per soak pod")
    ap.add_argument("--fill", type=float, default=0.6, help="GPU allocation to reach before measuring")
    ap.add_argument("--fallback-budget-ms", type=float, default=0.05)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: grpc,fuzz,soak,fallback")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    requests = args.requests or (600 if args.quick else 3000)
    tp_seconds = args.throughput_seconds or (5.0 if args.quick else 20.0)
    soak_minutes = args.soak_minutes if args.soak_minutes is not None else (1.0 if args.quick else 10.0)
    sizes = [int(x) for x in args.sizes.split(",")]
    skip = {x for x in args.skip.split(",") if x}
    if shutil.which("taskset") is None:
        print("taskset (util-linux) is required to pin the server", file=sys.stderr)
        return 2
    cores = sorted(os.sched_getaffinity(0))
    if args.server_core not in cores or args.client_core not in cores or args.server_core == args.client_core:
        print(f"need two distinct usable cores (have {cores})", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {args.client_core})
    threadpool_limits(1)

    t_begin = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_begin:7.1f}s] {msg}", flush=True)

    out: dict[str, Any] = {
        "benchmark": "extender_load",
        "caveat": CAVEAT,
        "git": git_commit(),
        "machine": machine(),
        "config": {"quick": args.quick, "policy": args.policy, "nodes": args.nodes, "sizes": sizes,
                   "requests_per_size": requests, "throughput_seconds": tp_seconds, "fuzz": args.fuzz,
                   "soak_minutes": soak_minutes, "soak_unique_uids": args.soak_unique_uids,
                   "fill_gpu": args.fill, "fallback_budget_ms": args.fallback_budget_ms,
                   "server_core": args.server_core, "client_core": args.client_core, "seed": args.seed},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out["cpu_by_phase"] = {}
    meter = CpuMeter()

    def phase_done(name: str) -> None:  # the machine's load, to judge the tails by
        out["cpu_by_phase"][name] = use = meter.take()
        log(f"  [{name}: server {use['server_cores']:.2f} cores, client {use['client_cores']:.2f}, "
            f"other tenants {use['other_cores']:.2f}]")

    has_grpc, grpc_why = grpc_available()
    want_grpc = has_grpc and "grpc" not in skip
    with tempfile.TemporaryDirectory(prefix="fedsched-extender-load-") as tmp:
        work = Path(tmp)
        csv_path = work / "nodes.csv"
        write_nodes_csv(csv_path, args.nodes, args.seed)
        nodes = load_nodes(csv_path)
        pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
        select_gpus = ModelStore(args.policy).current.scheduler.select_gpus

        def fresh_workload() -> Workload:
            return Workload(nodes, pods, Mirror(nodes, select_gpus), np.random.default_rng(args.seed))

        log(f"starting fedsched serve ({args.nodes} nodes, core {args.server_core}"
            f"{', gRPC' if want_grpc else ''})")
        server = Server(csv_path, args.policy, args.server_core, work, grpc=want_grpc)
        meter.start(server.proc.pid)
        try:
            out["server"] = {"cmd": server.cmd, "affinity": server.affinity(), "git": git_commit(),
                             "rss_mb_started": server.rss_mb()}
            wl = fresh_workload()
            conn = Conn(server.port)
            log(f"prefill to {args.fill:.0%} GPU allocation through prioritize + bind")
            out["prefill"] = prefill(conn, wl, args.fill, log)
            conn.close()
            out["server"]["rss_mb_after_prefill"] = server.rss_mb()
            phase_done("prefill")
            log(f"  {out['prefill']}")
            log("latency: prioritize and filter, one keep-alive connection")
            out["latency"] = latency_phase(server.port, wl, sizes, requests)
            phase_done("latency")
            for n in sizes:
                r = out["latency"][str(n)]
                p, f = r["prioritize"], r["filter"]
                log(f"  {n:>5} nodes: prioritize p50 {p['p50_ms']:.2f} p99 {p['p99_ms']:.2f} ms (server "
                    f"mean {r['server_mean_ms']['prioritize']:.2f}); filter p99 {f['p99_ms']:.2f} ms; "
                    f"fallbacks {r['metrics_delta']['fallbacks']}")
            mid = 500 if 500 in sizes else sizes[len(sizes) // 2]
            out["throughput"] = {}
            for conns in (1, 2):
                log(f"throughput at {mid} nodes, {conns} connection(s), {tp_seconds:.0f} s")
                r = throughput_phase(server.port, wl, mid, tp_seconds, conns)
                out["throughput"][str(conns)] = r
                log(f"  {r['decisions_per_s']:.0f} decisions/s, p99 {r['latency']['p99_ms']:.2f} ms, "
                    f"fallback share {r['fallback_share']:.1%}")
            phase_done("throughput")
            if want_grpc:
                assert server.grpc_port is not None
                log("gRPC ScoreNodes")
                out["grpc"] = grpc_phase(server.grpc_port, wl, sizes, requests)
                phase_done("grpc")
                for n in sizes:
                    log(f"  {n:>5} nodes: p50 {out['grpc'][str(n)]['score_nodes']['p50_ms']:.2f} p99 "
                        f"{out['grpc'][str(n)]['score_nodes']['p99_ms']:.2f} ms")
            else:
                why = "skipped (--skip grpc)" if has_grpc else grpc_why
                out["grpc"] = {"skipped": why}
                log(f"gRPC: not measured: {why}")
            if "fuzz" not in skip:
                log(f"fuzz: {args.fuzz} requests")
                out["fuzz"] = Fuzzer(server.port, wl, args.seed).run(args.fuzz)
                out["fuzz"]["http2_request_line_status"] = probe_http2_request_line(server.port)
                phase_done("fuzz")
                log(f"  statuses {out['fuzz']['statuses']}, internal errors {out['fuzz']['internal_errors']}")
            if "soak" not in skip:
                log(f"soak: {soak_minutes:g} min of filter + prioritize at 500 nodes")
                out["soak"] = soak_phase(server, wl, soak_minutes, 2.0 if soak_minutes <= 2 else 5.0,
                                         args.soak_unique_uids, log)
                phase_done("soak")
            out["server"]["rss_mb_end"] = server.rss_mb()
            out["server"]["internal_error_log_lines"] = server.internal_error_lines()[:20]
        finally:
            server.stop()
        if "fallback" not in skip:
            log(f"forced fallback: server restarted with --budget-ms {args.fallback_budget_ms}")
            server = Server(csv_path, args.policy, args.server_core, work, budget_ms=args.fallback_budget_ms,
                            name="fallback")
            git_at_start = git_commit()
            meter.start(server.proc.pid)
            try:
                wl = fresh_workload()
                conn = Conn(server.port)
                fill = prefill(conn, wl, args.fill, log)
                conn.close()
                before = scrape(server.port)
                bodies = wl.bodies(mid, min(requests, 400))
                conn = Conn(server.port)
                timed_requests(conn, "prioritize", bodies, min(200, requests), "fbwarm")
                mid_before = scrape(server.port)
                lat, errors = timed_requests(conn, "prioritize", bodies, requests, "fb")
                conn.close()
                d = diff(scrape(server.port), mid_before)
                decisions = sum(d["decisions"].values())
                out["fallback"] = {
                    "git": git_at_start,  # the code this server loaded
                    "budget_ms": args.fallback_budget_ms,
                    "nodes": mid,
                    "prefill": fill,
                    "prioritize": stats(lat),
                    "errors": errors,
                    "metrics_delta": d,
                    "metrics_delta_with_warmup": diff(scrape(server.port), before),
                    "timeout_or_busy_share": (
                        d["fallbacks"].get("timeout", 0) + d["fallbacks"].get("busy", 0)
                    ) / max(decisions, 1),
                }
                phase_done("fallback")
                log(f"  p50 {out['fallback']['prioritize']['p50_ms']:.2f} p99 "
                    f"{out['fallback']['prioritize']['p99_ms']:.2f} ms; fallbacks {d['fallbacks']}")
            finally:
                server.stop()
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out["goals"] = goals(out, mid)
    print_summary(out, sizes, mid)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
        log(f"wrote {args.json_out}")
    return 0


def goals(out: dict[str, Any], mid: int) -> list[dict[str, Any]]:
    g: list[dict[str, Any]] = []
    p99 = out["latency"][str(mid)]["prioritize"]["p99_ms"]
    g.append({"goal": f"prioritize p99 <= {GOAL_P99_MS:g} ms at {mid} nodes (HTTP, server on one core)",
              "value": f"{p99:.2f} ms", "result": verdict(p99 <= GOAL_P99_MS)})
    for conns, r in out["throughput"].items():
        g.append({"goal": f">= {GOAL_RATE:.0f} decisions/s at {mid} nodes, {conns} connection(s)",
                  "value": f"{r['decisions_per_s']:.0f}/s ({r['fallback_share']:.0%} fallbacks)",
                  "result": verdict(r["decisions_per_s"] >= GOAL_RATE)})
    grpc = out.get("grpc", {})
    if str(mid) in grpc:
        gp99 = grpc[str(mid)]["score_nodes"]["p99_ms"]
        g.append({"goal": f"gRPC ScoreNodes p99 at {mid} nodes vs the seed design's {SEED_GRPC_P99_MS} ms",
                  "value": f"{gp99:.2f} ms", "result": verdict(gp99 <= SEED_GRPC_P99_MS)})
    else:
        g.append({"goal": "gRPC ScoreNodes p99 vs the seed design's 3.2 ms", "value": "not measured",
                  "result": "n/a"})
    if "fuzz" in out:
        f = out["fuzz"]
        ok = f["5xx"] == 0 and f["healthz_after"] == 200 and f["prioritize_correct_after"]
        g.append({"goal": f"fuzz ({f['requests']} requests): no 5xx, /healthz answers afterwards",
                  "value": f"{f['5xx']} 5xx, {f['internal_errors']} internal, {f['no_response']} unanswered, "
                           f"{f['answered_without_status_line']} HTTP/0.9-style, "
                           f"healthz {f['healthz_after']}",
                  "result": verdict(ok)})
    if "soak" in out:
        s = out["soak"]
        slope = s["slope_mb_per_min_second_half"]
        g.append({"goal": f"soak {s['minutes']:g} min: RSS flat (|slope| < {GOAL_SOAK_MB_PER_MIN:g} MB/min, "
                          "2nd half)",
                  "value": f"{slope:+.2f} MB/min ({s['rss_mb']['start']:.0f} -> {s['rss_mb']['end']:.0f} MB, "
                           f"max {s['rss_mb']['max']:.0f})",
                  "result": verdict(abs(slope) < GOAL_SOAK_MB_PER_MIN)})
    if "fallback" in out:
        fb = out["fallback"]
        p = fb["prioritize"]["p99_ms"]
        counted = fb["timeout_or_busy_share"]
        g.append({"goal": f"forced fallback (budget {fb['budget_ms']} ms): p99 <= "
                          f"{GOAL_FALLBACK_P99_MS:g} ms, counted as timeout/busy",
                  "value": f"{p:.2f} ms, {counted:.0%} counted",
                  "result": verdict(p <= GOAL_FALLBACK_P99_MS and counted >= 0.99)})
    return g


def print_summary(out: dict[str, Any], sizes: list[int], mid: int) -> None:
    print()
    print(f"{'nodes':>6} {'verb':>12} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'mean ms':>8} "
          f"{'server mean':>11}")
    for n in sizes:
        r = out["latency"][str(n)]
        for verb in ("prioritize", "filter"):
            s = r[verb]
            print(f"{n:>6} {verb:>12} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {s['p999_ms']:9.2f} "
                  f"{s['mean_ms']:8.2f} {r['server_mean_ms'][verb]:11.2f}")
        g = out.get("grpc", {}).get(str(n))
        if g:
            s = g["score_nodes"]
            print(f"{n:>6} {'ScoreNodes':>12} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {s['p999_ms']:9.2f} "
                  f"{s['mean_ms']:8.2f}")
    if "fallback" in out:
        s = out["fallback"]["prioritize"]
        print(f"{mid:>6} {'fallback':>12} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {s['p999_ms']:9.2f} "
              f"{s['mean_ms']:8.2f}")
    if "skipped" in out.get("grpc", {}):
        print(f"gRPC not measured: {out['grpc']['skipped']}")
    print()
    width = max(len(x["goal"]) for x in out["goals"])
    for x in out["goals"]:
        print(f"{x['result']:>4}  {x['goal']:<{width}}  {x['value']}")
    print(f"\n{CAVEAT}")


if __name__ == "__main__":
    sys.exit(main())
