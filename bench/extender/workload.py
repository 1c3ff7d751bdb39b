"""The extender benchmark's cluster and requests: the 2,000-node CSV, the client's mirror of the
server's allocation, openb pods as prioritize/filter bodies over candidates where they fit, timed
back-to-back requests on one connection, and the prefill through prioritize + bind."""

from __future__ import annotations

import csv
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from harness.extender_client import Client, Endpoint

from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.common.model.cluster import ClusterState, NodeTable, Pod, PodTable
from fedsched.common.model.traces import builtin_trace

UID_TOKEN = "@@UID@@"  # replaced in a prebuilt body by each request's pod UID (same length not needed)
Log = Callable[[str], None]


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


@dataclass
class Workload:
    """The cluster, the pod trace, the mirror and the random draws every phase takes requests from."""

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


def connect(endpoint: Endpoint, timeout: float = 30.0) -> Client:
    """One keep-alive connection (Nagle off: http.client's own), as kube-scheduler keeps them."""
    return Client(endpoint, timeout=timeout)


def timed_requests(
    conn: Client, verb: str, bodies: list[tuple[bytes, bytes]], count: int, tag: str, check_every: int = 25
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
            status, data = conn.post_bytes(verb, raw)
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


def prefill(conn: Client, wl: Workload, fill: float, log: Log) -> dict[str, Any]:
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
        status, data = conn.post_bytes("prioritize", json.dumps({"Pod": obj, "NodeNames": names}).encode())
        if status != 200:
            failed += 1
            continue
        scores = json.loads(data)
        best = max(scores, key=lambda h: h["Score"])["Host"]
        bind = {"PodName": obj["metadata"]["name"], "PodNamespace": "default", "PodUID": uid, "Node": best}
        status, data = conn.post_bytes("bind", json.dumps(bind).encode())
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
