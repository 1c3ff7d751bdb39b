"""A fedsched fleet on one machine, with kwok (issue 27, items 3/4): member clusters and their hub.

    python -m fedsched.experiment.fleet --members 2 --nodes 120 --pods 400 --minutes 3 --rounds 2

Each member cluster (:func:`member_cluster`), all on loopback, in ``--out`` (default a temporary
directory; every component's log kept there):

- etcd + kube-apiserver (:mod:`.control_plane`, the binaries ``scripts/build_k8s.sh`` builds);
- kwok (:mod:`.kwok`) managing ``--nodes`` simulated nodes from the project's node inventory (a
  synthetic profile of :mod:`fedsched.common.model.synthetic`, or ``openb``: the bundled openb
  GPU cluster), keeping them Ready and moving the pods bound to them through Running to
  Succeeded when their lifetime ends, with per-pod and per-node use;
- a real Prometheus (:mod:`.prometheus`) scraping kwok's kubelet path of every node, with the
  recording rules that give the agent's telemetry its series (:func:`.kwok.recording_rules`);
- ``fedsched serve`` in cluster mode (watches through ``--kubeconfig``, telemetry from that
  Prometheus, HTTPS with mutual TLS from certificates of :mod:`fedsched.common.security.certs`)
  with its decision log, in ``--mode active`` behind the roll-out gate (so in shadow until a
  policy's evidence proves it) or ``--mode shadow``; :meth:`Member.restart_agent` crashes and
  restarts it;
- ``fedsched record`` beside it, recording the member's nodes and pods as its twin (openb CSVs);
- kube-scheduler with the agent's shipped KubeSchedulerConfiguration
  (``agent/deploy/kube-scheduler-config.yaml``: the ``fedsched`` profile, the extender over
  mutual TLS with ``serverName`` checked) made runnable on loopback (the extender's address, the
  TLS files, the kubeconfig; leader election off);
- the workload generator (:func:`run_workload`): the profile's pods in the order of their
  arrival times (compressed ``--speed`` times), each with ``schedulerName: fedsched``, its
  lifetime (the trace's, compressed the same way, times ``--lifetime-scale``) and its use (the
  level the project's usage model gives it,
  :meth:`fedsched.common.sim.replay.simulator.ReplaySimulator.expected_use`) in kwok's
  annotations; pods that completed are deleted.

The hub (:mod:`.hub`): a SuperLink with SuperNode authentication behind the mutual-TLS gateway,
and per member a stunnel sidecar and a registered SuperNode whose node config names the member's
decision log, its recorded twin with the clock it was recorded on (``recording-speed``: the
workload's ``--speed``, so the twin judges it on the trace's time scale) and the served policy's
path. :func:`federate` runs ``--rounds``
rounds of the fedsched app after ``--warmup`` seconds of workload: each member learns from its
log's outcomes, uploads over mutual TLS, the hub aggregates, the member writes its personalised
policy with the evidence of its twin, ``fedsched serve`` hot-reloads it and the gate decides.
It prints each served-policy change with the gate's verdict and reason as it happens, each
round's uploads (bytes, INT8 against fp32) and the hub's central trouble score, and a summary:
pods bound and completed, decisions with outcomes, what the telemetry saw, the served policy
and its verdict, the agent's decisions by mode and source of the scores (``active/policy``: the
policy's scores reached kube-scheduler), the real run's trouble figures from Prometheus
(:func:`trouble`), the bytes.

May import ``fedsched.common``, ``fedsched.agent`` and ``fedsched.coordinator`` (the experiment
package's rule); starts ``fedsched serve``, ``fedsched record`` and the Flower CLIs as processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from urllib.parse import quote

import numpy as np
import yaml

from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.common.learning.decision_log import DecisionLog
from fedsched.common.model.cluster import NodeTable, Pod, PodTable
from fedsched.common.model.synthetic import generate_cluster, write_csvs
from fedsched.common.model.traces import builtin_trace, fits_somewhere, load_nodes, load_pods, slice_cluster
from fedsched.common.schedulers import default_policy_path
from fedsched.common.security import certs
from fedsched.common.sim.replay.simulator import ReplaySimulator
from fedsched.experiment import kwok
from fedsched.experiment.control_plane import (
    ROOT,
    ControlPlane,
    KubeAPI,
    control_plane,
    kube_scheduler,
    scheduler_config_for,
)
from fedsched.experiment.flower import BIN
from fedsched.experiment.hub import CONNECTION, Hub, start_hub
from fedsched.experiment.processes import HOST, free_port, stopped_by_signals, tail, wait_for
from fedsched.experiment.prometheus import PrometheusServer, running_prometheus

__all__ = ["Member", "Workload", "load_inventory", "main", "member_cluster", "run_workload"]

NAMESPACE = "fleet"
SCHEDULER = "fedsched"
#: The extender Service name of the agent chart: kept as the TLS serverName kube-scheduler checks.
EXTENDER_HOST = "fedsched-agent.fedsched-system.svc"


# ---- the inventory and the trace ------------------------------------------------------------

def load_inventory(profile: str, n_nodes: int, n_pods: int, seed: int) -> tuple[NodeTable, PodTable]:
    """Nodes and pods of a synthetic profile (web, gpu, edge), or of the bundled openb GPU cluster
    (``openb``: a random slice of its nodes, its default pods that fit one of them)."""
    if profile == "openb":
        all_nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
        nodes = slice_cluster(all_nodes, n_nodes, seed)
        pods = fits_somewhere(load_pods(builtin_trace("openb_pod_list_default.csv"), all_nodes), nodes)
        return nodes, pods.select(np.arange(min(n_pods, len(pods))))
    return generate_cluster(profile, seed, n_nodes=n_nodes, n_pods=n_pods)


@dataclass
class Workload:
    """The pods to submit: arrival and lifetime in wall seconds from the start, use in milli-cores
    and MiB (the usage model's level of each pod)."""

    pods: PodTable
    arrival: np.ndarray
    lifetime: np.ndarray
    cpu_use: np.ndarray  # milli
    mem_use: np.ndarray  # MiB
    speed: float = 1.0  # trace seconds per wall second (the twin stretches its recording back by it)

    @classmethod
    def from_trace(cls, nodes: NodeTable, pods: PodTable, speed: float, seed: int,
                   default_lifetime_s: float = 3600.0) -> Workload:
        creation = np.nan_to_num(pods.creation.astype(float), nan=0.0)
        deletion = pods.deletion.astype(float)
        known = np.isfinite(deletion) & (deletion > creation)
        life = np.where(known, deletion - creation, default_lifetime_s)
        order = np.argsort(creation, kind="stable")
        pods = pods.select(order)
        creation, life = creation[order], life[order]
        cpu, mem = ReplaySimulator(nodes, pods, seed=seed).expected_use(np.arange(len(pods)))
        arrival = (creation - creation.min(initial=0.0)) / speed
        return cls(pods, arrival, np.maximum(life / speed, 2.0), cpu, mem, speed)


# ---- the member cluster -------------------------------------------------------------------------

@dataclass
class Member:
    """One running member cluster."""

    name: str
    cp: ControlPlane
    kwok: kwok.Kwok
    prometheus: PrometheusServer
    serve_url: str
    decision_log: Path
    ca: Path
    client: certs.CertFiles  # kube-scheduler's client certificate (also reads the agent's /metrics)
    nodes: NodeTable
    served_policy: Path
    twin: Path  # fedsched record's output (nodes.csv, pods.csv)
    serve_argv: list[str]
    serve_proc: subprocess.Popen
    serve_log: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def api(self) -> KubeAPI:
        return self.cp.api

    def restart_agent(self, kill: bool = True) -> float:
        """Stop ``fedsched serve`` (SIGKILL with ``kill``: a crash; else SIGTERM) and start it
        again with the same arguments on the same port; returns the seconds it was away."""
        t0 = time.monotonic()
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.serve_proc.pid, signal.SIGKILL)
            self.serve_proc.wait(30)
        else:
            self.cp.procs.stop(self.serve_proc, 30)
        offset = self.serve_log.stat().st_size
        self.serve_proc, self.serve_log = self.cp.procs.start("fedsched-serve", self.serve_argv, env=_env())
        _wait_listening(self.serve_proc, self.serve_log, offset=offset)
        return time.monotonic() - t0

    def agent_get(self, path: str) -> str:
        """GET on ``fedsched serve`` over mutual TLS (kube-scheduler's certificate)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.check_hostname = False
        ctx.load_cert_chain(str(self.client.cert), str(self.client.key))
        base = self.serve_url.rsplit("/scheduler", 1)[0]
        with urllib.request.urlopen(base + path, context=ctx, timeout=10) as r:
            return r.read().decode()


def _fedsched() -> str:
    exe = shutil.which("fedsched") or str(Path(sys.executable).parent / "fedsched")
    if not Path(exe).exists():
        raise RuntimeError("the fedsched console script is not installed (pip install -e .)")
    return exe


def scheduler_config(cp: ControlPlane, serve_port: int, ca: Path, client: certs.CertFiles) -> dict:
    """The agent's shipped KubeSchedulerConfiguration on loopback: the extender at
    ``serve_port`` (its serverName kept), the TLS files, the kubeconfig, no leader election."""
    text = (resources.files("fedsched.agent") / "deploy" / "kube-scheduler-config.yaml").read_text()
    config = scheduler_config_for(cp, yaml.safe_load(text))
    config["leaderElection"] = {"leaderElect": False}
    for ext in config.get("extenders", []):
        ext["urlPrefix"] = f"https://{HOST}:{serve_port}/scheduler"
        ext["tlsConfig"].update(certFile=str(client.cert), keyFile=str(client.key), caFile=str(ca),
                                serverName=EXTENDER_HOST)
    return config


def _wait_listening(proc: subprocess.Popen, log: Path, timeout: float = 180.0, offset: int = 0) -> str:
    def line() -> str:
        if proc.poll() is not None:
            raise RuntimeError(f"fedsched serve exited with {proc.returncode}:\n{tail(log)}")
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        for ln in text.splitlines():
            if "listening on " in ln:
                return ln.split("listening on ")[1].split()[0]
        return ""

    return wait_for(line, timeout, 0.5, "fedsched serve listening")


@contextlib.contextmanager
def member_cluster(root: Path, name: str, nodes: NodeTable, *, policy: Path | None = None,
                   mode: str = "shadow", scrape_interval: str = "5s",
                   serve_args: tuple[str, ...] = ()) -> Iterator[Member]:
    """Start a member cluster in ``root`` (see the module docstring); stop it on exit."""
    root.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    with control_plane(root / "k8s") as cp, kwok.start_kwok(cp) as kw:
        timings["control plane + kwok"] = time.monotonic() - t0
        timings["nodes Ready"] = kwok.register_nodes(cp.api, nodes)
        cp.api.ensure_namespace(NAMESPACE)
        pki = root / "pki"
        certs.init_ca(pki, force=True)
        certs.issue(pki, "fedsched-extender", kind="server", hosts=[EXTENDER_HOST], ips=[HOST])
        certs.issue(pki, "kube-scheduler")
        ca = certs.ca_files(pki).cert
        server = certs.leaf_files(pki, "fedsched-extender", "server")
        client = certs.leaf_files(pki, "kube-scheduler", "client")
        targets = kwok.write_targets(root / "targets.json", kw, list(nodes.names))
        t1 = time.monotonic()
        with running_prometheus(root / "prometheus", kwok.scrape_configs(targets), kwok.recording_rules(),
                                interval=scrape_interval) as prom:
            timings["prometheus"] = time.monotonic() - t1
            served_policy = root / "policy" / "policy.pt"
            served_policy.parent.mkdir(exist_ok=True)
            shutil.copyfile(policy or default_policy_path(), served_policy)
            decision_log = root / "decision-log"
            port = free_port()
            t2 = time.monotonic()
            argv = [
                _fedsched(), "serve", "--kubeconfig", str(cp.kubeconfig), "--prometheus", prom.url,
                "--tls-cert", str(server.cert), "--tls-key", str(server.key), "--client-ca", str(ca),
                "--port", str(port), "--mode", mode, "--policy", str(served_policy),
                "--decision-log", str(decision_log), "--scheduler-name", SCHEDULER,
                "--admin-clients", "kube-scheduler", *serve_args]
            proc, log = cp.procs.start("fedsched-serve", argv, env=_env())
            url = _wait_listening(proc, log)
            timings["fedsched serve"] = time.monotonic() - t2
            # the member's twin, recorded beside the agent (fedsched record)
            twin = root / "twin"
            cp.procs.start("fedsched-record", [
                _fedsched(), "record", "--out", str(twin), "--kubeconfig", str(cp.kubeconfig),
                "--namespace", NAMESPACE, "--prometheus", prom.url, "--telemetry-interval", "5",
                "--flush-interval", "5"], env=_env())
            cfg = root / "kube-scheduler.yaml"
            cfg.write_text(yaml.safe_dump(scheduler_config(cp, port, ca, client), sort_keys=False))
            t3 = time.monotonic()
            with kube_scheduler(cp, "kube-scheduler", [f"--config={cfg}"]):
                timings["kube-scheduler"] = time.monotonic() - t3
                yield Member(name, cp, kw, prom, url, decision_log, ca, client, nodes, served_policy, twin,
                             argv, proc, log, timings)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---- the workload generator ------------------------------------------------------------------

@dataclass
class Tally:
    submitted: int = 0
    bound: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    deleted: int = 0
    nodes_used: int = 0


def _pod_object(work: Workload, i: int, models: tuple[str, ...]) -> dict:
    name = f"p{i:05d}"
    obj = pod_to_json(Pod.from_table(work.pods, i), name, models, NAMESPACE, scheduler_name=SCHEDULER)
    obj["metadata"].pop("uid", None)
    obj.pop("status", None)
    obj["metadata"]["annotations"].update(
        kwok.pod_annotations(work.lifetime[i], work.cpu_use[i], work.mem_use[i]))
    return {"apiVersion": "v1", "kind": "Pod", **obj}


def _count(api: KubeAPI, tally: Tally) -> None:
    pods = api.pods(NAMESPACE)
    phases = [p.get("status", {}).get("phase", "") for p in pods]
    bound = [p for p in pods if p["spec"].get("nodeName")]
    tally.pending = sum(1 for p in pods if not p["spec"].get("nodeName"))
    tally.running = phases.count("Running")
    tally.nodes_used = len({p["spec"]["nodeName"] for p in bound if p["status"].get("phase") == "Running"})
    for p in pods:
        if p.get("status", {}).get("phase") == "Succeeded":
            api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{quote(p['metadata']['name'])}")
            tally.succeeded += 1
            tally.deleted += 1


def run_workload(member: Member, work: Workload, seconds: float, report_every: float = 15.0,
                 out=sys.stdout) -> Tally:
    """Submit the pods of ``work`` at their arrival times for ``seconds`` (or until all are
    submitted and none is pending); delete the completed ones; print progress."""
    tally = Tally()
    models = member.nodes.models
    t0 = time.monotonic()
    nxt = 0
    last_report = t0
    bound_seen: set[str] = set()
    while True:
        now = time.monotonic() - t0
        while nxt < len(work.pods) and work.arrival[nxt] <= now:
            member.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", _pod_object(work, nxt, models),
                               ok=(201, 409))
            tally.submitted += 1
            nxt += 1
        since = time.monotonic() - last_report
        if since >= report_every or (nxt == len(work.pods) and since >= 1.0) or now >= seconds:
            _count(member.api, tally)
            bound_seen.update(e["involvedObject"]["name"] for e in member.api.items(
                f"/api/v1/namespaces/{NAMESPACE}/events", fieldSelector="reason=Scheduled"))
            tally.bound = len(bound_seen)
            last_report = time.monotonic()
            print(f"[{member.name} {now:6.0f}s] submitted {tally.submitted} bound {tally.bound} pending "
                  f"{tally.pending} running {tally.running} on {tally.nodes_used} nodes, completed "
                  f"{tally.succeeded}", file=out, flush=True)
            if now >= seconds or (nxt == len(work.pods) and tally.pending == 0):
                return tally
        time.sleep(0.2)


def decision_log_summary(member: Member) -> dict[str, object]:
    """Decisions in the agent's decision log, how many carry an outcome (a known reward term),
    and the reward terms seen (read beside the agent: the log allows readers)."""
    if not member.decision_log.exists():
        return {"decisions": 0, "with_outcome": 0, "reward_terms": []}
    records = DecisionLog(member.decision_log).tail_records(1_000_000)
    terms = sorted({k for r in records for k in r.reward})
    return {"decisions": len(records), "with_outcome": sum(1 for r in records if r.reward),
            "reward_terms": terms}


def served_state(member: Member) -> dict[str, object]:
    """What the agent serves now, from its /metrics: the model version, the gate's verdict
    (active or shadow, its reason), the reloads so far, and the decisions so far by mode and
    source of the scores kube-scheduler got (``active/policy``: the policy's)."""
    text = member.agent_get("/metrics")
    out: dict[str, object] = {"version": "", "active": None, "reason": "", "reloads": 0.0, "decisions": {}}
    if m := re.search(r'^fedsched_model_info\{model_version="([^"]*)"', text, re.M):
        out["version"] = m.group(1)
    for m in re.finditer(r'^fedsched_policy_active\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("model_version") == out["version"]:
            out["active"], out["reason"] = float(m.group(2)) == 1.0, labels.get("reason", "")
    out["reloads"] = sum(float(v) for v in re.findall(
        r'^fedsched_model_reloads_total\{[^}]*result="ok"[^}]*\} (\S+)$', text, re.M))
    decisions: dict[str, float] = {}
    for m in re.finditer(r'^fedsched_decisions_total\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        key = f"{labels.get('mode', '')}/{labels.get('source', '')}"
        decisions[key] = decisions.get(key, 0.0) + float(m.group(2))
    out["decisions"] = decisions  # over every model version; active/policy: the policy's scores
    return out


@dataclass
class Federation:
    """The rounds of one ``flwr run``: the run's status, the hub's per-round records, and every
    change of the served model each member saw (time, version, gate verdict)."""

    status: str
    rounds: list[dict]
    served: dict[str, list[dict]]
    seconds: float


def federate(members: list[Member], hub: Hub, works: list[Workload], rounds: int, root: Path, *,
             window: int = 2000, run_config: dict[str, object] | None = None, timeout: float = 900.0,
             out=sys.stdout) -> Federation:
    """Join each of ``members`` to ``hub`` (its sidecar and a registered SuperNode whose node
    config names its decision log, its recorded twin (``fedsched record``'s output, or its trace
    when nothing is recorded yet) and the served policy's path) and run ``rounds`` rounds of the
    fedsched app; prints each change of a member's served model as it happens."""
    root.mkdir(parents=True, exist_ok=True)
    for i, (member, work) in enumerate(zip(members, works, strict=True)):
        twin_nodes, twin_pods = member.twin / "nodes.csv", member.twin / "pods.csv"
        speed = work.speed  # the recording ran on the compressed clock
        if not (twin_nodes.exists() and twin_pods.exists()):
            twin_nodes, twin_pods = write_csvs(member.nodes, work.pods, root / "twin", member.name)
            speed = 1.0  # the trace itself: its own clock
        hub.link(member.name)
        hub.start_supernode(member.name, {
            "cluster-name": member.name, "nodes-csv": str(twin_nodes), "pods-csv": str(twin_pods),
            "recording-speed": speed, "decision-log": str(member.decision_log), "window": window,
            "serve-policy": str(member.served_policy), "partition-id": i})
    hub.wait_online(len(members))
    cfg = {"num-server-rounds": rounds, "min-nodes": len(members), "mode": "online", "local-epochs": 1,
           "finetune-epochs": 2, "out-dir": str(root / "hub-out"), "state-dir": str(root / "state"),
           **(run_config or {})}
    arg = " ".join(f"{k}='{v}'" if isinstance(v, str) else f"{k}={v}" for k, v in cfg.items())
    log = root / "flwr-run.log"
    t0 = time.monotonic()
    served = {m.name: [{"t": 0.0, **served_state(m)}] for m in members}
    for m in members:
        first = served[m.name][0]
        print(f"[{m.name}] before round 1: serving {first['version']} "
              f"({'ACTIVE' if first['active'] else 'shadow'}: {first['reason']})", file=out, flush=True)
    with log.open("w") as f:
        proc = subprocess.Popen(
            [str(BIN / "flwr"), "run", str(ROOT), CONNECTION, "--stream", "--run-config", arg],
            env=hub.flwr_env, cwd=hub.root, stdout=f, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None and time.monotonic() - t0 < timeout:
                time.sleep(2.0)
                for m in members:
                    with contextlib.suppress(OSError):
                        now, seen = served_state(m), served[m.name]
                        if now["active"] is None:  # reloaded, the gate's verdict not yet published
                            continue
                        if now["version"] != seen[-1]["version"] or now["active"] != seen[-1]["active"]:
                            seen.append({"t": time.monotonic() - t0, **now})
                            verdict = "ACTIVE" if now["active"] else "shadow"
                            print(f"[{m.name} {seen[-1]['t']:5.0f}s into the run] policy {now['version']} "
                                  f"hot-reloaded ({now['reloads']:.0f} reloads); gate: {verdict} "
                                  f"({now['reason']})", file=out, flush=True)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    listing = hub.flwr("ls", CONNECTION, "--format", "json")
    runs = json.loads(listing.stdout or "{}").get("runs", [])
    status = runs[-1]["status"] if runs else f"no run listed:\n{listing.stdout}{listing.stderr}"
    rounds_file = root / "hub-out" / "rounds.json"
    recs = json.loads(rounds_file.read_text()) if rounds_file.exists() else []
    return Federation(status, recs, served, time.monotonic() - t0)


def round_line(rec: dict) -> str:
    """One line of a hub round record: each member's examples, bytes up (INT8 vs fp32) and
    down, the hub's central trouble score and what its validation did to updates (rejected,
    rescaled to the others' median norm, weights clipped)."""
    parts = [f"round {rec.get('round')}:"]
    for pid, m in sorted((rec.get("members") or {}).items()):
        parts.append(f"member {pid} learned from {m.get('num-examples', 0):.0f} decisions, sent "
                     f"{m.get('bytes-up', 0):,.0f} B (fp32 {m.get('bytes-up-fp32', 0):,.0f} B), got "
                     f"{m.get('bytes-down', 0):,.0f} B;")
    central = rec.get("central") or {}
    if "trouble_score" in central:
        parts.append(f"hub's central trouble score {central['trouble_score']:+.3f}")
    if rec.get("rejected"):
        parts.append(f"rejected {rec['rejected']}")
    for pid, r in sorted((rec.get("rescaled") or {}).items()):
        parts.append(f"member {pid}'s update rescaled from norm {r['norm']:.3g} to {r['counted']:.3g};")
    for pid, c in sorted((rec.get("clipped") or {}).items()):
        parts.append(f"member {pid}'s weight clipped from {c['claimed']:,.0f} to {c['counted']:,.0f};")
    return " ".join(parts)


def trouble(member: Member, seconds: float, hot: float = 0.85) -> dict[str, float]:
    """The real run's trouble figures from the member's Prometheus over the last ``seconds``:
    node-seconds above ``hot`` CPU, the mean and the largest node CPU use (kwok emulates no OOM
    kills nor throttling: those stay out)."""
    w = f"{max(10, int(seconds))}s"
    q = member.prometheus.query

    def one(promql: str) -> float:
        r = q(promql)
        return float(r[0]["value"][1]) if r else 0.0

    return {"hot_node_seconds": one(f"sum(count_over_time((instance:node_cpu:ratio > {hot})[{w}:5s])) * 5"),
            "mean_node_cpu": one(f"avg(avg_over_time(instance:node_cpu:ratio[{w}]))"),
            "max_node_cpu": one(f"max(max_over_time(instance:node_cpu:ratio[{w}]))")}


def _metric_lines(text: str, prefixes: tuple[str, ...]) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefixes)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedsched.experiment.fleet",
                                 description="a fedsched fleet on one machine: kwok members and their hub")
    ap.add_argument("--members", type=int, default=2, help="member clusters")
    ap.add_argument("--profile", default="web", help="web, gpu, edge (synthetic) or openb (bundled trace)")
    ap.add_argument("--nodes", type=int, default=120, help="kwok nodes per member")
    ap.add_argument("--pods", type=int, default=400, help="pods per member")
    ap.add_argument("--speed", type=float, default=None,
                    help="trace seconds per wall second (default: every arrival within 80%% of the run)")
    ap.add_argument("--minutes", type=float, default=3.0, help="how long the workload runs")
    ap.add_argument("--lifetime-scale", type=float, default=1.0,
                    help="multiply the pods' (compressed) lifetimes: more pods run at once, a busier cluster")
    ap.add_argument("--rounds", type=int, default=2, help="federated rounds with the hub (0: none)")
    ap.add_argument("--warmup", type=float, default=45.0,
                    help="seconds of workload before the first round (the decision logs fill)")
    ap.add_argument("--mode", default="active",
                    help="fedsched serve --mode: active (the gate decides; shadow until a policy is "
                         "proven) or shadow")
    ap.add_argument("--outcome-horizon", type=float, default=20.0,
                    help="seconds after binding at which the agent logs a decision's outcome")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report-every", type=float, default=15.0)
    ap.add_argument("--out", default=None, help="working directory (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    try:
        with stopped_by_signals():  # Ctrl-C, SIGTERM: the with blocks stop every service on the way out
            return _run(args)
    except KeyboardInterrupt:
        print("fleet: interrupted; stopped every process it started", file=sys.stderr, flush=True)
        return 130
    except RuntimeError as e:  # a service or a member's workload failed: every service was stopped too
        print(f"fleet: error: {e}", file=sys.stderr, flush=True)
        return 1


def _run(args: argparse.Namespace) -> int:
    works, inventories = [], []
    for i in range(args.members):  # each member its own cluster and trace (seed + i)
        nodes, pods = load_inventory(args.profile, args.nodes, args.pods, args.seed + i)
        creation = np.nan_to_num(pods.creation.astype(float), nan=0.0)
        span = float(creation.max(initial=0.0) - creation.min(initial=0.0))
        speed = args.speed or max(1.0, span / (0.8 * args.minutes * 60))
        works.append(Workload.from_trace(nodes, pods, speed, args.seed + i))
        works[-1].lifetime *= args.lifetime_scale
        inventories.append(nodes)
        print(f"fleet: member-{i} with {len(nodes)} kwok nodes ({args.profile}), {len(pods)} pods over "
              f"{works[-1].arrival.max(initial=0):.0f} s (trace time / {speed:.0f})", flush=True)
    with contextlib.ExitStack() as stack:
        root = Path(args.out) if args.out else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        members = []
        for i, nodes in enumerate(inventories):
            t0 = time.monotonic()
            members.append(stack.enter_context(member_cluster(
                root / f"member-{i}", f"member-{i}", nodes, mode=args.mode,
                serve_args=("--outcome-horizon", str(args.outcome_horizon), "--watch-policy", "2"))))
            print(f"fleet: member-{i} up in {time.monotonic() - t0:.0f} s (" + ", ".join(
                f"{k} {v:.1f} s" for k, v in members[-1].timings.items()) + ")", flush=True)
        hub = stack.enter_context(start_hub(root / "hub")) if args.rounds > 0 else None
        tallies: dict[str, Tally] = {}
        failed: dict[str, BaseException] = {}

        def drive(m: Member, w: Workload) -> None:  # a failure is the main thread's to report
            try:
                tallies[m.name] = run_workload(m, w, args.minutes * 60, args.report_every)
            except Exception as e:  # any failure ends the fleet's run, its member named
                failed[m.name] = e

        workers = [threading.Thread(target=drive, args=(m, w), daemon=True)
                   for m, w in zip(members, works, strict=True)]
        t_start = time.monotonic()
        for w in workers:
            w.start()
        fed = None
        if hub is not None:
            time.sleep(max(0.0, args.warmup - (time.monotonic() - t_start)))
            fed = federate(members, hub, works, args.rounds, root / "federation")
            print(f"[hub] run {fed.status} in {fed.seconds:.0f} s", flush=True)
            for r in fed.rounds:
                print("[hub] " + round_line(r), flush=True)
        for w in workers:
            w.join()
        if failed:
            name, err = next(iter(failed.items()))
            raise RuntimeError(f"{name}'s workload failed: {type(err).__name__}: {err}") from err
        ran = time.monotonic() - t_start
        summary = {}
        for m in members:
            summary[m.name] = {
                "nodes": len(m.nodes), "pods": tallies.get(m.name, Tally()).__dict__,
                "decision_log": decision_log_summary(m),
                "telemetry_nodes": len(m.prometheus.query("node_memory_MemTotal_bytes")),
                "served": served_state(m), "trouble": trouble(m, ran),
                "policy_changes": len(fed.served[m.name]) - 1 if fed else 0,
            }
        if fed is not None:
            summary["hub"] = {"status": fed.status, "rounds": len(fed.rounds), "seconds": round(fed.seconds),
                              "bytes_up": sum(m.get("bytes-up", 0) for r in fed.rounds
                                              for m in (r.get("members") or {}).values()),
                              "bytes_up_fp32": sum(m.get("bytes-up-fp32", 0) for r in fed.rounds
                                                   for m in (r.get("members") or {}).values())}
        print("fleet: summary " + json.dumps(summary, indent=1, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
