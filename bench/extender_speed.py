"""The extender's own speed, side by side: ``fedsched serve`` against a minimal Starlette +
orjson LeastAllocated extender, in one run, each server pinned to the same core, the same Python
client (``http.client`` keep-alive, Nagle off) pinned to another.

The workload is the one of the issue: the 1,523-node openb cluster (``openb_node_list_all_node
.csv``, served by ``fedsched serve --policy learned --cluster-csv`` in local mode, the roll-out
gate off: the policy's own path is what is timed, whatever its evidence says), openb pods of the
``fedsched`` profile (``spec.schedulerName: fedsched``, so the policy really runs;
``pod_to_json``'s realistic Pod bodies), 500 candidates per request sampled from the nodes where
the pod fits (``NodeNames``, nodeCacheCapable). The two
servers are timed in alternating rounds of back-to-back prioritize requests on one connection
each (``bench/extender/speed.py``); the figures are the median and p99 latency over every round,
requests/s (median over rounds) and the ratios fedsched / minimal. With ``--baseline-tree DIR``
(a checkout of another commit, e.g. ``git worktree add /tmp/base HEAD``) a third server, that
tree's ``fedsched serve``, runs in the same rounds: before/after side by side.

Then the breakdown (``bench/extender/breakdown.py``): the server's code run in this process on
the same bodies, stage by stage, and the rest of the client's median (HTTP server, loopback,
client).

Goals (issue 15): fedsched's median at most 2x the minimal extender's, at least half its
requests/s, at least 1,000 requests/s.

    python bench/extender_speed.py [--rounds 6] [--per-round 400] [--baseline-tree DIR] [--json OUT]

Shared, noisy machine: quote the ratios of one run, not absolute timings alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from extender.breakdown import breakdown, print_breakdown
from extender.metrics import diff, scrape
from extender.minimal import load_cluster
from extender.report import CAVEAT, verdict
from extender.speed import minimal_extender, ratios, side_by_side
from extender.workload import Mirror, Workload
from harness.cpu import ONE_THREAD_ENV, pin_client_beside_server
from harness.provenance import git_commit, machine, write_json
from harness.serve import get, serve_agent, serve_process

from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods

GOAL_P50_RATIO = 2.0
GOAL_THROUGHPUT_SHARE = 0.5
GOAL_RATE = 1000.0


@contextlib.contextmanager
def baseline_agent(tree: Path, serve_args: list[str], core: int, workdir: Path) -> Iterator[Any]:
    """``fedsched serve`` from another checkout: a ``fedsched`` namespace package whose parts
    link to that tree's folders goes first on PYTHONPATH, ahead of the editable install."""
    shim = workdir / "baseline-pkg" / "fedsched"
    shim.mkdir(parents=True)
    for part in ("common", "agent", "coordinator", "experiment", "cli"):
        if (tree / part).is_dir():  # an older checkout has fewer top-level packages
            (shim / part).symlink_to(tree.resolve() / part)
    env = {**ONE_THREAD_ENV, "PYTHONPATH": os.pathsep.join([str(shim.parent), str(tree.resolve())])}
    cmd = [*serve_args, "--host", "127.0.0.1", "--port", "0", "--log-level", "warning"]
    with serve_process(*cmd, command_prefix=["taskset", "-c", str(core)], env=env,
                       stderr_path=workdir / "baseline.stderr.log") as sp:
        end = time.monotonic() + 60
        while get(sp, "/readyz")[0] != 200:
            if time.monotonic() > end:
                raise RuntimeError("the baseline fedsched serve never became ready")
            time.sleep(0.2)
        yield sp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", dest="json_out", help="write every figure here")
    ap.add_argument("--policy", default="learned")
    ap.add_argument("--candidates", type=int, default=500)
    ap.add_argument("--bodies", type=int, default=300, help="distinct request bodies (cycled)")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds per server")
    ap.add_argument("--per-round", type=int, default=400, help="requests per round")
    ap.add_argument("--baseline-tree", type=Path, help="also serve another checkout's fedsched serve")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    problem = pin_client_beside_server(args.server_core, args.client_core)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    t_begin = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_begin:6.1f}s] {msg}", flush=True)

    csv_path = Path(builtin_trace("openb_node_list_all_node.csv"))
    nodes = load_nodes(csv_path)
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    mirror = Mirror(nodes, ModelStore(args.policy).current.scheduler.select_gpus)
    wl = Workload(nodes, pods, mirror, np.random.default_rng(args.seed))
    bodies = wl.bodies(args.candidates, args.bodies)
    out: dict[str, Any] = {
        "benchmark": "extender_speed", "caveat": CAVEAT, "git": git_commit(), "machine": machine(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cluster_nodes": len(nodes), "body_bytes_mean": float(np.mean([len(b) for b, _ in bodies])),
        "fitting_candidate_share": float(np.mean(wl.fit_share)),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    serve_args = ["--policy", args.policy, "--cluster-csv", str(csv_path), "--insecure", "--gate", "off"]
    tmpdir = tempfile.TemporaryDirectory(prefix="fedsched-extender-speed-")
    with tmpdir as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        log(f"starting fedsched serve and the minimal extender ({len(nodes)} nodes, core {args.server_core})")
        agent = stack.enter_context(serve_agent(*serve_args, core=args.server_core, workdir=work))
        minimal = stack.enter_context(minimal_extender(csv_path, args.server_core, work))
        servers: dict[str, Any] = {"fedsched": agent, "minimal": minimal}
        if args.baseline_tree is not None:
            servers["fedsched_baseline"] = stack.enter_context(
                baseline_agent(args.baseline_tree, serve_args, args.server_core, work))
        out["minimal_json"] = minimal.json_lib
        before = {k: scrape(v) for k, v in servers.items() if k != "minimal"}
        log(f"side by side: {args.rounds} alternating rounds of {args.per_round} prioritize requests, "
            f"{args.candidates} candidates")
        res = side_by_side(servers, bodies, args.rounds, args.per_round)
        for k, b in before.items():
            res[k]["metrics_delta"] = diff(scrape(servers[k]), b)
        out["results"] = res
    out["ratios"] = {k: ratios(res, k, "minimal") for k in res if k != "minimal"}
    if "fedsched_baseline" in res:
        out["ratios"]["fedsched_vs_baseline"] = ratios(res, "fedsched", "fedsched_baseline")
    print(f"\nprioritize, {args.candidates} candidates of {len(nodes)} nodes, one connection, "
          f"server on core {args.server_core} (minimal extender's JSON: {minimal.json_lib}):")
    print(f"  {'server':<18} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>7}  decisions")
    for k, r in res.items():
        dec = r.get("metrics_delta", {}).get("decisions", {})
        fb = r.get("metrics_delta", {}).get("fallbacks", {})
        print(f"  {k:<18} {r['latency']['p50_ms']:8.3f} {r['latency']['p99_ms']:8.3f} "
              f"{r['requests_per_s']:8.0f} {r['errors']:7d}  {dec or ''}"
              f"{' fallbacks ' + str(fb) if fb else ''}")
    for k, q in out["ratios"].items():
        ref = "baseline" if k.endswith("_vs_baseline") else "minimal"
        print(f"  {k} / {ref}: p50 x{q['p50_ratio']:.2f}, p99 x{q['p99_ratio']:.2f}, "
              f"throughput x{q['throughput_share']:.2f}")
    q, rate = out["ratios"]["fedsched"], res["fedsched"]["requests_per_s"]
    out["goals"] = [
        {"goal": f"median <= {GOAL_P50_RATIO:g}x the minimal extender's", "value": f"x{q['p50_ratio']:.2f}",
         "result": verdict(q["p50_ratio"] <= GOAL_P50_RATIO)},
        {"goal": f"requests/s >= {GOAL_THROUGHPUT_SHARE:g}x the minimal extender's",
         "value": f"x{q['throughput_share']:.2f}",
         "result": verdict(q["throughput_share"] >= GOAL_THROUGHPUT_SHARE)},
        {"goal": f">= {GOAL_RATE:.0f} requests/s (one connection)", "value": f"{rate:.0f}/s",
         "result": verdict(rate >= GOAL_RATE)},
    ]
    for g in out["goals"]:
        print(f"  {g['result']}  {g['goal']}: {g['value']}")
    if not args.no_breakdown:
        log("breakdown: the server's code in this process, stage by stage")
        bd = breakdown(csv_path, args.policy, bodies, minimal_nodes=load_cluster(str(csv_path)))
        out["breakdown"] = bd
        p50 = {k: res[k]["latency"]["p50_ms"] for k in ("fedsched", "minimal")}
        bd.update(print_breakdown(bd, p50["fedsched"], p50["minimal"]))
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if args.json_out:
        write_json(args.json_out, out)
        log(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
