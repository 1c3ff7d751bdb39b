"""End to end on loopback, with what the charts render: two federated rounds to
``finished:completed`` through the hub chart's SuperLink, SuperExec and Fleet gateway (nginx)
and the agent chart's stunnel sidecar and SuperNode::

    SuperNode --TLS--> stunnel sidecar --mTLS--> nginx gateway --TLS--> SuperLink <-- SuperExec (ServerApp)

Every process runs the command, arguments, environment and working directory of its rendered
container, and nginx and stunnel the configs of the rendered ConfigMaps; only the in-pod mount
points, ports and Service names are mapped to a temporary directory, free loopback ports and
``localhost`` (:class:`bench.harness.charts.Localizer`). The certificates stand in for
the Secrets (one CA, from ``fedsched certs``' code). The member key is registered by the hub
chart's registration Job script, twice (it must be idempotent); the hub chart's ``helm test``
script then checks the running hub. The member learns from a decision log on its PVC and
writes the personalised policy its extender serves; the hub's checkpoints land on the
SuperExec's PVC. Runs as root in CI, so nginx gets ``user root;`` (as tests/coordinator/
test_mtls.py does; the pod runs as uid 10001 and never switches users).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.harness.charts import (
    AGENT,
    HUB,
    NAMESPACE,
    Localizer,
    documents,
    fullname,
    load_values,
    one,
    tls_secret,
    write_secret,
)
from bench.harness.ports import free_port
from bench.harness.processes import Procs, tail
from fedsched.common.security import certs
from fedsched.coordinator import chart_configs
from tests.charts.chart_support import argv, container, merge, render
from tests.flower_support import (
    FLOWER_ENV,
    HOST,
    NGINX,
    STUNNEL,
    ec_auth_key,
    missing_tools,
    run_federation,
    wait_online,
    wait_port,
    write_connection,
)
from tests.paths import REPO

pytestmark = [pytest.mark.skipif(bool(missing_tools("flower-superexec")), reason="; ".join(
    missing_tools("flower-superexec")))]

HUB_FULL, AGENT_FULL = fullname(HUB), fullname(AGENT)
SL_SVC = chart_configs.superlink_host(HUB_FULL, NAMESPACE)
GW_SVC = f"{HUB_FULL}-gateway.{NAMESPACE}.svc"
HUB_PUBLIC = "fleet.example.com"
CLUSTER = "cluster-a"
#: Margins for a loaded machine, not speeds: each wait returns as soon as its step is done (on an
#: idle 2-core machine the run takes about 40 s and each start a few seconds), and a step whose
#: process exits fails at once, so only a hang waits this long. At a load of 10 the same steps
#: took several times longer; these leave them 20x and more.
RUN_TIMEOUT = 1200
START_TIMEOUT = 300
#: Small rounds: two of them, one member, a small central evaluation.
RUN_CONFIG = ("num-server-rounds=2 min-nodes=1 local-decisions=20 scarce-decisions=10 local-epochs=1 "
              'member-size="small"')
#: The span of the member's recorded pods, hours (see :func:`member_data`).
MEMBER_TRACE_HOURS = 2.0


@dataclass
class Fleet:
    root: Path
    procs: Procs
    hub: list[dict[str, Any]]
    agent: list[dict[str, Any]]
    operator_env: dict[str, str]
    checkpoints: Path
    member_data: Path
    registrations: list[subprocess.CompletedProcess]  # the registration Job's script, run twice
    smoke_test: list[str]
    diagnostics: list[Path]


def flower_env(loc: Localizer, c: dict[str, Any]) -> dict[str, str]:
    env = loc.env(c, {**os.environ})
    for key in ("FLWR_HOME", "HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    return env


def member_data(data: Path, nodes_csv: Path, pods_csv: Path) -> None:
    """What a member's PVC holds after some time in shadow mode: its cluster (openb-schema CSVs)
    and a decision log with outcomes, as tests/agent/federation/test_client_app.py builds them.
    Its recent pods span two hours (the GPU profile's default is a week): every round the member
    judges the policy it writes on its validation pods (the roll-out gate's evidence, replays of
    their whole span); on a week of pods that took about 25 s a round, on two hours about 1 s."""
    from fedsched.common.model.synthetic import generate_cluster, write_csvs
    from tests.builders import log_with_outcomes

    nodes, pods = generate_cluster("gpu", seed=3, n_nodes=16, n_pods=120, trace_hours=MEMBER_TRACE_HOURS)
    n_csv, p_csv = write_csvs(nodes, pods, nodes_csv.parent, "member")
    n_csv.rename(nodes_csv)
    p_csv.rename(pods_csv)
    log_with_outcomes(data / "decisions", nodes, pods, 200)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("chart-fleet")
    logs, keys, pki = root / "logs", root / "keys", root / "pki"
    logs.mkdir()
    keys.mkdir()
    node_key, node_pub = ec_auth_key(keys, "node")
    # The charts, rendered with a member key to register and the member's data on its PVC.
    hub_values = merge(load_values(HUB, "defaults-values.yaml"), {
        "registration": {"enabled": True, "publicKeys": {CLUSTER: node_pub.read_text().strip()}}})
    agent_values = merge(load_values(AGENT, "defaults-values.yaml"), {"federation": {
        "clusterName": CLUSTER, "hub": {"host": HUB_PUBLIC, "port": 443},
        "data": {"nodesCsv": "/var/lib/fedsched/data/nodes.csv",
                 "podsCsv": "/var/lib/fedsched/data/pods.csv"}}})
    hub = documents(render(HUB, hub_values))
    agent = documents(render(AGENT, agent_values))
    # The Secrets: one CA; the SuperLink and the gateway share the hub certificate here.
    certs.init_ca(pki, hub_hosts=["localhost", SL_SVC, HUB_PUBLIC], hub_ips=[HOST])
    ca, hub_cert = certs.ca_files(pki).cert, certs.hub_files(pki)
    client = certs.issue(pki, CLUSTER).files
    sidecar = certs.issue(pki, "sidecar", kind="server", hosts=["localhost"], ips=[HOST]).files
    s = root / "secrets"
    ports = {name: free_port()
             for name in ("sl", "sl_health", "se_health", "gw", "sc", "hop", "sn", "sn_health")}
    paths = {
        "/etc/fedsched/superlink-tls": tls_secret(s / "superlink-tls", hub_cert, ca),
        "/etc/fedsched/superlink-ca": write_secret(s / "superlink-ca", {"ca.crt": ca}),
        chart_configs.GATEWAY_CERTS_DIR: write_secret(
            s / "gateway", {"hub.crt": hub_cert.cert, "hub.key": hub_cert.key, "ca.crt": ca}),
        chart_configs.SIDECAR_CLIENT_DIR: tls_secret(s / "hub-client", client, ca),
        chart_configs.SIDECAR_SERVER_DIR: tls_secret(s / "sidecar", sidecar, ca),
        "/etc/fedsched/node-key": write_secret(s / "node-key", {"node.key": node_key}),
        "/var/lib/flwr": root / "superlink-pvc", "/var/lib/fedsched-hub": root / "superexec-pvc",
        "/var/lib/fedsched": root / "agent-pvc",
        chart_configs.GATEWAY_CONFIG_DIR: root / "gateway-config",
        chart_configs.GATEWAY_WORKDIR: root / "nginx",
        chart_configs.SIDECAR_CONFIG_DIR: root / "stunnel-config",
        chart_configs.SIDECAR_WORKDIR: root / "stunnel",
        "/etc/fedsched/registration": root / "registration", "/etc/fedsched/test": root / "helm-test",
    }
    for p in paths.values():
        p.mkdir(parents=True, exist_ok=True)
    addresses = {"0.0.0.0": HOST, f"{HUB_PUBLIC}:443": f"{HOST}:{ports['gw']}",
                 f"{GW_SVC}:{hub_values.get('gateway', {}).get('service', {}).get('port', 443)}":
                     f"{HOST}:{ports['gw']}"}

    def localizer(pod: str, health: str | None = None,
                  superlink: str = f"localhost:{ports['sl']}") -> Localizer:
        """One pod's mapping: its own /tmp (emptyDir), its own health port."""
        port_map = {8000: ports["sl"], 9443: ports["gw"], 9092: ports["sc"], 9093: ports["hop"],
                    9094: ports["sn"]}
        if health:
            port_map[8081] = ports[health]
        return Localizer(paths={**paths, "/tmp": root / f"tmp-{pod}"},
                         addresses={**addresses, f"{SL_SVC}:8000": superlink}, ports=port_map)

    procs = Procs(logs)
    base = {**os.environ, **FLOWER_ENV}
    try:
        # -- the hub --
        dep = one(hub, "Deployment", f"{HUB_FULL}-superlink")
        c = container(dep, "superlink")
        loc = localizer("superlink", "sl_health")
        sl, sl_log = procs.start("superlink", loc.argv(argv(c)), env={**base, **flower_env(loc, c)},
                                 cwd=loc.path(c["workingDir"]))
        wait_port(ports["sl"], sl, sl_log, START_TIMEOUT)
        dep = one(hub, "Deployment", f"{HUB_FULL}-superexec")
        c = container(dep, "superexec")
        loc = localizer("superexec", "se_health")
        procs.start("superexec", loc.argv(argv(c)), env={**base, **flower_env(loc, c)},
                    cwd=loc.path(c["workingDir"]))
        # The gateway: the ConfigMap's nginx.conf; nginx connects to the SuperLink on loopback and
        # still verifies it for its Service name.
        loc = localizer("gateway", superlink=f"{HOST}:{ports['sl']}")
        conf = one(hub, "ConfigMap", f"{HUB_FULL}-gateway")["data"]["nginx.conf"]
        conf_file = loc.path(f"{chart_configs.GATEWAY_CONFIG_DIR}/nginx.conf")
        conf_file.write_text(("user root;\n" if os.geteuid() == 0 else "") + loc.text(conf))
        gw_args = loc.argv(argv(container(one(hub, "Deployment", f"{HUB_FULL}-gateway"), "nginx")))
        assert gw_args[0] == "nginx"
        gw, gw_log = procs.start("gateway", [NGINX, *gw_args[1:]])
        wait_port(ports["gw"], gw, gw_log, START_TIMEOUT)
        # The registration Job's script and keys, from its ConfigMap.
        loc = localizer("registration")
        for key, text in one(hub, "ConfigMap", f"{HUB_FULL}-registration")["data"].items():
            (paths["/etc/fedsched/registration"] / key).write_text(text)
        job = container(one(hub, "Job", f"{HUB_FULL}-registration"), "register")
        register = [sys.executable, *loc.argv(argv(job))[1:]]
        register_env = {**base, **flower_env(loc, job)}
        # post-install, then post-upgrade: the second run must find the key and succeed.
        registrations = [subprocess.run(register, env=register_env, capture_output=True, text=True,
                                        timeout=START_TIMEOUT, check=False) for _ in range(2)]
        test_cm = one(hub, "ConfigMap", f"{HUB_FULL}-test")
        (paths["/etc/fedsched/test"] / "smoke_test.py").write_text(test_cm["data"]["smoke_test.py"])
        smoke = [sys.executable, *localizer("test").argv(argv(container(one(hub, "Pod", f"{HUB_FULL}-test"),
                                                                          "smoke-test")))[1:]]
        # -- the member --
        dep = one(agent, "Deployment", AGENT_FULL)
        loc = localizer("agent", "sn_health")
        seed = container(dep, "seed-policy")["command"]
        subprocess.run([sys.executable, *loc.argv(seed)[1:]], check=True, timeout=START_TIMEOUT)
        data = paths["/var/lib/fedsched"]
        (data / "data").mkdir()
        member_data(data, data / "data" / "nodes.csv", data / "data" / "pods.csv")
        stunnel_conf = one(agent, "ConfigMap", f"{AGENT_FULL}-scripts")["data"]["stunnel.conf"]
        loc.path(f"{chart_configs.SIDECAR_CONFIG_DIR}/stunnel.conf").write_text(loc.text(stunnel_conf))
        side_args = loc.argv(argv(container(dep, "hub-sidecar")))
        assert side_args[0] == "stunnel"
        st, _ = procs.start("stunnel", [STUNNEL, *side_args[1:]])
        wait_port(ports["sc"], st, paths[chart_configs.SIDECAR_WORKDIR] / "stunnel.log", START_TIMEOUT)
        c = container(dep, "supernode")
        procs.start("supernode", loc.argv(argv(c)), env={**base, **flower_env(loc, c)},
                    cwd=loc.path(c["workingDir"]))
        operator_home = root / "operator-home"
        write_connection(operator_home, f"localhost:{ports['sl']}", ca)
        yield Fleet(root, procs, hub, agent, {**base, "FLWR_HOME": str(operator_home)},
                    paths["/var/lib/fedsched-hub"], data, registrations, smoke,
                    [*(logs / f"{n}.log" for n in ("supernode", "gateway", "superlink", "superexec")),
                     paths[chart_configs.SIDECAR_WORKDIR] / "stunnel.log"])
    finally:
        procs.stop_all()


def test_two_rounds_through_the_charts_configs(fleet: Fleet) -> None:
    # The registration Job registered the member's key; its second run (helm upgrade) is a no-op.
    first, again = fleet.registrations
    assert first.returncode == 0 and f"{CLUSTER}: registered as SuperNode" in first.stdout, (
        first.stdout + first.stderr)
    assert again.returncode == 0 and f"{CLUSTER}: already registered" in again.stdout, (
        again.stdout + again.stderr)
    wait_online(fleet.operator_env, fleet.root, 1, fleet.diagnostics, timeout=START_TIMEOUT)

    run = run_federation(fleet.operator_env, fleet.root, REPO, RUN_CONFIG, fleet.procs.logs / "flwr-run.log",
                         RUN_TIMEOUT, watch=fleet.procs.procs)
    assert run["status"] == "finished:completed", (
        f"{run['status']}\n{tail(fleet.procs.logs / 'flwr-run.log')}\n"
        + "\n".join(tail(p) for p in fleet.diagnostics))
    # The ServerApp ran in the SuperExec; its checkpoints are on the SuperExec's PVC (working
    # directory + the run config's default out-dir), so a restarted hub resumes from them.
    hub_out = fleet.checkpoints / "fedsched-hub"
    rounds = json.loads((hub_out / "rounds.json").read_text())
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["members"] for r in rounds)
    assert (hub_out / "global.npz").is_file()
    # The member learned from the decision log on its PVC, kept its state there under its
    # cluster name, and wrote the personalised policy its extender serves.
    assert (fleet.member_data / "fedsched-state" / CLUSTER / "local.npz").is_file()
    from fedsched.common.learning.checkpoint import load_checkpoint
    from fedsched.common.schedulers import default_policy_path

    served = fleet.member_data / "policy.pt"
    assert served.read_bytes() != default_policy_path().read_bytes()
    _, meta, _ = load_checkpoint(served)
    assert meta["algorithm"] == "federated-personalised"
    # Every member call went through the gateway (mTLS verified) and only to the Fleet API.
    access = [line for line in (fleet.procs.logs / "gateway.log").read_text().splitlines() if '"POST ' in line
              or '"GET ' in line]
    assert any('"POST /v1/fleet/pull-messages' in line and '" 200 ' in line for line in access)
    assert any('"POST /v1/fleet/push-messages' in line and '" 200 ' in line for line in access)
    assert all("/v1/fleet/" in line for line in access if '" 200 ' in line)


def test_the_hub_helm_test_passes_against_the_running_hub(fleet: Fleet) -> None:
    res = subprocess.run(fleet.smoke_test, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "TLS verified" in res.stdout and "refuses clients without a member certificate" in res.stdout


def test_the_registration_job_fails_when_the_superlink_is_unreachable(tmp_path: Path) -> None:
    """`flwr supernode register --format json` exits 0 even on failure: the Job's script must not."""
    _, pub = ec_auth_key(tmp_path, "key")
    values = merge(load_values(HUB, "defaults-values.yaml"), {
        "registration": {"enabled": True, "publicKeys": {CLUSTER: pub.read_text().strip()}}})
    hub = documents(render(HUB, values))
    reg = tmp_path / "registration"
    reg.mkdir()
    for key, text in one(hub, "ConfigMap", f"{HUB_FULL}-registration")["data"].items():
        (reg / key).write_text(text)
    pki = tmp_path / "pki"
    certs.init_ca(pki)
    loc = Localizer(paths={"/etc/fedsched/registration": reg, "/tmp": tmp_path / "tmp",
                           "/etc/fedsched/superlink-ca": write_secret(tmp_path / "ca", {
                               "ca.crt": certs.ca_files(pki).cert})},
                    addresses={f"{SL_SVC}:8000": f"{HOST}:{free_port()}"})  # nothing listens there
    job = container(one(hub, "Job", f"{HUB_FULL}-registration"), "register")
    res = subprocess.run([sys.executable, *loc.argv(argv(job))[1:]], env=flower_env(loc, job),
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{CLUSTER}: registration failed" in res.stderr
