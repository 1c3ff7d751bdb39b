"""The extender's speed work: the prioritize answer encoder (the same JSON as json.dumps, bounded
per-node cache) and the pieces of the side-by-side benchmark (``bench/extender_speed.py``): the
minimal Starlette LeastAllocated extender's scores and the ratios the benchmark reports."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.extender import ExtenderServer
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.traces import builtin_trace

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def server():
    cache = ClusterCache.from_csv(builtin_trace("openb_node_list_gpu_node.csv"))
    decider = Decider(cache, ModelStore("learned"), DeciderConfig(budget_ms=2000.0))
    srv = ExtenderServer(decider, port=0)
    try:
        yield srv
    finally:
        srv.httpd.server_close()
        decider.close()


def test_encode_priorities_is_the_json_of_the_answer(server):
    hosts = ["n1", 'we"ird\\name', "ünïcode-node", "tab\there", "n1-copy", ""]
    scores = [10, 0, 7, 3, 9, 1]
    got = server.encode_priorities(hosts, scores)
    assert got == json.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)],
                             separators=(",", ":")).encode()
    assert json.loads(got) == [{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)]
    assert server.encode_priorities([], []) == b"[]"
    # the same host again with another score: its cached entries hold every score
    assert json.loads(server.encode_priorities(["n1", "n1"], [0, 10])) == [
        {"Host": "n1", "Score": 0}, {"Host": "n1", "Score": 10}]


def test_encode_priorities_cache_is_bounded(server):
    """Entries are kept for the cache's nodes only: names a request makes up are not (issue 26)."""
    known = list(server.decider.cache.table.names[:10])
    for k in range(0, 20_000, 5000):
        server.encode_priorities(known + [f"unknown-{k + j}" for j in range(5000)], [5] * 5010)
    assert set(server._host_entries) >= set(known)
    assert not any(h.startswith("unknown-") for h in server._host_entries)


def test_prioritize_answer_encodes_the_decision(server):
    names = list(server.decider.cache.table.names[:50])
    pod = {"metadata": {"name": "p", "uid": "u1"},
           "spec": {"schedulerName": "fedsched",
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}
    out = json.loads(server.prioritize({"Pod": pod, "NodeNames": names}, time.perf_counter()))
    assert [h["Host"] for h in out] == names
    assert all(0 <= h["Score"] <= 10 for h in out)
    assert sum(h["Score"] == 10 for h in out) == 1  # the policy's pick, every other node at most 9


def _minimal():
    spec = importlib.util.spec_from_file_location("bench_extender_minimal", BENCH / "extender" / "minimal.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_minimal_extender_scores_least_allocated(tmp_path):
    m = _minimal()
    csv_path = tmp_path / "nodes.csv"
    csv_path.write_text("sn,cpu_milli,memory_mib,gpu,model\na,4000,8192,0,\nb,16000,8192,0,\n")
    nodes = m.load_cluster(str(csv_path))
    assert nodes == {"a": (4000.0, 8192.0), "b": (16000.0, 8192.0)}
    pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": "2", "memory": "4Gi"}}},
                                   {"resources": {"requests": {"cpu": "500m"}}}]}}
    out = json.loads(m.answer(json.dumps({"Pod": pod, "NodeNames": ["a", "b", "zz"]}).encode(), nodes))
    # a: cpu (4000-2500)/4000 = 37.5%, mem 50% -> 43 -> 4; b: 84.375%, 50% -> 67 -> 6; unknown: 0
    assert out == [{"Host": "a", "Score": 4}, {"Host": "b", "Score": 6}, {"Host": "zz", "Score": 0}]
    full = {"Pod": pod, "Nodes": {"items": [{"metadata": {"name": "b"}}]}}
    assert json.loads(m.answer(json.dumps(full).encode(), nodes)) == [{"Host": "b", "Score": 6}]
    assert m.milli_cpu("250m") == 250.0 and m.mem_mib("1Gi") == 1024.0 and m.mem_mib("junk") == 0.0


@pytest.mark.filterwarnings("ignore::Warning")  # starlette.testclient over httpx (deprecations)
def test_minimal_extender_app_serves_prioritize(tmp_path):
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    m = _minimal()
    app = m.make_app({"a": (4000.0, 8192.0)})
    with TestClient(app) as c:
        r = c.post("/scheduler/prioritize", content=json.dumps({"Pod": {}, "NodeNames": ["a"]}))
        assert r.status_code == 200 and r.json() == [{"Host": "a", "Score": 10}]
        assert c.get("/healthz").status_code == 200


def test_side_by_side_ratios(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from extender.speed import ratios

    res = {"ours": {"latency": {"p50_ms": 1.5, "p99_ms": 4.0}, "requests_per_s": 500.0},
           "ref": {"latency": {"p50_ms": 0.5, "p99_ms": 2.0}, "requests_per_s": 1500.0}}
    q = ratios(res, "ours", "ref")
    assert q == pytest.approx({"p50_ratio": 3.0, "p99_ratio": 2.0, "throughput_share": 1 / 3})
