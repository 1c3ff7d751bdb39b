"""The agent's /metrics as the extender benchmark reads it: fallbacks by reason, decisions by
source, requests by verb and code, the server's own decision time; differences between scrapes."""

from __future__ import annotations

from harness.extender_client import Endpoint, metric
from harness.serve import get

Scrape = dict[str, dict[str, float]]


def scrape(endpoint: Endpoint) -> Scrape:
    """fallbacks by reason, decisions by source, requests by verb/code, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, data = get(endpoint, "/metrics")
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


def cache_nodes(endpoint: Endpoint) -> int:
    """fedsched_cache_nodes: the nodes the agent knows."""
    return int(metric(get(endpoint, "/metrics")[1].decode(), "fedsched_cache_nodes"))


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
