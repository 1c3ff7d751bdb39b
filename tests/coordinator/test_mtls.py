"""Integration test of the hub link's mutual TLS around a real Flower 1.42 deployment.

Everything runs on loopback ports picked at start-up::

    flower-supernode (x2) --TLS--> stunnel sidecar (x2) --mTLS--> nginx ingress --TLS--> flower-superlink
    flwr CLI (run / ls / supernode register) --TLS--> flower-superlink (Control API, hub side only)

The SuperLink has SuperNode authentication on; both SuperNodes' EC keys are registered with
``flwr supernode register``. Two federated rounds of the fedsched app run through this path;
then the ingress must refuse a member without a client certificate, with a certificate of
another CA, with an expired certificate, an unregistered SuperNode key, and any path outside
the Fleet API (the Control API in particular). Skips only when nginx or stunnel is missing.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.harness.ports import free_port
from bench.harness.processes import Procs, tail
from fedsched.common.security import certs
from fedsched.coordinator.mtls import nginx_conf, stunnel_conf
from tests.flower_support import (
    BIN,
    FLOWER_ENV,
    HOST,
    NGINX,
    STUNNEL,
    ec_auth_key,
    flwr,
    missing_tools,
    wait_port,
    write_connection,
)
from tests.flower_support import online_nodes as _online_nodes
from tests.flower_support import wait_online as _wait_online
from tests.paths import REPO

APP_DIR = REPO

pytestmark = [pytest.mark.skipif(bool(missing_tools()), reason="; ".join(missing_tools()))]

RUN_TIMEOUT = 150  # flwr run of 2 tiny rounds (about 40 s here)
RUN_CONFIG = {"num-server-rounds": 2, "min-nodes": 2, "local-decisions": 20, "scarce-decisions": 10,
              "local-epochs": 1}


@dataclass
class Hub:
    root: Path
    certs: Path
    procs: Procs
    superlink_port: int
    ingress_port: int
    sidecar_ports: dict[str, int]
    flwr_env: dict[str, str]
    node_env: dict[str, str]
    nginx_dir: Path

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return flwr(self.flwr_env, self.root, *args, timeout=timeout)

    def supernode(self, name: str, key: Path, sidecar: str, partition: int, *extra: str):
        runtime_port = free_port()
        return self.procs.start(name, [
            str(BIN / "flower-supernode"), "--superlink", f"{HOST}:{self.sidecar_ports[sidecar]}",
            "--root-certificates", str(self.certs / certs.CA_CRT),
            "--auth-supernode-private-key", str(key),
            "--node-config", f"partition-id={partition} num-partitions=2",
            "--host", HOST, "--port", str(runtime_port), *extra,
        ], env=self.node_env)


def https(port: int, path: str, *, cert: certs.CertFiles | None = None, ca: Path, method: str = "POST",
          body: bytes = b"") -> tuple[int, str]:
    """One HTTPS request straight to the ingress (the member side of the link, without a sidecar)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    conn = http.client.HTTPSConnection(HOST, port, context=ctx, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/protobuf"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Hub:
    root = tmp_path_factory.mktemp("mtls")
    cdir, logs = root / "certs", root / "logs"
    logs.mkdir()
    certs.init_ca(cdir, hub_hosts=["localhost"], hub_ips=[HOST])
    for member in ("cluster-a", "cluster-b"):
        certs.issue(cdir, member)  # the cluster's client certificate for the hub link
        certs.issue(cdir, f"sidecar-{member[-1]}", kind="server", hosts=["localhost"], ips=[HOST])
    procs = Procs(logs)
    base_env = {**os.environ, **FLOWER_ENV}
    try:
        # SuperLink: TLS with the hub certificate, SuperNode authentication on.
        sl_port = free_port()
        sl_home = root / "superlink-home"
        sl_home.mkdir()
        sl, sl_log = procs.start("superlink", [
            str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(cdir / certs.CA_CRT),
            "--ssl-certfile", str(cdir / certs.HUB_CRT), "--ssl-keyfile", str(cdir / certs.HUB_KEY),
            "--enable-supernode-auth", "--disable-runtime-dependency-installation",
            "--host", HOST, "--port", str(sl_port), "--database", str(root / "superlink.db"),
        ], env={**base_env, "FLWR_HOME": str(sl_home)})
        wait_port(sl_port, sl, sl_log)

        # Hub ingress (nginx): mTLS, Fleet API only.
        ingress_port = free_port()
        ngx_dir = root / "nginx"
        ngx_dir.mkdir()
        conf = ngx_dir / "nginx.conf"
        conf.write_text(nginx_conf(cdir, ingress_port, sl_port, ngx_dir,
                                   user="root" if os.geteuid() == 0 else None))
        ngx, _ = procs.start("nginx", [NGINX, "-p", str(ngx_dir), "-e", str(ngx_dir / "error.log"),
                                             "-c", str(conf), "-g", "daemon off;"])
        wait_port(ingress_port, ngx, ngx_dir / "error.log")

        # One sidecar per member: TLS in from its SuperNode, mTLS out with the cluster's certificate.
        sidecars = {}
        for member in ("a", "b"):
            port, hop = free_port(), free_port()
            sdir = root / f"stunnel-{member}"
            sdir.mkdir()
            client, server = certs.leaf_files(cdir, f"cluster-{member}"), certs.leaf_files(
                cdir, f"sidecar-{member}", "server")
            (sdir / "stunnel.conf").write_text(stunnel_conf(
                client.cert, client.key, cdir / certs.CA_CRT, port, f"{HOST}:{ingress_port}", sdir,
                server_cert=server.cert, server_key=server.key, hop_port=hop))
            st, _ = procs.start(f"stunnel-{member}", [STUNNEL, str(sdir / "stunnel.conf")])
            wait_port(port, st, sdir / "stunnel.log")
            sidecars[member] = port

        # The hub operator's flwr CLI: private FLWR_HOME whose connection is the SuperLink's Control API.
        home = root / "flwr-home"
        write_connection(home, f"{HOST}:{sl_port}", cdir / certs.CA_CRT)
        node_env = {**base_env, "FLWR_HOME": str(root / "supernode-home")}
        h = Hub(root=root, certs=cdir, procs=procs, superlink_port=sl_port, ingress_port=ingress_port,
                sidecar_ports=sidecars, flwr_env={**base_env, "FLWR_HOME": str(home)}, node_env=node_env,
                nginx_dir=ngx_dir)
        keys = root / "keys"
        keys.mkdir()
        for i, member in enumerate(("a", "b")):
            priv, pub = ec_auth_key(keys, f"supernode-{member}")
            reg = h.flwr("supernode", "register", str(pub), "hub", "--format", "json")
            assert reg.returncode == 0, f"flwr supernode register failed:\n{reg.stdout}\n{reg.stderr}"
            h.supernode(f"supernode-{member}", priv, member, i)
        yield h
    finally:
        procs.stop_all()


def online_nodes(hub: Hub) -> list[dict]:
    return _online_nodes(hub.flwr_env, hub.root)


def wait_members_online(hub: Hub) -> None:
    _wait_online(hub.flwr_env, hub.root, 2, [hub.procs.logs / "supernode-a.log", hub.nginx_dir / "error.log"])


def test_two_rounds_through_the_mtls_path(hub: Hub) -> None:
    wait_members_online(hub)

    out = hub.root / "fed"
    # The tiny settings go in the run config (the only source: pyproject's table, overridden here).
    run_config = " ".join([*(f"{k}={v}" for k, v in RUN_CONFIG.items()),
                           f"out-dir='{out / 'hub'}'", f"state-dir='{out / 'state'}'"])
    run_log = hub.procs.logs / "flwr-run.log"
    with run_log.open("w") as f:
        subprocess.run([str(BIN / "flwr"), "run", str(APP_DIR), "hub", "--stream",
                        "--run-config", run_config], env=hub.flwr_env, cwd=hub.root, stdout=f,
                       stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT, check=False)
    listing = hub.flwr("ls", "hub", "--format", "json")
    runs = json.loads(listing.stdout)["runs"]
    assert len(runs) == 1, listing.stdout
    assert runs[0]["status"] == "finished:completed", (
        f"{runs[0]['status']}\n{tail(run_log)}\n{tail(hub.procs.logs / 'supernode-a.log')}")
    rounds = json.loads((out / "hub" / "rounds.json").read_text())
    assert [r["round"] for r in rounds] == [1, 2]
    assert all("train" in r for r in rounds)
    assert tail(run_log, 100_000).count("Received 2 results and 0 failures") == 2  # both members, both rounds
    # Every member call went through the ingress (mTLS verified) and only to the Fleet API.
    access = (hub.nginx_dir / "access.log").read_text().splitlines()
    assert any('"POST /v1/fleet/pull-messages' in line and '" 200 ' in line for line in access)
    assert any('"POST /v1/fleet/push-messages' in line and '" 200 ' in line for line in access)
    assert all("/v1/fleet/" in line for line in access if '" 200 ' in line)


@pytest.mark.parametrize("case", ["no-certificate", "other-ca", "expired"])
def test_ingress_rejects_bad_client_certificates(hub: Hub, case: str, tmp_path: Path) -> None:
    ca = hub.certs / certs.CA_CRT
    cert = None
    if case == "other-ca":
        other = tmp_path / "other-ca"
        certs.init_ca(other, hub_hosts=["localhost"], hub_ips=[HOST])
        cert = certs.issue(other, "cluster-a").files  # same name, wrong issuer
    elif case == "expired":
        cert = certs.issue(hub.certs, "cluster-old", days=-1, allow_expired=True).files
    status, body = https(hub.ingress_port, "/v1/fleet/pull-messages", cert=cert, ca=ca)
    assert status == 400
    want = "No required SSL certificate was sent" if case == "no-certificate" else "The SSL certificate error"
    assert want in body
    errors = tail(hub.nginx_dir / "error.log", 100_000)
    if case == "other-ca":
        assert "client SSL certificate verify error: (21:unable to verify the first certificate)" in errors
    elif case == "expired":
        assert "client SSL certificate verify error: (10:certificate has expired)" in errors


def test_ingress_exposes_only_the_fleet_api(hub: Hub) -> None:
    ca, good = hub.certs / certs.CA_CRT, certs.leaf_files(hub.certs, "cluster-a")
    # Same request straight to the SuperLink: the Control API answers there (hub side only) ...
    status, _ = https(hub.superlink_port, "/v1/control/list-runs", ca=ca)
    assert status not in (403, 404)
    # ... but never through the ingress, even with a valid client certificate.
    for path in ("/v1/control/list-runs", "/v1/control/start-run", "/v1/runtime/get-nodes", "/",
                 "/v1/fleet/../control/list-runs", "/v1/fleet/%2e%2e/control/list-runs",
                 "/v1/fleet/..%2fcontrol/list-runs", "/v1/fleet/get-run?x=/v1/control/"):
        status, _ = https(hub.ingress_port, path, cert=good, ca=ca)
        assert status == 404, path
    status, _ = https(hub.ingress_port, "/v1/fleet/get-run", cert=good, ca=ca, method="GET")
    assert status == 403
    # A Fleet call with a valid certificate reaches the SuperLink, which still wants node authentication.
    status, body = https(hub.ingress_port, "/v1/fleet/get-run", cert=good, ca=ca)
    assert status == 401, body


def test_unregistered_supernode_key_is_refused(hub: Hub) -> None:
    priv, _pub = ec_auth_key(hub.root / "keys", "supernode-rogue")  # never registered
    wait_members_online(hub)
    proc, log = hub.supernode("supernode-rogue", priv, "a", 0, "--max-retries", "1", "--max-wait-time", "15")
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail(f"an unregistered SuperNode kept running:\n{tail(log)}")
    finally:
        hub.procs.stop(proc)
    # The mTLS link works (valid cluster certificate via sidecar a); Flower itself refuses the key:
    # ActivateNode answers 412 and the SuperNode exits with code 305 ("Failed to activate SuperNode").
    assert proc.returncode != 0, tail(log)
    assert "Failed to activate SuperNode" in tail(log), tail(log)
    assert '"POST /v1/fleet/activate-node HTTP/1.1" 412' in (hub.nginx_dir / "access.log").read_text()
    assert len(online_nodes(hub)) == 2
