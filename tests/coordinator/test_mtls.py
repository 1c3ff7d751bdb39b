"""Integration test of the hub link's mutual TLS around a real Flower 1.42 deployment.

Everything runs on loopback ports picked at start-up::

    flower-supernode (x2) --TLS--> stunnel sidecar (x2) --mTLS--> nginx ingress --TLS--> flower-superlink
    flwr CLI (run / ls / supernode register) --TLS--> flower-superlink (Control API, hub side only)

The SuperLink has SuperNode authentication on; both SuperNodes' EC keys are registered with
``flwr supernode register``. The hub is the one the fleet starts (``fedsched.experiment.hub``).
Both members come online through this path; then the ingress must refuse a member without a
client certificate, with a certificate of another CA, with an expired certificate, an
unregistered SuperNode key, and any path outside the Fleet API (the Control API in particular).
Skips only when nginx or stunnel is missing.

Two federated rounds of the fedsched app with two members through this path (the same hub, two
sidecars, two registered SuperNodes; both members' results in both rounds, every member call
through the ingress and only to the Fleet API, one run listed, completed) are checked by the
fleet's CI test, tests/experiment/test_fleet.py::test_member_and_hub_two_rounds_over_mtls, whose
workload outlasts its rounds: a second ``flwr run`` here cost about 45 s.
"""

from __future__ import annotations

import http.client
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsched.common.security import certs
from fedsched.experiment.flower import HOST, ec_auth_key, missing_tools
from fedsched.experiment.flower import online_nodes as _online_nodes
from fedsched.experiment.hub import Hub, MemberLink, start_hub
from fedsched.experiment.processes import tail

pytestmark = [pytest.mark.skipif(bool(missing_tools()), reason="; ".join(missing_tools()))]

MEMBERS = ("cluster-a", "cluster-b")


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
def hub(tmp_path_factory) -> Iterator[Hub]:
    """The hub the fleet runs (``fedsched.experiment.hub``) with two members, cluster-a and cluster-b."""
    with start_hub(tmp_path_factory.mktemp("mtls")) as h:
        for i, member in enumerate(MEMBERS):
            h.link(member)
            h.start_supernode(member, {"partition-id": i, "num-partitions": len(MEMBERS)})
        yield h


def online_nodes(hub: Hub) -> list[dict]:
    return _online_nodes(hub.flwr_env, hub.root)


def wait_members_online(hub: Hub) -> None:
    hub.wait_online(len(MEMBERS))


def test_both_members_come_online_through_their_sidecars(hub: Hub) -> None:
    wait_members_online(hub)
    assert len(online_nodes(hub)) == len(MEMBERS)


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
    hub.members["rogue"] = MemberLink("rogue", hub.members["cluster-a"].sidecar_port, priv)  # sidecar a
    link = hub.start_supernode("rogue", {"partition-id": 0, "num-partitions": len(MEMBERS)},
                               extra=("--max-retries", "1", "--max-wait-time", "15"))
    proc, log = link.supernode, link.log
    assert proc is not None and log is not None
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
