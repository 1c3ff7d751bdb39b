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
3. gRPC ``ScoreNodes`` p50/p99 at the same sizes when ``agent/serving/grpc_service.py`` provides
   ``serve_grpc`` and ``DecisionClient`` (server started with ``--grpc-port``); compared with
   the seed design's 3.2 ms p99.
4. fuzz: ``--fuzz`` (10,000) malformed requests, most drawn with the hypothesis strategies the
   test suite shares (``bench/harness/fuzz_strategies.py``: bodies of every verb with wrong types,
   random node names, bad quantities, missing fields, bind/preempt junk and Node objects; pods of
   other profiles; random methods, paths and bytes), the rest written by hand (truncated bodies,
   bad Content-Length, garbage request lines, oversized heads). Goal: no 5xx, no internal error,
   and the server answers /healthz (and a correct prioritize) afterwards. Node objects in fuzzed
   ``Nodes`` lists are either known nodes or invalid, and binds name pods never seen, so the
   fuzzing does not change the cluster the soak runs on.
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
The phases live in ``bench/extender/``, what every benchmark shares in ``bench/harness/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from extender.fallback import fallback_phase
from extender.grpc import grpc_available, grpc_phase
from extender.latency import latency_phase
from extender.report import CAVEAT, goals, print_summary
from extender.soak import soak_phase
from extender.throughput import throughput_phase
from extender.workload import Mirror, Workload, connect, prefill, write_nodes_csv
from harness.cpu import CpuMeter, pin_client_beside_server
from harness.provenance import git_commit, machine, write_json
from harness.serve import serve_agent

from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods


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
    problem = pin_client_beside_server(args.server_core, args.client_core)
    if problem:
        print(problem, file=sys.stderr)
        return 2

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
    mid = 500 if 500 in sizes else sizes[len(sizes) // 2]
    with tempfile.TemporaryDirectory(prefix="fedsched-extender-load-") as tmp:
        work = Path(tmp)
        csv_path = work / "nodes.csv"
        write_nodes_csv(csv_path, args.nodes, args.seed)
        nodes = load_nodes(csv_path)
        pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
        select_gpus = ModelStore(args.policy).current.scheduler.select_gpus
        serve_args = ["--policy", args.policy, "--cluster-csv", str(csv_path), "--insecure", "--gate", "off"]

        def fresh_workload() -> Workload:
            return Workload(nodes, pods, Mirror(nodes, select_gpus), np.random.default_rng(args.seed))

        log(f"starting fedsched serve ({args.nodes} nodes, core {args.server_core}"
            f"{', gRPC' if want_grpc else ''})")
        with serve_agent(*serve_args, core=args.server_core, workdir=work, grpc=want_grpc) as server:
            meter.start(server.pid)
            out["server"] = {"cmd": server.cmd, "affinity": server.affinity(), "git": git_commit(),
                             "rss_mb_started": server.rss_mb()}
            wl = fresh_workload()
            conn = connect(server)
            log(f"prefill to {args.fill:.0%} GPU allocation through prioritize + bind")
            out["prefill"] = prefill(conn, wl, args.fill, log)
            conn.close()
            out["server"]["rss_mb_after_prefill"] = server.rss_mb()
            phase_done("prefill")
            log(f"  {out['prefill']}")
            log("latency: prioritize and filter, one keep-alive connection")
            out["latency"] = latency_phase(server, wl, sizes, requests)
            phase_done("latency")
            for n in sizes:
                r = out["latency"][str(n)]
                p, f = r["prioritize"], r["filter"]
                log(f"  {n:>5} nodes: prioritize p50 {p['p50_ms']:.2f} p99 {p['p99_ms']:.2f} ms (server "
                    f"mean {r['server_mean_ms']['prioritize']:.2f}); filter p99 {f['p99_ms']:.2f} ms; "
                    f"fallbacks {r['metrics_delta']['fallbacks']}")
            out["throughput"] = {}
            for conns in (1, 2):
                log(f"throughput at {mid} nodes, {conns} connection(s), {tp_seconds:.0f} s")
                r = throughput_phase(server, wl, mid, tp_seconds, conns)
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
                from extender.fuzz import Fuzzer, probe_http2_request_line  # hypothesis: a dev dependency

                log(f"fuzz: {args.fuzz} requests")
                out["fuzz"] = Fuzzer(server, wl, args.seed).run(args.fuzz)
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
        if "fallback" not in skip:
            log(f"forced fallback: server restarted with --budget-ms {args.fallback_budget_ms}")
            with serve_agent(*serve_args, "--budget-ms", str(args.fallback_budget_ms), core=args.server_core,
                             workdir=work, name="fallback") as server:
                git_at_start = git_commit()  # the code this server loaded
                meter.start(server.pid)
                out["fallback"] = fb = fallback_phase(server, fresh_workload(), mid, requests, args.fill,
                                                      args.fallback_budget_ms, git_at_start, log)
                phase_done("fallback")
                log(f"  p50 {fb['prioritize']['p50_ms']:.2f} p99 {fb['prioritize']['p99_ms']:.2f} ms; "
                    f"fallbacks {fb['metrics_delta']['fallbacks']}")
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out["goals"] = goals(out, mid)
    print_summary(out, sizes, mid)
    if args.json_out:
        write_json(args.json_out, out)
        log(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
