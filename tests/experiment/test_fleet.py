"""One member cluster of the kwok fleet (:mod:`fedsched.experiment.fleet`, stage 2 of issue 27's
items 3/4): etcd, kube-apiserver, kwok with 100 openb nodes, a real Prometheus, ``fedsched
serve`` in cluster mode in shadow with its decision log, kube-scheduler with the agent's shipped
configuration over mutual TLS, and the workload generator submitting a trace's pods with their
lifetimes and use. Checks that every pod is bound by the real scheduler and completes, that the
agent decided for each (shadow), saw every node through Prometheus, and logged outcomes.

The second test adds the hub and two federated rounds (the issue's CI test). Under CI a missing
binary, Prometheus, nginx, stunnel or the Flower CLIs fails, never skips. A second member joins
its rounds, a simulated one (a SuperNode of a replay cluster, ``partition-id``) through its own
sidecar: the two rounds of two members over the hub link's mutual TLS are checked here
(tests/coordinator/test_mtls.py checks the link's refusals on the same hub,
:func:`fedsched.experiment.hub.start_hub`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import pytest

from fedsched.common.learning.decision_log import DecisionLog
from fedsched.experiment import fleet
from fedsched.experiment.flower import missing_tools
from fedsched.experiment.hub import start_hub
from fedsched.experiment.processes import tail, wait_for
from fedsched.experiment.prometheus import PROMETHEUS
from tests.k8s_support import kwok_binary

N_NODES, N_PODS = 100, 40
#: The simulated second member of the two rounds: its name on the hub link, its node config (a
#: replay cluster, :func:`fedsched.common.federation.members.member_cluster`) and its tiny
#: round (the kwok member learns from its decision log: these settings are the simulated one's).
SIMULATED = "cluster-b"
SIMULATED_NODE_CONFIG = {"partition-id": 1, "num-partitions": 2}
TWO_MEMBERS = {"min-nodes": 2, "local-decisions": 20, "scarce-decisions": 10, "member-size": "small"}


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)")
def test_member_cluster_schedules_a_trace_in_shadow(tmp_path) -> None:
    kwok_binary()
    nodes, pods = fleet.load_inventory("openb", N_NODES, N_PODS, seed=1)
    work = fleet.Workload.from_trace(nodes, pods, speed=1.0, seed=1)
    # 40 pods arriving over 20 s, each living 6-12 s (the trace's order and use kept)
    work.arrival[:] = [20.0 * i / N_PODS for i in range(N_PODS)]
    work.lifetime[:] = [6.0 + (i % 7) for i in range(N_PODS)]
    with fleet.member_cluster(tmp_path / "m", "member-0", nodes,
                              serve_args=("--outcome-horizon", "3")) as member:
        assert len(member.api.items("/api/v1/nodes", labelSelector="type=kwok")) == N_NODES
        tally = fleet.run_workload(member, work, seconds=120, report_every=5)
        assert tally.submitted == tally.bound == N_PODS and tally.pending == 0
        metrics = member.agent_get("/metrics")
        decided = sum(float(v) for v in re.findall(
            r'^fedsched_decisions_total\{mode="shadow"[^}]*\} (\S+)$', metrics, re.M))
        assert decided >= N_PODS * 0.9, metrics
        assert re.search(r"^fedsched_cache_nodes 100\.0$", metrics, re.M), metrics
        assert len(member.prometheus.query("node_memory_MemTotal_bytes")) == N_NODES
        assert len(member.prometheus.query("instance:node_cpu:ratio")) == N_NODES
    # serve stopped (SIGTERM): the log holds every decision with its outcome
    records = DecisionLog(member.decision_log).tail_records(10_000)
    assert len(records) >= N_PODS * 0.9
    assert sum(1 for r in records if r.reward) >= N_PODS * 0.9
    assert {"pending_s", "cpu_util"} <= {k for r in records for k in r.reward}


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)")
@pytest.mark.skipif(bool(missing_tools()), reason="; ".join(missing_tools()))
def test_member_and_hub_two_rounds_over_mtls(tmp_path) -> None:
    """The issue's CI test: one member and the hub, two rounds. The decision log has outcomes,
    the recorded trace (``fedsched record``) loads in ``fedsched evaluate``, the rounds complete
    over mutual TLS, the served policy's version changes, the gate's verdict and its reason are
    in /metrics, and what was logged survives the agent's crash and restart mid-run.

    A simulated second member (:data:`SIMULATED`) joins the same hub through its own sidecar, so
    the rounds also show the hub link with two members: both members' results arrive in both
    rounds (no failure), every member call passes the gateway (mutual TLS verified) and only to
    the Fleet API, and the hub lists one run, completed. The fleet's workload outlasts the
    federation, so the second member costs the test no time."""
    kwok_binary()
    nodes, pods = fleet.load_inventory("web", N_NODES, 120, seed=1)
    work = fleet.Workload.from_trace(nodes, pods, speed=1.0, seed=1)
    work.arrival[:] = [80.0 * i / len(pods) for i in range(len(pods))]
    work.lifetime[:] = [5.0 + (i % 7) for i in range(len(pods))]
    with fleet.member_cluster(tmp_path / "m", "member-0", nodes, mode="active",
                              serve_args=("--outcome-horizon", "3", "--watch-policy", "1")) as member, \
            start_hub(tmp_path / "hub") as hub:
        hub.link(SIMULATED)  # its sidecar, certificate and registered SuperNode key, as test_mtls's members
        hub.start_supernode(SIMULATED, SIMULATED_NODE_CONFIG)
        tallies: list[fleet.Tally] = []
        worker = threading.Thread(target=lambda: tallies.append(
            fleet.run_workload(member, work, seconds=150, report_every=10)), daemon=True)
        worker.start()

        def logged() -> int:
            return len(DecisionLog(member.decision_log).tail_records(10_000)) \
                if member.decision_log.exists() else 0

        wait_for(lambda: logged() >= 15, 90, 1.0, "15 decisions with outcomes on disk")
        before = logged()
        member.restart_agent(kill=True)  # a crash mid-run: what is on disk stays
        assert logged() >= before
        wait_for(lambda: (member.twin / "pods.csv").exists(), 30, 1.0, "fedsched record's twin")

        fed = fleet.federate([member], hub, [work], rounds=2, root=tmp_path / "fed", run_config=TWO_MEMBERS)
        run_log = tmp_path / "fed" / "flwr-run.log"
        assert fed.status == "finished:completed", (
            f"{run_log.read_text()[-3000:]}\n{tail(hub.members[SIMULATED].log or run_log)}")
        runs = json.loads(hub.flwr("ls", "hub", "--format", "json").stdout)["runs"]
        assert len(runs) == 1 and runs[0]["status"] == "finished:completed", runs
        assert [r["round"] for r in fed.rounds] == [1, 2]
        assert all("train" in r for r in fed.rounds)
        for r in fed.rounds:
            up = r["members"]["0"]
            assert up["num-examples"] > 0 and 0 < up["bytes-up"] < up["bytes-up-fp32"], r
        # both members' results, both rounds, through the link
        assert tail(run_log, 100_000).count("Received 2 results and 0 failures") == 2, tail(run_log)
        versions = [s["version"] for s in fed.served["member-0"]]
        assert len(set(versions)) >= 2, fed.served  # each round's personalised policy hot-reloaded
        # Every member call went through the gateway (mTLS verified) and only to the Fleet API.
        access = (hub.nginx_dir / "access.log").read_text().splitlines()
        assert any('"POST /v1/fleet/pull-messages' in ln and '" 200 ' in ln for ln in access)
        assert any('"POST /v1/fleet/push-messages' in ln and '" 200 ' in ln for ln in access)
        assert all("/v1/fleet/" in ln for ln in access if '" 200 ' in ln)
        metrics = member.agent_get("/metrics")
        served = fleet.served_state(member)
        assert served["version"] == versions[-1]
        gate = re.search(rf'^fedsched_policy_active\{{model_version="{served["version"]}",profile="web",'
                         r'reason="([^"]+)"\} ([01])\.0$', metrics, re.M)
        assert gate and gate.group(1), metrics
        worker.join(180)
        assert tallies and tallies[0].bound == tallies[0].submitted == len(pods)
    records = DecisionLog(member.decision_log).tail_records(10_000)
    assert len(records) >= before and sum(1 for r in records if r.reward) >= 0.9 * len(records)
    res = subprocess.run([sys.executable, "-m", "fedsched.cli.main", "evaluate", "--nodes",
                          str(member.twin / "nodes.csv"), "--pods", str(member.twin / "pods.csv"),
                          "--allow-oversized", "--mode", "replay", "--seeds", "1", "--jobs", "1",
                          "--policy", "kube-default"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def _processes_naming(text: str) -> list[str]:
    """Live processes whose command line holds ``text`` (every service of a fleet names its
    working directory), but this one's."""
    import os
    from pathlib import Path

    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmd and state != "Z":
            found.append(cmd[:120])
    return found


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)")
@pytest.mark.parametrize(("sig", "status", "repeats"),
                         [("SIGTERM", 130, 0), ("SIGTERM", 130, 3), ("SIGKILL", -9, 0)],
                         ids=["SIGTERM", "SIGTERM-repeated", "SIGKILL"])
def test_a_stopped_fleet_leaves_no_service_running(tmp_path, sig, status, repeats) -> None:
    """Stopped by a job runner (SIGTERM: it unwinds and stops every service, status 130) or killed
    outright (SIGKILL: every service dies with it, ``PR_SET_PDEATHSIG``), a fleet leaves none of
    the services it started (etcd, kube-apiserver, kwok, Prometheus, ``fedsched serve``,
    kube-scheduler) running. ``repeated``: Ctrl-C and SIGTERM again while it stops them do not
    cut the stop short."""
    import signal
    import time

    kwok_binary()
    out = tmp_path / "fleet"
    job = subprocess.Popen([sys.executable, "-m", "fedsched.experiment.fleet", "--members", "1", "--nodes",
                            "10", "--pods", "30", "--minutes", "3", "--rounds", "0", "--out", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None
        for line in job.stdout:
            if "member-0 up in" in line:
                break
        assert job.poll() is None, f"the fleet ended before its member was up: {job.stderr.read()[-2000:]}"
        running = _processes_naming(str(out))
        assert len(running) >= 5, running  # the member's services are up
        job.send_signal(getattr(signal, sig))
        for again in [signal.SIGINT, signal.SIGTERM, signal.SIGINT][:repeats]:
            time.sleep(0.3)
            job.send_signal(again)
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == status
    if sig == "SIGTERM":  # one line, no traceback (the workload's thread meets the stopped apiserver quietly)
        err = job.stderr.read() if job.stderr is not None else ""
        assert "fleet: interrupted" in err and "Traceback" not in err, err[-3000:]
    deadline = time.monotonic() + 15
    while _processes_naming(str(out)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_naming(str(out)) == []


def test_a_hub_round_line_says_what_validation_did_to_each_update() -> None:
    rec = {"round": 3, "members": {"0": {"num-examples": 300, "bytes-up": 31034, "bytes-up-fp32": 123912,
                                         "bytes-down": 1000}},
           "central": {"trouble_score": -0.1},
           "rejected": [{"node": 7, "reason": "update direction: cosine -0.4"}],
           "rescaled": {"1": {"norm": 1336.7, "counted": 0.119}},
           "clipped": {"2": {"claimed": 3e8, "counted": 600.0}}}
    line = fleet.round_line(rec)
    assert line.startswith("round 3: member 0 learned from 300 decisions")
    assert "rejected [{'node': 7, 'reason': 'update direction: cosine -0.4'}]" in line
    assert "member 1's update rescaled from norm 1.34e+03 to 0.119;" in line
    assert "member 2's weight clipped from 300,000,000 to 600;" in line
    assert "rescaled" not in fleet.round_line({"round": 1})  # a round without validation actions
