"""``fedsched serve --prometheus``: the agent's safety filter on live telemetry from a real Prometheus.

Simulated node-exporters publish node metrics, the real ``prometheus`` binary scrapes them and
evaluates the recording rules (windows shortened from 5m to 5s so that the test converges in
seconds, the only change), and the agent process reads them with its production queries.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from bench.harness.extender_client import metric
from bench.harness.polling import wait_for
from bench.harness.serve import serve_process
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.common.model.cluster import Pod
from tests.prometheus_support import (
    PROMETHEUS,
    RULES_FILE,
    NodeExporterSim,
    rules_with_window,
    running_prometheus,
)

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not found on PATH (apt-get install prometheus)"
)

NAMES = ["node-a", "node-b", "node-c"]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        return json.loads(r.read())


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_hot_nodes_are_refused_from_live_telemetry_and_prometheus_down_is_survived(tmp_path: Path):
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"{n},8000,32768,0,\n" for n in NAMES))
    with NodeExporterSim() as sim:
        for n in NAMES:
            sim.add_node(n, cpu=0.3, mem=0.4, disk_mbs=10.0, net_mbits=100.0, cpus=8)
        sim.set("node-b", cpu=0.97)
        with running_prometheus(
            tmp_path / "prom", [sim.scrape_config()], rules_with_window(RULES_FILE.read_text(), "5s")
        ) as prom, serve_process(
            "--policy", "learned", "--cluster-csv", str(csv), "--insecure", "--host", "127.0.0.1",
            "--port", "0", "--prometheus", prom.url, "--telemetry-interval", "0.5", "--stale-after", "30",
            "--gate", "off",  # the telemetry path with the policy answering (the gate: tests/cli)
        ) as sp:
            url, base = sp.url, sp.base
            pod = pod_to_json(Pod(-1, 500, 512, 0, 0, 0, 1), "p", uid="u")

            def refused() -> dict | None:
                # Each node is its own scrape target with its own phase, so for a moment node-b
                # can be the one without a CPU rate yet ("no telemetry"): wait for the CPU reason.
                out = _post(url + "/filter", {"Pod": pod, "NodeNames": NAMES})
                failed = out["FailedNodes"]
                return out if set(failed) == {"node-b"} and "cpu utilisation" in failed["node-b"] else None

            out = wait_for(refused, 40, 0.5, "node-b refused for its CPU use")
            assert out["NodeNames"] == ["node-a", "node-c"]
            assert "cpu utilisation 0.9" in out["FailedNodes"]["node-b"]
            assert metric(_get(base + "/metrics")[1], "fedsched_telemetry_up") == 1
            sim.set("node-b", cpu=0.2)  # it cools down: admitted again
            wait_for(
                lambda: _post(url + "/filter", {"Pod": pod, "NodeNames": NAMES})["NodeNames"] == NAMES,
                40,
                0.5,
                "node-b admitted again",
            )
            prom.stop()  # Prometheus goes away: the agent keeps answering, on requests alone
            wait_for(
                lambda: metric(_get(base + "/metrics")[1], "fedsched_telemetry_up") == 0,
                20,
                0.5,
                "telemetry_up = 0",
            )
            out = _post(url + "/prioritize", {"Pod": pod, "NodeNames": NAMES})
            assert [h["Host"] for h in out] == NAMES and max(h["Score"] for h in out) == 10
            assert _post(url + "/filter", {"Pod": pod, "NodeNames": NAMES})["NodeNames"] == NAMES
            assert _get(base + "/readyz")[0] == 200
    assert sp.proc.returncode == 0, sp.stderr
