"""The extender benchmark's goals (from the agent issue) judged on its figures, and the summary
it prints: the latency table and a PASS/MISS line per goal."""

from __future__ import annotations

from typing import Any

from extender.grpc import SEED_GRPC_P99_MS

GOAL_P99_MS = 2.0
GOAL_RATE = 1000.0
GOAL_FALLBACK_P99_MS = 10.0
GOAL_SOAK_MB_PER_MIN = 1.0
CAVEAT = (
    "Shared, noisy 2-core VM (no GPU): server pinned to one core, client to the other; other "
    "tenants' load shows in the tails. Quote ratios and orders of magnitude, not the last digit."
)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def goals(out: dict[str, Any], mid: int) -> list[dict[str, Any]]:
    """Each goal: what it is, the value measured, PASS, MISS or n/a."""
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
    """The latency table (client p50/p99/p99.9/mean, server mean), then the goals."""
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

