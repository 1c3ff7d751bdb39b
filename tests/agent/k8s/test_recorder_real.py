"""``fedsched record`` against a real kube-apiserver v1.37.2 and a real Prometheus, killed and restarted.

The control plane is this module's own (:func:`bench.harness.control_plane.control_plane`, the
binaries from :func:`tests.k8s_support.k8s_binaries`), so the node inventory recorded is exactly
the nodes created here. A simulated kubelet (``tests/prometheus_support.py``'s ``KubeletSim``)
publishes cAdvisor's per-container series of the bound pods and the real ``prometheus`` binary
scrapes it every second; the recorder reads it through the agent's telemetry client.

What is shown, in one run of the command as a process (the way it is deployed):

- nodes and pods created through the API before the recorder starts (its list) and after (its
  watch): pods created bound, pods bound through the ``binding`` subresource (their scheduling
  time), a pod that ends (Succeeded through ``/status``), a deleted pod, a pod that stays pending,
  and a pod whose GPU-share annotation is garbage (skipped and counted, not fatal);
- the pods' measured use from Prometheus lands in the file (per pod and per application);
- ``kill -9`` mid-run, changes while it is down (a pod deleted, new pods), a restart on the same
  directory: every row recorded before the kill is still there with the same facts, the pod
  deleted meanwhile has its deletion time, the new pods are recorded;
- SIGTERM ends it cleanly (exit 0, a last flush); ``--once`` lists, writes and exits; the files
  load with the project's trace readers, in ``fedsched evaluate`` (replay mode, kube-default), as
  a deployed member's node config
  (:func:`~fedsched.common.federation.members.member_from_node_config`) and in the roll-out gate's
  evidence on the member's own validation pods
  (:func:`~fedsched.agent.federation.validation.member_evidence`, the shipped online policy beside
  kube-default).

Under CI a missing ``prometheus`` or control-plane binary fails (``tests/require_services.py``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.control_plane import ControlPlane, KubeAPI, control_plane, create_nodes
from bench.harness.polling import wait_for
from fedsched.cli.main import main as cli_main
from fedsched.common.federation.members import member_from_node_config
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods
from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path
from tests.k8s_support import k8s_binaries
from tests.paths import REPO
from tests.prometheus_support import PROMETHEUS, KubeletSim, SimContainer, running_prometheus

NS = "recorded"
SYNC_S = 60.0  # generous: a shared 2-core machine; a wait, never an assertion on time
MIB = 2**20
N_WEB = 24  # bound at creation, application "web" (a StatefulSet)
N_LATE_BIND = 6  # created pending, bound by the test through the binding subresource


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane(tmp_path_factory.mktemp("recorder-cp"), k8s_binaries()) as c:
        c.api.ensure_namespace(NS)
        yield c


def pod_object(name: str, node: str | None = None, cpu: str = "500m", mem: str = "256Mi",
               owner: str | None = None, annotations: dict[str, str] | None = None,
               gpus: int = 0) -> dict:
    res: dict[str, Any] = {"requests": {"cpu": cpu, "memory": mem},
                           "limits": {"cpu": "2", "memory": "1Gi"}}
    if gpus:
        res["limits"]["nvidia.com/gpu"] = str(gpus)
    meta: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner,
                                    "uid": f"uid-{owner}", "controller": True}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                            "resources": res}], "automountServiceAccountToken": False}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create(api: KubeAPI, obj: dict) -> dict:
    return api.create(f"/api/v1/namespaces/{NS}/pods", obj)


def bind(api: KubeAPI, name: str, node: str) -> None:
    api.create(f"/api/v1/namespaces/{NS}/pods/{name}/binding",
               {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


def rows(out: Path) -> dict[str, dict[str, str]]:
    path = out / "pods.csv"
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        return {r["name"].removeprefix(f"{NS}/"): r for r in csv.DictReader(f)}


def summary(out: Path) -> dict[str, Any]:
    path = out / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


class Recorder:
    """``fedsched record`` as a process of its own."""

    def __init__(self, cp: ControlPlane, out: Path, prometheus: str, log: Path) -> None:
        self.log = log
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        with log.open("ab") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fedsched.cli.main", "record", "--out", str(out),
                 "--kubeconfig", str(cp.kubeconfig), "--namespace", NS, "--prometheus", prometheus,
                 "--telemetry-interval", "1", "--flush-interval", "1", "--log-level", "info"],
                stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env)

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(30)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def test_record_kill_restart_and_replay(cp: ControlPlane, tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    if PROMETHEUS is None:
        pytest.skip("prometheus not found on PATH (apt-get install prometheus)")
    api = cp.api
    openb = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    table = openb.select(list(range(0, 6)))
    table = dataclasses.replace(table, names=tuple(f"rec-node-{i}" for i in range(len(table))))
    create_nodes(api, table)
    names = list(table.names)
    gpu_node = next(n for i, n in enumerate(names) if table.gpu[i] > 0)
    model = table.models[int(table.model[names.index(gpu_node)])]

    # before the recorder: bound web pods, pods to bind later, a GPU pod, garbage, one pending
    for i in range(N_WEB):
        create(api, pod_object(f"web-{i}", node=names[i % len(names)], cpu=f"{250 + 50 * (i % 4)}m",
                               owner="web"))
    for i in range(N_LATE_BIND):
        create(api, pod_object(f"late-bind-{i}"))
    create(api, pod_object("gpu-job", node=gpu_node, gpus=1,
                           annotations={"alibabacloud.com/gpu-card-model": model}))
    create(api, pod_object("garbage", annotations={"alibabacloud.com/gpu-milli": "half"}))
    create(api, pod_object("never-bound"))

    kubelet = KubeletSim(names[0])
    out = tmp_path / "twin"
    rec: Recorder | None = None
    try:
        for i in range(N_WEB):
            kubelet.set_pod(NS, f"web-{i}", main=SimContainer(0.1 * (1 + i % 3), (64 + 32 * (i % 3)) * MIB))
        with running_prometheus(tmp_path / "prometheus", [kubelet.scrape_config()]) as prom:
            rec = Recorder(cp, out, prom.url, tmp_path / "record-1.log")
            # the list is recorded, the garbage pod skipped and counted
            wait_for(lambda: len(rows(out)) == N_WEB + N_LATE_BIND + 2, SYNC_S, 0.2,
                     "the listed pods recorded")
            assert "garbage" not in rows(out)
            # summary.json is written after pods.csv: wait for the flush to finish
            wait_for(lambda: summary(out).get("skipped", {}).get("pods", 0) >= 1, SYNC_S, 0.2,
                     "the garbage pod counted in summary.json")
            # after the recorder: the watch's events
            for i in range(N_LATE_BIND):
                bind(api, f"late-bind-{i}", names[(i + 1) % len(names)])
            create(api, pod_object("done", node=names[1]))
            api.merge_patch(f"/api/v1/namespaces/{NS}/pods/done/status", {"status": {"phase": "Succeeded"}})
            create(api, pod_object("gone", node=names[2]))
            api.delete(f"/api/v1/namespaces/{NS}/pods/gone")

            def watched() -> bool:
                r = rows(out)
                return (all(r.get(f"late-bind-{i}", {}).get("scheduled_time") for i in range(N_LATE_BIND))
                        and bool(r.get("done", {}).get("deletion_time"))
                        and bool(r.get("gone", {}).get("deletion_time")))

            wait_for(watched, SYNC_S, 0.2, "the watch's events recorded")
            # measured use: a few samples of every web pod
            wait_for(lambda: all(int(rows(out)[f"web-{i}"]["use_samples"]) >= 2 for i in range(N_WEB)),
                     SYNC_S, 0.5, "per-pod use sampled from Prometheus")
            before = rows(out)
            t_kill = time.time()
            assert rec.kill() == -signal.SIGKILL

            # while it is down: a pod deleted, new pods
            api.delete(f"/api/v1/namespaces/{NS}/pods/web-0")
            for i in range(3):
                create(api, pod_object(f"after-restart-{i}", node=names[i]))

            rec = Recorder(cp, out, prom.url, tmp_path / "record-2.log")
            wait_for(lambda: all(f"after-restart-{i}" in rows(out) for i in range(3))
                     and bool(rows(out)["web-0"]["deletion_time"]), SYNC_S, 0.2, "the restart caught up")
            wait_for(lambda: int(rows(out)["web-1"]["use_samples"]) > int(before["web-1"]["use_samples"]),
                     SYNC_S, 0.5, "sampling resumed after the restart")
            after = rows(out)
            assert rec.stop() == 0  # SIGTERM: a last flush, exit 0
    finally:
        if rec is not None:
            rec.close()
        kubelet.close()

    # nothing recorded before the kill is lost
    assert set(before) <= set(after)
    for name, row in before.items():
        now = after[name]
        for col in ("uid", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
                    "creation_time", "scheduled_time", "app", "cpu_limit_milli", "memory_limit_mib", "node"):
            assert now[col] == row[col], (name, col)
        if row["deletion_time"]:
            assert now["deletion_time"] == row["deletion_time"], name
        assert int(now["use_samples"]) >= int(row["use_samples"]), name
    # the pod deleted while the recorder was down ends at the restart's list (not before the kill)
    assert not before["web-0"]["deletion_time"]
    assert t_kill - 1 <= float(after["web-0"]["deletion_time"]) <= time.time()
    # facts of the run
    web = after["web-5"]
    assert (web["app"], web["cpu_limit_milli"], web["memory_limit_mib"]) == (f"{NS}/StatefulSet/web", "2000",
                                                                            "1024")
    assert float(web["memory_use_mib"]) == pytest.approx(64 + 32 * (5 % 3), rel=1e-6)
    assert float(web["cpu_use_milli"]) > 0 and float(web["app_cpu_use_ratio"]) > 0
    assert 0 < float(web["app_mem_use_ratio"]) < 1
    assert after["gpu-job"]["gpu_spec"] == model and after["gpu-job"]["num_gpu"] == "1"
    assert after["never-bound"]["node"] == "" and after["never-bound"]["deletion_time"] == ""
    assert after["done"]["pod_phase"] == "Succeeded"
    for i in range(N_LATE_BIND):
        r = after[f"late-bind-{i}"]
        assert float(r["creation_time"]) <= float(r["scheduled_time"]) <= time.time()
        assert r["node"] == names[(i + 1) % len(names)]
    s = summary(out)
    assert s["skipped"]["pods"] >= 2  # the garbage pod, in each run's list
    assert s["dropped"] == 0 and s["samples"] >= 2 * N_WEB and s["nodes"] == len(names)
    assert "skipped a pod" in (tmp_path / "record-1.log").read_text()

    # --once: one list into a new directory, then exit 0 (the pods there now, the garbage skipped)
    once = tmp_path / "once"
    res = subprocess.run([sys.executable, "-m", "fedsched.cli.main", "record", "--out", str(once),
                          "--kubeconfig", str(cp.kubeconfig), "--namespace", NS, "--once"],
                         capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    listed = {p["metadata"]["name"] for p in api.pods(NS)} - {"garbage"}
    assert set(rows(once)) == listed and summary(once)["skipped"]["pods"] == 1

    # the files load unchanged with the trace readers, in fedsched evaluate and as a member
    nodes = load_nodes(out / "nodes.csv")
    assert set(nodes.names) == set(names)
    pods = load_pods(out / "pods.csv", nodes, allow_oversized=True)
    assert len(pods) == len(after) == N_WEB + N_LATE_BIND + 2 + 2 + 3
    capsys.readouterr()
    assert cli_main(["evaluate", "--nodes", str(out / "nodes.csv"), "--pods", str(out / "pods.csv"),
                     "--mode", "replay", "--split", "none", "--seeds", "1", "--jobs", "1",
                     "--allow-oversized"]) == 0
    table_out = capsys.readouterr().out
    assert "kube-default" in table_out and "hot_cpu_node_s" in table_out
    member = member_from_node_config({"cluster-name": "recorded-member", "nodes-csv": str(out / "nodes.csv"),
                                      "pods-csv": str(out / "pods.csv")})
    assert member is not None and len(member.nodes) == len(names)
    assert member.val is not None and len(member.val) > 0 and len(member.train) > 0
    # the roll-out gate's evidence: the shipped online policy beside kube-default on the twin
    from fedsched.agent.federation.validation import member_evidence

    evidence = member_evidence(member, default_policy_path(LEARNED_ONLINE), seeds=2)
    (entry,) = evidence["profiles"].values()
    assert evidence["reference"] == "kube-default" and "recorded-member" in evidence["source"]
    assert entry["pods"] == len(member.val) and entry["nodes"] == len(names)
    assert entry["trouble_score"]["verdict"] in ("better", "worse", "tie")
