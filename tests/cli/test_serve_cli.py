"""``fedsched serve`` as a process: options, config file, refusals, clean shutdown."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bench.harness.serve import serve_process
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.common.learning.decision_log import DecisionLog
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace

NODES = str(builtin_trace("openb_node_list_gpu_node.csv"))


def fedsched(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedsched.cli.main", *args], capture_output=True, text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "learned", "--insecure"], "only allowed with --cluster-csv"),
        (["--policy", "learned", "--cluster-csv", NODES], "mutual TLS needs"),
        (["--cluster-csv", NODES, "--insecure"], "--policy is required"),
        (["--policy", "nope.pt", "--cluster-csv", NODES, "--insecure"], "no such checkpoint"),
        (["--policy", "learned", "--cluster-csv", NODES, "--insecure", "--mode", "yolo"], "mode must be"),
        (
            ["--policy", "learned", "--cluster-csv", NODES, "--insecure", "--cpu-threshold", "1.5"],
            "cpu_threshold",
        ),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(args, message):
    r = fedsched("serve", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


def test_unknown_config_keys_are_refused(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("policy: learned\nbudget_ms: 5\nbudgett-ms: 3\n")
    r = fedsched("serve", "--config", str(cfg))
    assert r.returncode == 2 and "unknown option 'budgett-ms'" in r.stderr


def test_serve_local_mode_from_a_config_file_and_stop_cleanly(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        f"policy: learned\ncluster-csv: {NODES}\ninsecure: true\nport: 0\nhost: 127.0.0.1\n"
        f"budget-ms: 50\ndecision-log: {tmp_path / 'log'}\noutcome-horizon: 3600\n"
    )
    with serve_process("--config", str(cfg), "--log-format", "json") as sp:
        with urllib.request.urlopen(sp.base + "/readyz", timeout=10) as r:
            assert r.status == 200
        pod = pod_to_json(Pod(-1, 1000, 1024, 0, 0, 0, 1), "p", uid="u1")
        body = json.dumps({"Pod": pod, "NodeNames": ["openb-node-0000", "openb-node-0001"]}).encode()
        req = urllib.request.Request(sp.url + "/prioritize", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            out = json.loads(r.read())
        host = max(out, key=lambda h: h["Score"])["Host"]
        bind = json.dumps({"PodName": "p", "PodNamespace": "d", "PodUID": "u1", "Node": host}).encode()
        with urllib.request.urlopen(urllib.request.Request(sp.url + "/bind", bind), timeout=10) as r:
            assert json.loads(r.read()) == {"Error": ""}
    assert sp.proc.returncode == 0, sp.stderr
    logs = [json.loads(x) for x in sp.stderr.splitlines() if x.startswith("{")]
    assert logs and all(x["model_version"] not in ("", "-") for x in logs)
    assert any("shutting down" in x["msg"] for x in logs)
    # the bound decision was written at shutdown with the outcome seen so far: nothing lost
    assert len(DecisionLog(Path(tmp_path / "log"))) == 1


def _prioritize(sp, pod: dict, names: list[str]) -> list[dict]:
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
    req = urllib.request.Request(sp.url + "/prioritize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _metrics(sp) -> str:
    with urllib.request.urlopen(sp.base + "/metrics", timeout=10) as r:
        return r.read().decode()


@pytest.mark.parametrize(("gpus", "active"), [(0, False), (4, True)], ids=["cpu-only", "gpu"])
def test_the_roll_out_gate_serves_the_packing_policy_actively_on_gpu_clusters_only(tmp_path, gpus, active):
    """The shipped batch-packing policy (GPU allocation beats kube-default in its validation)
    serves a GPU cluster actively; a CPU-only one gets shadow mode, with the reason in /metrics
    and the log."""
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                   + "".join(f"n{i},32000,131072,{gpus},{'V100' if gpus else ''}\n" for i in range(3)))
    with serve_process("--policy", "learned", "--cluster-csv", str(csv), "--insecure", "--host", "127.0.0.1",
                       "--port", "0", "--budget-ms", "200") as sp:
        pod = pod_to_json(Pod(-1, 1000, 1024, 0, 0, 0, 1), "p", uid="u1")
        _prioritize(sp, pod, ["n0", "n1", "n2"])
        text = _metrics(sp)
    gauge = [x for x in text.splitlines() if x.startswith("fedsched_policy_active{")]
    assert len(gauge) == 1, gauge
    assert gauge[0].endswith(" 1.0" if active else " 0.0"), gauge
    assert ('profile="gpu"' if active else 'profile="web"') in gauge[0]
    decisions = [x for x in text.splitlines() if x.startswith("fedsched_decisions_total{")]
    assert any(f'mode="{"active" if active else "shadow"}"' in x for x in decisions), decisions
    if not active:
        assert "validated on a GPU cluster" in gauge[0] and "roll-out gate" in sp.stderr
