"""Soak of the scheduler extender under hostile input (issue 26, items 2, 4, 5 and 7).

``fedsched serve --policy learned --cluster-csv (openb's 1,213 GPU nodes) --insecure`` runs on
loopback in its own process (pinned to ``--server-core``, one BLAS thread, default limits). This
process is the attacker and, beside it, kube-scheduler: one keep-alive connection sends a valid
prioritize (an openb pod of the ``fedsched`` profile, 500 candidate nodes) every 50 ms and times
it, first for ``--idle`` seconds alone, then for ``--duration`` seconds (default 10 minutes)
while these attackers run at once:

- ``idle``: holds ``--idle-connections`` (300, past the server's 128) connections open and idle,
  opening a new one whenever the server closes one (at most 50 a second);
- ``slowloris``: ``--slowloris`` (20) connections sending their request head a byte a second;
- ``long_name``: a prioritize naming a node of half the server's ``--max-body`` (1 MiB: a 400)
  and one announcing a 20 MiB body (a 413, answered before the body is read), one after the other;
- ``big_body``: ``--big-bodies`` (4) connections each sending bodies of 95% of ``--max-body`` (a
  filter with half a million empty objects beside its pod: parsed into ~40 times their size), one
  after the other;
- ``oversize``: 30 MB bodies announced (a 413 unread), one after the other;
- ``fat_pod``: local-mode pods (a new uid each) with an annotation of half the ``--max-body`` and
  an environment variable of a quarter, filtered and never bound, one after the other;
- ``learn``: a filter with 1,500 full Node objects (learned once during the warm-up, then known:
  the cache holds every node it was told of, by design), one after the other;
- ``bad``: broken JSON, NaN, 100,000 levels of nesting, fields of the wrong type, ``/admin/reload``
  with ``{"path": 5}``, a bind of a pod never seen, one after the other.

Each attacker waits ``--pause`` (10 ms) between its requests (0: none), so that on a small shared
machine the attack does not take every core from the server and the valid client.

The server's RSS (/proc/PID/status VmRSS) is sampled every half second and its ``/metrics`` every
five. After the attack every attacker's socket is closed and the server is left alone for
``--settle`` seconds; then the end RSS (the median of the last 5 samples) is compared with the
start (the same, just before the attack). Written: ``--json`` (bench/results/hostile_input.json)
and a short summary beside it (.txt): RSS start/peak/end, whether the end is within 10% of the
start and the slope of a linear fit over the attack's second half; the valid prioritize's latency
(p50/p99/max) idle and under attack, with its failures and the fallbacks the server counted;
connections held (by the attacker, and open on the server); each attacker's answers by status.

    python bench/hostile_input.py [--duration 600] [--idle 30] [--settle 20] [--json OUT.json]

Loopback only. The figures are wall-clock times on whatever machine runs this (the JSON records
the machine, its load average and the commit): on 2 cores the attackers, this client and the
server share the CPU, and a body being parsed holds the server's interpreter for tens of ms.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import http.client
import json
import math
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import ROOT
from harness.extender_client import metric
from harness.provenance import git_commit, machine, write_json
from harness.serve import get, serve_agent
from harness.stats import timing_stats

from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.extender import ConnectionLimits
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods

MIB = 1024 * 1024
VALID_EVERY_S = 0.05
ATTACKERS = ("idle", "slowloris", "long_name", "big_body", "oversize", "fat_pod", "learn", "bad")
CANDIDATES = 500


def _conn(port: int, timeout: float = 30.0) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> int:
    """POST ``body``; the status (the connection is closed after an error or a closing answer)."""
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        if r.will_close:
            conn.close()
        return r.status
    except (OSError, http.client.HTTPException):
        conn.close()
        raise


def head_only(port: int, path: str, length: int, timeout: float = 30.0) -> int:
    """Announce a body of ``length`` bytes, send none: the status of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed without an answer")
            data += chunk
        return int(data.split()[1])


class Attack:
    """The attackers' threads, their answers by status and the connections they hold."""

    def __init__(self, port: int, prefix: str, pause_s: float) -> None:
        self.port, self.prefix, self.pause_s = port, prefix, pause_s
        self.stop = threading.Event()
        self.answers: dict[str, Counter] = {}
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.sockets: list[socket.socket] = []  # the idle and slow-loris connections held now
        self.held: list[int] = []  # how many of them were open, sampled

    def count(self, who: str, status: int | str) -> None:
        with self.lock:
            self.answers.setdefault(who, Counter())[str(status)] += 1

    def loop(self, who: str, step: Callable[[], int | str], n: int = 1) -> None:
        """Run ``step`` in ``n`` threads until stopped, ``pause_s`` apart, counting its answers."""

        def run() -> None:
            while not self.stop.is_set():
                try:
                    self.count(who, step())
                except (OSError, http.client.HTTPException) as e:
                    self.count(who, type(e).__name__)
                    self.stop.wait(0.05)
                self.stop.wait(self.pause_s)

        for k in range(n):
            t = threading.Thread(target=run, name=f"{who}-{k}", daemon=True)
            t.start()
            self.threads.append(t)

    def keep_open(self, who: str, n: int, trickle: bool) -> None:
        """Hold ``n`` connections open (idle, or sending a request head a byte a second), opening a
        new one for each the server closes, at most 50 a second."""
        head = b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000

        def run() -> None:
            socks: list[tuple[socket.socket, int]] = []
            while not self.stop.is_set():
                alive = []
                for s, sent in socks:
                    try:
                        s.recv(65536)  # b"" (closed) or an answer before closing
                    except BlockingIOError:  # nothing: still open
                        pass
                    except OSError:
                        self.count(who, "closed_by_server")
                        self._drop(s)
                        continue
                    else:
                        self.count(who, "closed_by_server")
                        self._drop(s)
                        continue
                    if trickle:
                        try:
                            s.send(head[sent:sent + 1])
                            sent += 1
                        except OSError:
                            self.count(who, "closed_by_server")
                            self._drop(s)
                            continue
                    alive.append((s, sent))
                socks = alive
                for _ in range(min(50, n - len(socks))):
                    try:
                        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    except OSError as e:
                        self.count(who, type(e).__name__)
                        break
                    s.setblocking(False)  # a recv with a timeout would wait for it first
                    with self.lock:
                        self.sockets.append(s)
                    socks.append((s, 0))
                    self.count(who, "opened")
                self.stop.wait(1.0)

        t = threading.Thread(target=run, name=who, daemon=True)
        t.start()
        self.threads.append(t)

    def _drop(self, s: socket.socket) -> None:
        with self.lock:
            if s in self.sockets:
                self.sockets.remove(s)
        s.close()

    def open_count(self) -> int:
        with self.lock:
            return len(self.sockets)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        with self.lock:
            for s in self.sockets:
                s.close()
            self.sockets.clear()


def bodies(nodes_csv: Path) -> dict[str, Any]:
    """The valid request and the hostile bodies, encoded once."""
    table = load_nodes(nodes_csv)
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), table)
    names = list(table.names[:CANDIDATES])
    # CPU pods: they fit the empty cluster's every node, so the policy ranks all 500 candidates
    cpu_only = [k for k in range(len(pods)) if pods.num_gpu[k] == 0][:200]
    valid_pods = [pod_to_json(Pod.from_table(pods, k), f"valid-{k}", table.models, uid=f"valid-{k}")
                  for k in cpu_only]
    pod = valid_pods[0]
    node = {"metadata": {"name": "x", "labels": {}},
            "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    learn_items = []
    for k in range(1500):
        item = copy.deepcopy(node)
        item["metadata"]["name"] = f"learned-{k:05d}"
        learn_items.append(item)
    max_body = ConnectionLimits().max_body_bytes
    fat = copy.deepcopy(pod)
    fat["metadata"].setdefault("annotations", {})["junk"] = "x" * (max_body // 2)
    fat["spec"]["containers"][0]["env"] = [{"name": "BLOB", "value": "y" * (max_body // 4)}]
    return {
        "names": names,
        "valid": [json.dumps({"Pod": p, "NodeNames": names}).encode() for p in valid_pods],
        "long_name": json.dumps({"Pod": pod, "NodeNames": [*names[:10], "n" * (max_body // 2)]}).encode(),
        # just under the server's --max-body: empty objects, 4 bytes each (", {}")
        "big_body": json.dumps({"Pod": pod, "NodeNames": names[:10],
                                "x": [{}] * int(0.95 * max_body / 4)}).encode(),
        "fat_pod": fat,
        "learn": json.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": learn_items}}).encode(),
        "bad": [
            ("filter", b'{"Pod": {"metadata": '),
            ("prioritize", b'{"Pod": {"metadata": {"uid": NaN}}, "NodeNames": []}'),
            ("filter", b"[" * 100_000 + b"]" * 100_000),
            ("prioritize", json.dumps({"Pod": pod, "NodeNames": "not-a-list"}).encode()),
            ("filter", json.dumps({"Pod": pod, "Nodes": {"items": [{"metadata": {"name": 5}}]}}).encode()),
            ("/admin/reload", b'{"path": 5}'),
            ("bind", json.dumps({"PodName": "p", "PodNamespace": "d", "PodUID": "never-seen",
                                 "Node": names[0]}).encode()),
        ],
    }


def start_attack(attack: Attack, b: dict[str, Any], args: argparse.Namespace) -> None:
    port, prefix = attack.port, attack.prefix
    fat_uids = iter(range(10**9))

    def on_conn(fn: Callable[[http.client.HTTPConnection], int]) -> Callable[[], int]:
        local = threading.local()

        def step() -> int:
            if getattr(local, "conn", None) is None:
                local.conn = _conn(port)
            try:
                return fn(local.conn)
            except (OSError, http.client.HTTPException):
                local.conn = None
                raise
        return step

    def long_name(c: http.client.HTTPConnection) -> int:
        status = post(c, f"{prefix}/prioritize", b["long_name"])
        attack.count("long_name", head_only(port, f"{prefix}/prioritize", 20 * MIB))
        return status

    def fat_pod(c: http.client.HTTPConnection) -> int:
        pod = b["fat_pod"]
        pod["metadata"]["uid"] = f"fat-{next(fat_uids)}"
        return post(c, f"{prefix}/filter", json.dumps({"Pod": pod, "NodeNames": b["names"][:20]}).encode())

    bad_at = iter(range(10**9))

    def bad(c: http.client.HTTPConnection) -> int:
        verb, body = b["bad"][next(bad_at) % len(b["bad"])]
        return post(c, verb if verb.startswith("/") else f"{prefix}/{verb}", body)

    starts: dict[str, Callable[[], None]] = {
        "idle": lambda: attack.keep_open("idle", args.idle_connections, trickle=False),
        "slowloris": lambda: attack.keep_open("slowloris", args.slowloris, trickle=True),
        "long_name": lambda: attack.loop("long_name", on_conn(long_name)),
        "big_body": lambda: attack.loop(
            "big_body", on_conn(lambda c: post(c, f"{prefix}/filter", b["big_body"])), n=args.big_bodies),
        "oversize": lambda: attack.loop("oversize", lambda: head_only(port, f"{prefix}/filter", 30_000_000)),
        "fat_pod": lambda: attack.loop("fat_pod", on_conn(fat_pod)),
        "learn": lambda: attack.loop("learn", on_conn(lambda c: post(c, f"{prefix}/filter", b["learn"]))),
        "bad": lambda: attack.loop("bad", on_conn(bad)),
    }
    for name in args.attackers.split(","):
        starts[name]()


class Valid:
    """kube-scheduler's valid prioritize, every ``VALID_EVERY_S``, timed, on one keep-alive
    connection (a new one after a failure)."""

    def __init__(self, port: int, prefix: str, requests: list[bytes]) -> None:
        self.port, self.path, self.requests = port, f"{prefix}/prioritize", requests
        self.phase = "idle"
        self.latency: dict[str, list[float]] = {"idle": [], "attack": []}
        self.failures: dict[str, Counter] = {"idle": Counter(), "attack": Counter()}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="valid", daemon=True)

    def run(self) -> None:
        conn, k = _conn(self.port, timeout=10.0), 0
        while not self.stop.is_set():
            body, phase = self.requests[k % len(self.requests)], self.phase
            k += 1
            t0 = time.perf_counter()
            try:
                status = post(conn, self.path, body)
                if status == 200:
                    self.latency[phase].append(time.perf_counter() - t0)
                else:
                    self.failures[phase][str(status)] += 1
            except (OSError, http.client.HTTPException) as e:
                self.failures[phase][type(e).__name__] += 1
                conn = _conn(self.port, timeout=10.0)
            self.stop.wait(max(0.0, VALID_EVERY_S - (time.perf_counter() - t0)))


def scrape(agent: Any) -> dict[str, float] | None:
    """The figures of the server's /metrics (None when 3 tries in a row got no answer: the
    attack may have taken the connection)."""
    for _ in range(3):
        try:
            status, text = get(agent, "/metrics", timeout=10.0)
        except OSError:
            continue
        if status == 200:
            break
    else:
        return None
    t = text.decode()
    out = {"connections_open": metric(t, "fedsched_connections_open"),
           "fallbacks": metric(t, "fedsched_fallbacks_total"),
           "internal_fallbacks": metric(t, "fedsched_fallbacks_total", reason="internal"),
           **{f"fallbacks_{r}": metric(t, "fedsched_fallbacks_total", reason=r)
              for r in ("timeout", "busy", "error", "nan", "no-feasible", "table")},
           "connections_refused": metric(t, "fedsched_connections_refused_total"),
           "bodies_refused_too_large": metric(t, "fedsched_request_bodies_refused_total", reason="too_large"),
           "bodies_refused_busy": metric(t, "fedsched_request_bodies_refused_total", reason="busy"),
           "requests_5xx": sum(metric(t, "fedsched_requests_total", code=str(c)) for c in (500, 502, 504))}
    for reason in ("idle_timeout", "header_timeout", "body_timeout", "evicted"):
        out[f"closed_{reason}"] = metric(t, "fedsched_connections_closed_total", reason=reason)
    return out


def summary_text(r: dict[str, Any]) -> str:
    rss, lat, conns = r["rss_mb"], r["valid_prioritize"], r["connections"]
    idle, att = lat["idle"], lat["attack"]
    lines = [
        f"hostile-input soak: {r['attack_s']:.0f} s of attack (after {r['idle_s']:.0f} s idle, "
        f"{r['settle_s']:.0f} s to settle), commit {r['commit']['commit'][:10]}"
        f"{' (dirty)' if r['commit'].get('dirty') else ''}",
        f"RSS MB: start {rss['start']:.1f}, peak {rss['peak']:.1f}, end {rss['end']:.1f} "
        f"({100 * (rss['end'] / rss['start'] - 1):+.1f}%): "
        f"{'within' if rss['end_within_10pct'] else 'NOT within'} 10% of the start; under attack, "
        f"{rss['slope_mb_per_min_second_half']:+.2f} MB/min over its second half",
        f"valid prioritize ({CANDIDATES} nodes, every {VALID_EVERY_S * 1000:.0f} ms): idle p50 "
        f"{idle['p50_ms']:.2f} / p99 {idle['p99_ms']:.2f} ms (n {idle['n']}); under attack p50 "
        f"{att['p50_ms']:.2f} / p99 {att['p99_ms']:.2f} / max {att['max_ms']:.1f} ms (n {att['n']}, "
        f"{100 * att['share_within_10ms']:.1f}% within the 10 ms budget, "
        f"{100 * att['share_within_100ms']:.1f}% within the chart's 100 ms httpTimeout); failures "
        f"under attack {dict(lat['failures']['attack']) or 0}; fallbacks counted "
        f"{r['fallbacks_during_attack']:.0f} {r['fallbacks_during_attack_by_reason'] or ''}",
        f"connections: the attacker held {conns['attacker_held_max']} at most (mean "
        f"{conns['attacker_held_mean']:.0f}); open on the server at most {conns['server_open_max']:.0f} "
        f"(limit {conns['server_limit']}); closed by the server: {conns['closed_by_server']}",
        "answers by attacker: " + "; ".join(f"{k} {dict(v)}" for k, v in sorted(r["answers"].items())),
        f"5xx answers: {r['server_end']['requests_5xx'] if r['server_end'] else 'n/a'}; internal "
        f"fallbacks: {r['server_end']['internal_fallbacks'] if r['server_end'] else 'n/a'}",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of attack")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of the valid request alone first")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds left alone after the attack")
    ap.add_argument("--idle-connections", type=int, default=300)
    ap.add_argument("--slowloris", type=int, default=20)
    ap.add_argument("--big-bodies", type=int, default=4, help="connections sending bodies near --max-body")
    ap.add_argument("--pause", type=float, default=0.01,
                    help="seconds each attacker waits between its requests (0: none)")
    ap.add_argument("--attackers", default=",".join(ATTACKERS),
                    help=f"comma-separated attackers to run (default all: {','.join(ATTACKERS)})")
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--json", dest="json_out", default=str(ROOT / "bench/results/hostile_input.json"))
    args = ap.parse_args()
    if args.duration <= 0 or args.idle <= 0 or args.settle < 0:
        ap.error("--duration and --idle must be positive, --settle not negative")
    unknown = set(args.attackers.split(",")) - set(ATTACKERS)
    if unknown:
        ap.error(f"unknown attackers {', '.join(sorted(unknown))} (known: {', '.join(ATTACKERS)})")

    nodes_csv = builtin_trace("openb_node_list_gpu_node.csv")
    b = bodies(nodes_csv)
    commit, mach = git_commit(), machine()
    rss: list[tuple[float, float]] = []
    scrapes: list[tuple[float, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as work, serve_agent(
        "--policy", "learned", "--cluster-csv", str(nodes_csv), "--insecure", "--watch-policy", "0",
        core=args.server_core, workdir=Path(work),
    ) as agent:
        port, prefix = agent.port, agent.prefix
        warm = _conn(port)
        for body in b["valid"]:
            assert post(warm, f"{prefix}/prioritize", body) == 200
        assert post(warm, f"{prefix}/filter", b["learn"]) == 200  # the 1,500 nodes, learned once
        warm.close()
        sampling = threading.Event()

        def sample() -> None:
            last_scrape = 0.0
            while not sampling.wait(0.5):
                now = time.monotonic()
                rss.append((now, agent.rss_mb()))
                if now - last_scrape >= 5.0:
                    last_scrape = now
                    m = scrape(agent)
                    if m is not None:
                        scrapes.append((now, m))
                    attack_held.append(attack.open_count() if attack is not None else 0)

        attack: Attack | None = None
        attack_held: list[int] = []
        sampler = threading.Thread(target=sample, name="sampler", daemon=True)
        sampler.start()
        valid = Valid(port, prefix, b["valid"])
        valid.thread.start()
        print(f"idle: {args.idle:.0f} s of the valid prioritize alone", file=sys.stderr, flush=True)
        time.sleep(args.idle)
        start_rss = statistics.median(x for _, x in rss[-5:])
        before = scrape(agent)
        t_attack = time.monotonic()
        attack = Attack(port, prefix, args.pause)
        valid.phase = "attack"
        start_attack(attack, b, args)
        print(f"attack: {args.duration:.0f} s", file=sys.stderr, flush=True)
        next_note = t_attack + 60
        while time.monotonic() - t_attack < args.duration:
            time.sleep(1.0)
            if time.monotonic() >= next_note:
                next_note += 60
                print(f"  {time.monotonic() - t_attack:.0f} s: RSS {rss[-1][1]:.0f} MB, held "
                      f"{attack.open_count()}, valid n={len(valid.latency['attack'])}", file=sys.stderr,
                      flush=True)
        valid.latency["settle"], valid.failures["settle"] = [], Counter()
        valid.phase = "settle"
        t_end = time.monotonic()
        after = scrape(agent)
        attack.finish()
        print(f"settle: {args.settle:.0f} s", file=sys.stderr, flush=True)
        time.sleep(args.settle)
        valid.stop.set()
        valid.thread.join(timeout=30)
        sampling.set()
        sampler.join(timeout=30)
        end_rss = statistics.median(x for _, x in rss[-5:])
        server_end = scrape(agent)
        internal = agent.internal_error_lines()

    attack_rss = [x for t, x in rss if t >= t_attack]
    second_half = [(t, x) for t, x in rss if t_attack + (t_end - t_attack) / 2 <= t <= t_end]
    slope = (float(np.polyfit([t / 60 for t, _ in second_half], [x for _, x in second_half], 1)[0])
             if len(second_half) > 2 else math.nan)

    def lat(phase: str) -> dict[str, Any]:
        xs = valid.latency[phase]
        out: dict[str, Any] = timing_stats(xs) if xs else {"n": 0}
        if xs:
            out["share_within_10ms"] = sum(x <= 0.010 for x in xs) / len(xs)
            out["share_within_100ms"] = sum(x <= 0.100 for x in xs) / len(xs)
        return out

    during = [m for t, m in scrapes if t_attack <= t <= t_end]
    result = {
        "benchmark": "hostile_input",
        "commit": commit,
        "machine": {**mach, "loadavg_end": list(os.getloadavg())},
        "idle_s": args.idle, "attack_s": t_end - t_attack, "settle_s": args.settle,
        "config": {"idle_connections": args.idle_connections, "slowloris": args.slowloris,
                   "big_bodies": args.big_bodies, "pause_s": args.pause, "candidates": CANDIDATES,
                   "attackers": args.attackers.split(","),
                   "valid_every_s": VALID_EVERY_S, "server": agent.cmd},
        "rss_mb": {"start": start_rss, "peak": max(attack_rss), "end": end_rss,
                   "end_over_start": end_rss / start_rss,
                   "end_within_10pct": abs(end_rss / start_rss - 1) <= 0.10,
                   "slope_mb_per_min_second_half": slope,
                   "samples": [[round(t - t_attack, 1), round(x, 1)] for t, x in rss[::4]]},
        "valid_prioritize": {"idle": lat("idle"), "attack": lat("attack"), "settle": lat("settle"),
                             "failures": {k: dict(v) for k, v in valid.failures.items()}},
        "fallbacks_during_attack": (after or {}).get("fallbacks", 0) - (before or {}).get("fallbacks", 0),
        "fallbacks_during_attack_by_reason": {
            k.removeprefix("fallbacks_"): v - (before or {}).get(k, 0) for k, v in (after or {}).items()
            if k.startswith("fallbacks_") and v - (before or {}).get(k, 0)},
        "connections": {
            "attacker_held_max": max(attack_held, default=0),
            "attacker_held_mean": statistics.fmean(attack_held) if attack_held else 0.0,
            "server_open_max": max((m["connections_open"] for m in during), default=0),
            "server_open_mean": statistics.fmean(m["connections_open"] for m in during) if during else 0.0,
            "server_limit": 128,
            "closed_by_server": {k.removeprefix("closed_"): v for k, v in (after or {}).items()
                                 if k.startswith("closed_")},
            "refused": (after or {}).get("connections_refused"),
        },
        "answers": {k: dict(v) for k, v in attack.answers.items()},
        "server_end": server_end,
        "internal_error_log_lines": len(internal),
    }
    write_json(args.json_out, result)
    text = summary_text(result)
    Path(args.json_out).with_suffix(".txt").write_text(text)
    print(text, end="")
    print(f"wrote {args.json_out} and its .txt", file=sys.stderr)
    return 0 if result["rss_mb"]["end_within_10pct"] else 1


if __name__ == "__main__":
    # SIGTERM as ^C: the server is stopped on the way out (serve_agent's exit), not orphaned.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
