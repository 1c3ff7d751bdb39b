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
        (["--policy", "learned", "--cluster-csv", NODES, "--insecure", "--packing-check", "lookahead:fgd"],
         "the packing check is auto or a baseline"),
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
        f"budget-ms: 50\ndecision-log: {tmp_path / 'log'}\noutcome-horizon: 3600\ngate: 'off'\n"
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


def _with_evidence(tmp_path: Path, profiles: dict[str, list[float]]) -> Path:
    """The shipped online policy with paired evidence of the given per-seed trouble scores (every
    guardrail flat), as ``fedsched evidence --write`` stores it."""
    import shutil

    from fedsched.common.learning.checkpoint import update_metadata
    from fedsched.common.model.metrics import TROUBLE_SMOOTHING
    from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path

    path = tmp_path / "policy.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), path)
    flat = {"values": [0.0] * 8}
    entries = {p: {"nodes": 200, "seeds": list(range(8)), "trouble_score": {"values": v},
                   "log_ratio": dict.fromkeys(TROUBLE_SMOOTHING, flat), "diff": {"pending_p99_s": flat}}
               for p, v in profiles.items()}
    update_metadata(path, {"evidence": {"format": 1, "quick": False, "profiles": entries}})
    return path


@pytest.mark.parametrize(("gpus", "active", "says"), [
    (0, True, "better than kube-default: trouble score -0.298 (one-sided 95% bound -0.259, 8 seeds"),
    (4, False, "no paired evidence for the gpu profile"),
], ids=["web-proven", "gpu-unproven"])
def test_the_roll_out_gate_serves_a_policy_actively_only_where_its_evidence_proves_it(tmp_path, gpus, active,
                                                                                       says):
    """A policy whose evidence proves it on web clusters serves a CPU-only cluster actively and a
    GPU cluster in shadow mode, with the verdict, its reason and figures in /metrics and the log."""
    policy = _with_evidence(tmp_path, {"web": [-0.30, -0.25, -0.35, -0.28, -0.31, -0.22, -0.40, -0.27]})
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                   + "".join(f"n{i},32000,131072,{gpus},{'V100' if gpus else ''}\n" for i in range(3)))
    with serve_process("--policy", str(policy), "--cluster-csv", str(csv), "--insecure", "--host",
                       "127.0.0.1", "--port", "0", "--budget-ms", "200") as sp:
        pod = pod_to_json(Pod(-1, 1000, 1024, 0, 0, 0, 1), "p", uid="u1")
        _prioritize(sp, pod, ["n0", "n1", "n2"])
        text = _metrics(sp)
    gauge = [x for x in text.splitlines() if x.startswith("fedsched_policy_active{")]
    assert len(gauge) == 1, gauge
    assert gauge[0].endswith(" 1.0" if active else " 0.0"), gauge
    assert ('profile="web"' if not gpus else 'profile="gpu"') in gauge[0] and says in gauge[0], gauge
    decisions = [x for x in text.splitlines() if x.startswith("fedsched_decisions_total{")]
    assert any(f'mode="{"active" if active else "shadow"}"' in x for x in decisions), decisions
    assert "roll-out gate" in sp.stderr and says in sp.stderr


@pytest.mark.parametrize("name", ["learned", "learned-td3"])
def test_the_packing_policies_stay_in_shadow_on_a_gpu_cluster(tmp_path, name):
    """The shipped packing and TD3 policies are not proven on GPU clusters by their evidence (they
    run hotter than kube-default there): ``fedsched serve --mode active`` keeps them in shadow."""
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                   + "".join(f"n{i},32000,131072,4,V100\n" for i in range(3)))
    with serve_process("--policy", name, "--cluster-csv", str(csv), "--insecure", "--host", "127.0.0.1",
                       "--port", "0", "--budget-ms", "200") as sp:
        pod = pod_to_json(Pod(-1, 1000, 1024, 0, 0, 0, 1), "p", uid="u1")
        _prioritize(sp, pod, ["n0", "n1", "n2"])
        text = _metrics(sp)
    gauge = [x for x in text.splitlines() if x.startswith("fedsched_policy_active{")]
    assert len(gauge) == 1 and gauge[0].endswith(" 0.0") and 'profile="gpu"' in gauge[0], gauge
