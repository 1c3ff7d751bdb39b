"""``fedsched certs``: the CA, hub and member certificates work for real mutual TLS (stdlib ssl)."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from fedsched.cli.main import main
from fedsched.common.security import certs

TIMEOUT = 5.0


def fedsched(*argv) -> int:
    return main(["certs", *(str(a) for a in argv)])


@pytest.fixture
def pki(tmp_path) -> Path:
    d = tmp_path / "pki"
    assert fedsched("init", "--dir", d) == 0
    assert fedsched("issue", "--dir", d, "--name", "cluster-a") == 0
    assert fedsched("issue", "--dir", d, "--name", "cluster-b") == 0
    return d


# --------------------------------------------------------------------------- a tiny mutual-TLS server

def server_context(d: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default: RFC 5280 conformance
    ctx.load_cert_chain(d / certs.HUB_CRT, d / certs.HUB_KEY)
    ctx.load_verify_locations(d / certs.CA_CRT)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    ctx.load_verify_locations(ca)
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def client_files(d: Path, name: str, kind: str = "client") -> tuple[Path, Path]:
    f = certs.leaf_files(d, name, kind)
    return f.cert, f.key


def member(d: Path, name: str, ca: Path | None = None) -> ssl.SSLContext:
    """A member's client context: its cluster certificate, trusting ``ca`` (default: d's CA)."""
    return client_context(ca or d / "ca.crt", *client_files(d, name))


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str = "localhost"):
    """One connection: returns (what the client read or its exception, the server's outcome)."""
    server: dict = {}

    def serve(listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError as e:
            server["error"] = e
            return
        with conn:
            conn.settimeout(TIMEOUT)
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    subject = dict(rdn[0] for rdn in tls.getpeercert()["subject"])
                    server["cn"] = subject["commonName"]
                    tls.sendall(f"hello {server['cn']}\n".encode())
            except (ssl.SSLError, OSError) as e:
                server["error"] = e

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT)
        port = listener.getsockname()[1]
        thread = threading.Thread(target=serve, args=(listener,), daemon=True)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw, \
                    client_ctx.wrap_socket(raw, server_hostname=hostname) as tls:
                client: bytes | Exception = tls.recv(100)  # TLS 1.3: a rejected client cert shows up here
        except (ssl.SSLError, OSError) as e:
            client = e
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "server thread hung"
    return client, server


def test_mutual_tls_handshake_with_cluster_certificate(pki):
    for name in ("cluster-a", "cluster-b"):
        client, server = handshake(server_context(pki), member(pki, name))
        assert server.get("cn") == name, server
        assert client == f"hello {name}\n".encode()


@pytest.mark.parametrize("hostname", ["localhost", "127.0.0.1"])
def test_hub_certificate_matches_default_names(pki, hostname):
    client, server = handshake(server_context(pki), member(pki, "cluster-a"),
                               hostname=hostname)
    assert server.get("cn") == "cluster-a" and client == b"hello cluster-a\n"


def test_hub_certificate_rejected_for_another_hostname(pki):
    client, _ = handshake(server_context(pki), member(pki, "cluster-a"),
                          hostname="hub.example.org")
    assert isinstance(client, ssl.SSLCertVerificationError)
    assert "hostname" in str(client).lower() or "match" in str(client).lower()


def _assert_rejected(client, server):
    assert "cn" not in server, f"server accepted {server.get('cn')!r}"
    assert isinstance(server.get("error"), ssl.SSLError), server
    assert not isinstance(client, bytes) or client == b"", client  # no greeting reached the client


def test_client_without_certificate_is_rejected(pki):
    client, server = handshake(server_context(pki), client_context(pki / "ca.crt"))
    _assert_rejected(client, server)
    assert "certificate" in str(server["error"]).lower()


def test_client_certificate_from_another_ca_is_rejected(pki, tmp_path):
    other = tmp_path / "other"
    assert fedsched("init", "--dir", other) == 0  # same CA subject name, different key
    assert fedsched("issue", "--dir", other, "--name", "cluster-a") == 0
    client, server = handshake(server_context(pki), member(other, "cluster-a", pki / "ca.crt"))
    _assert_rejected(client, server)
    assert "certificate verify failed" in str(server["error"])


def test_expired_client_certificate_is_rejected(pki):
    assert fedsched("issue", "--dir", pki, "--name", "stale", "--days", "-1", "--allow-expired") == 0
    client, server = handshake(server_context(pki), member(pki, "stale"))
    _assert_rejected(client, server)
    assert "expired" in str(server["error"])


def test_server_certificate_cannot_act_as_client(pki):
    assert fedsched("issue", "--dir", pki, "--name", "cluster-a", "--kind", "server") == 0
    client, server = handshake(server_context(pki),
                               client_context(pki / "ca.crt", *client_files(pki, "cluster-a", "server")))
    _assert_rejected(client, server)
    assert "purpose" in str(server["error"])


def test_client_rejects_hub_signed_by_another_ca(pki, tmp_path):
    other = tmp_path / "other"
    certs.init_ca(other)
    client, _ = handshake(server_context(pki), member(pki, "cluster-a", other / "ca.crt"))
    assert isinstance(client, ssl.SSLCertVerificationError)


def test_member_server_certificate_for_extender_https(pki):
    """--kind server: the member's extender over HTTPS, kube-scheduler presenting a client certificate."""
    assert fedsched("issue", "--dir", pki, "--name", "extender", "--kind", "server",
                    "--host", "localhost", "--ip", "127.0.0.1") == 0
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(*client_files(pki, "extender", "server"))
    srv.load_verify_locations(pki / "ca.crt")
    srv.verify_mode = ssl.CERT_REQUIRED
    assert fedsched("issue", "--dir", pki, "--name", "kube-scheduler") == 0
    client, server = handshake(srv, client_context(pki / "ca.crt", *client_files(pki, "kube-scheduler")),
                               hostname="127.0.0.1")
    assert server.get("cn") == "kube-scheduler" and client == b"hello kube-scheduler\n"


def test_rsa_keys_work_too(tmp_path):
    d = tmp_path / "rsa"
    assert fedsched("init", "--dir", d, "--rsa") == 0
    assert fedsched("issue", "--dir", d, "--name", "cluster-r", "--rsa") == 0
    assert certs.describe(certs.load_cert(d / "ca.crt"))["key"] == "RSA 2048"
    client, server = handshake(server_context(d), member(d, "cluster-r"))
    assert server.get("cn") == "cluster-r" and client == b"hello cluster-r\n"


# --------------------------------------------------------------------------- contents of the certificates

def test_server_certificate_sans(pki):
    sans = certs.describe(certs.load_cert(pki / "hub.crt"))["sans"]
    assert "localhost" in sans["dns"] and "127.0.0.1" in sans["ip"]


def test_custom_hub_names(tmp_path):
    d = tmp_path / "pki"
    assert fedsched("init", "--dir", d, "--hub-host", "hub.example.org", "--hub-host", "fedsched-hub",
                    "--hub-ip", "10.0.0.5", "--hub-ip", "::1") == 0
    desc = certs.describe(certs.load_cert(d / "hub.crt"))
    assert desc["sans"] == {"dns": ["hub.example.org", "fedsched-hub"], "ip": ["10.0.0.5", "::1"]}
    assert desc["common_name"] == "hub.example.org"


def test_extensions(pki):
    ca = certs.load_cert(pki / "ca.crt")
    bc = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = ca.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.crl_sign and not ku.value.digital_signature
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ca.issuer == ca.subject

    hub = certs.load_cert(pki / "hub.crt")
    bc = hub.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and not bc.value.ca
    ku = hub.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.digital_signature and ku.value.key_encipherment
    assert list(hub.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]
    aki = hub.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ski.digest

    cl = certs.load_cert(pki / "clients" / "cluster-a.crt")
    assert list(cl.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    d = certs.describe(cl)
    assert d["common_name"] == "cluster-a" and d["issuer"] == certs.describe(ca)["subject"]
    assert d["sans"]["uri"] == ["spiffe://fedsched/cluster/cluster-a"] and d["sans"]["dns"] == ["cluster-a"]
    assert d["key"] == "EC P-256" and not d["expired"] and 824 <= d["days_left"] <= 825
    assert certs.cluster_name(cl) == "cluster-a"
    assert len(d["fingerprint_sha256"].split(":")) == 32


def test_key_files_are_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        d = tmp_path / "pki"
        certs.init_ca(d)
        certs.issue(d, "cluster-a")
        certs.issue(d, "cluster-a", kind="server")
    finally:
        os.umask(old)
    keys = [d / "ca.key", d / "hub.key", d / "clients" / "cluster-a.key", d / "servers" / "cluster-a.key"]
    for key in keys:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE((d / "ca.crt").stat().st_mode) == 0o644
    assert not list(d.rglob("*.tmp"))


# --------------------------------------------------------------------------- verify_chain

def test_verify_chain(pki, tmp_path):
    ca = certs.load_cert(pki / "ca.crt")
    client = certs.load_cert(pki / "clients" / "cluster-a.crt")
    hub = certs.load_cert(pki / "hub.crt")
    certs.verify_chain(client, ca)
    certs.verify_chain(client, ca, "client")
    certs.verify_chain(hub, ca, "server")
    certs.verify_chain(ca, ca)
    with pytest.raises(ValueError, match="extended key usage"):
        certs.verify_chain(client, ca, "server")
    with pytest.raises(ValueError, match="extended key usage"):
        certs.verify_chain(hub, ca, "client")
    with pytest.raises(ValueError, match="not yet valid"):
        certs.verify_chain(client, ca, now=dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    with pytest.raises(ValueError, match="expired"):
        certs.verify_chain(client, ca, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=826))
    with pytest.raises(ValueError, match="not a CA"):
        certs.verify_chain(client, hub)

    expired = certs.issue(pki, "stale", days=-1, allow_expired=True).cert
    with pytest.raises(ValueError, match="expired"):
        certs.verify_chain(expired, ca, "client")

    other = tmp_path / "other"
    certs.init_ca(other)
    foreign = certs.issue(other, "cluster-a").cert
    with pytest.raises(ValueError, match="signature"):
        certs.verify_chain(foreign, ca, "client")  # same issuer name, wrong key
    other_named = tmp_path / "other-named"
    certs.init_ca(other_named, ca_name="someone else")
    with pytest.raises(ValueError, match="signature"):
        certs.verify_chain(certs.issue(other_named, "cluster-a").cert, ca)


# --------------------------------------------------------------------------- the CLI

def test_init_twice_without_force_fails(pki, capsys):
    before = (pki / "ca.crt").read_bytes(), (pki / "ca.key").read_bytes()
    capsys.readouterr()
    assert fedsched("init", "--dir", pki) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--force" in err and "Traceback" not in err
    assert ((pki / "ca.crt").read_bytes(), (pki / "ca.key").read_bytes()) == before
    with pytest.raises(certs.CertExistsError):
        certs.init_ca(pki)

    assert fedsched("init", "--dir", pki, "--force") == 0
    out = capsys.readouterr().out
    assert (pki / "ca.crt").read_bytes() != before[0]
    assert "no longer verify" in out and "cluster-a.crt" in out  # issued certificates are now stale
    with pytest.raises(ValueError, match="signature"):
        certs.verify_chain(certs.load_cert(pki / "clients" / "cluster-a.crt"),
                           certs.load_cert(pki / "ca.crt"))


def test_show_mentions_every_cluster(pki, capsys):
    assert fedsched("issue", "--dir", pki, "--name", "stale", "--days", "-1", "--allow-expired") == 0
    capsys.readouterr()
    assert fedsched("show", "--dir", pki) == 0
    out = capsys.readouterr().out
    for word in ("CA", "hub", "cluster-a", "cluster-b", "stale", "spiffe://fedsched/cluster/cluster-b",
                 "DNS:localhost", "IP:127.0.0.1", "sha256:", "clientAuth", "serverAuth", "days left",
                 "EXPIRED"):
        assert word in out, word
    assert out.count("chain:          ok") == 4 and "chain:          FAILED: expired" in out

    assert fedsched("show", "--dir", pki, "--name", "cluster-b") == 0
    out = capsys.readouterr().out
    assert "cluster-b" in out and "cluster-a" not in out and "fedsched CA" in out  # the issuer

    assert fedsched("show", "--dir", pki, "--json") == 0
    records = json.loads(capsys.readouterr().out)
    labels = ["CA", "hub", "client cluster-a", "client cluster-b", "client stale"]
    assert [r["label"] for r in records] == labels
    assert [r["expired"] for r in records] == [False] * 4 + [True]

    assert fedsched("show", "--dir", pki, "--name", "nope") == 2
    assert "no certificate for cluster 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--name", "Cluster_A"], "invalid cluster name"),
    (["--name", "a" * 64], "invalid cluster name"),
    (["--name=-a"], "invalid cluster name"),
    (["--name", "ok", "--days", "0"], "--allow-expired"),
    (["--name", "ok", "--days", "-1"], "--allow-expired"),
    (["--name", "ok", "--ip", "300.1.1.1"], "invalid IP address"),
    (["--name", "ok", "--host", "bad host"], "invalid DNS name"),
])
def test_issue_rejects_bad_input(pki, capsys, argv, message):
    assert fedsched("issue", "--dir", pki, *argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (pki / "clients" / "ok.crt").exists()


def test_issue_without_ca_and_bad_init(tmp_path, capsys):
    assert fedsched("issue", "--dir", tmp_path / "none", "--name", "cluster-a") == 2
    assert "fedsched certs init" in capsys.readouterr().err
    assert fedsched("init", "--dir", tmp_path / "x", "--days", "0") == 2
    assert "days must be positive" in capsys.readouterr().err
    assert fedsched("init", "--dir", tmp_path / "y", "--hub-ip", "localhost") == 2
    assert "invalid IP address" in capsys.readouterr().err


def test_validity_is_cut_to_the_ca(tmp_path, capsys):
    d = tmp_path / "pki"
    assert fedsched("init", "--dir", d, "--ca-days", "30", "--days", "10") == 0
    assert fedsched("issue", "--dir", d, "--name", "cluster-a", "--days", "400") == 0
    assert "cut to the CA's expiry" in capsys.readouterr().out
    ca, leaf = certs.load_cert(d / "ca.crt"), certs.load_cert(d / "clients" / "cluster-a.crt")
    assert leaf.not_valid_after_utc == ca.not_valid_after_utc
    certs.verify_chain(leaf, ca, "client")
