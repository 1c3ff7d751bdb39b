"""The admin surface (issue 26, item 8): ``/admin/reload`` answers only an authenticated caller (over
mutual TLS a client certificate whose name is in ``admin_clients``; over plain HTTP a loopback
caller), reloads only files in the policy directory and answers one message for every other path
(no "file exists" oracle), and ``fedsched serve`` listens on loopback unless told otherwise."""

from __future__ import annotations

import json
import shutil
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.harness.extender_client import metric
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.extender import ExtenderServer, admin_caller_allowed, server_tls
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace
from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path
from fedsched.common.security import certs
from tests.checkpoint_support import write_scaled
from tests.extender_support import agent_pki, running


@pytest.fixture(scope="module")
def openb() -> ClusterCache:
    return ClusterCache.from_csv(builtin_trace("openb_node_list_gpu_node.csv"))


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    (tmp_path / "policies").mkdir()
    path = tmp_path / "policies" / "policy.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), path)
    return path


def test_admin_over_mutual_tls_needs_a_client_certificate_with_an_allowed_name(openb, policy, tmp_path):
    pki = agent_pki(tmp_path)
    admin = certs.issue(tmp_path / "pki", "fedsched-admin", kind="client")  # the same CA as kube-scheduler's
    decider = Decider(openb, ModelStore(str(policy)), DeciderConfig())
    tls = server_tls(pki.server.files.cert, pki.server.files.key, pki.ca)
    server = ExtenderServer(decider, port=0, tls=tls, admin_clients=["fedsched-admin"])
    server.start()

    def call(files: certs.Issued, path: str, body: dict) -> tuple[int, dict | list]:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(str(files.files.cert), str(files.files.key))
        req = urllib.request.Request(f"https://127.0.0.1:{server.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        v0 = decider.models.version
        write_scaled(policy.parent / "next.pt", 0.5)
        status, out = call(pki.client, "/admin/reload", {"path": str(policy.parent / "next.pt")})
        assert status == 403 and "admin" in out["Error"] and decider.models.version == v0
        pod = pod_to_json(Pod(-1, 1000, 1024, 0, 0, 0, 1), "p", uid="u")
        names = [str(openb.table.names[0])]
        status, out = call(pki.client, "/scheduler/prioritize", {"Pod": pod, "NodeNames": names})
        assert status == 200 and len(out) == 1  # kube-scheduler's verbs are not admin verbs
        status, out = call(admin, "/admin/reload", {"path": str(policy.parent / "next.pt")})
        assert status == 200 and out["changed"] is True and decider.models.version != v0
    finally:
        server.stop()
        decider.close()


def test_admin_over_tls_without_allowed_names_is_refused_to_every_certificate(openb, policy, tmp_path):
    pki = agent_pki(tmp_path)
    decider = Decider(openb, ModelStore(str(policy)), DeciderConfig())
    tls = server_tls(pki.server.files.cert, pki.server.files.key, pki.ca)
    server = ExtenderServer(decider, port=0, tls=tls)
    server.start()
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.load_cert_chain(str(pki.client.files.cert), str(pki.client.files.key))
    req = urllib.request.Request(f"https://127.0.0.1:{server.port}/admin/reload", b"{}",
                                 {"Content-Type": "application/json"})
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, context=ctx, timeout=10)
        assert e.value.code == 403
    finally:
        server.stop()
        decider.close()


@pytest.mark.parametrize(("tls", "address", "names", "allowed"), [
    (False, "127.0.0.1", (), True),
    (False, "127.3.4.5", (), True),
    (False, "::1", (), True),
    (False, "::ffff:127.0.0.1", (), True),
    (False, "10.1.2.3", (), False),
    (False, "::ffff:10.1.2.3", (), False),
    (False, "fe80::1", (), False),
    (False, "10.1.2.3", ("admin",), False),  # names mean nothing without a certificate
    (True, "127.0.0.1", (), False),  # over TLS the certificate decides, not the address
    (True, "10.1.2.3", ("admin",), True),
    (True, "10.1.2.3", ("kube-scheduler",), False),
])
def test_who_may_call_the_admin_verbs(tls: bool, address: str, names: tuple[str, ...], allowed: bool) -> None:
    assert admin_caller_allowed(tls, address, frozenset(names), frozenset({"admin"})) is allowed


def test_reload_outside_the_policy_directory_gets_one_answer_whatever_the_file(openb, policy, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not a checkpoint")
    (policy.parent / "link.pt").symlink_to(secret)
    outside = [str(secret), str(tmp_path / "nope.pt"), "/etc/passwd", "/nonexistent/x.pt", str(tmp_path),
               str(policy.parent / ".." / "secret.txt"), str(policy.parent / "link.pt"), "../secret.txt"]
    with running(openb, policy=str(policy)) as (server, c):
        v0 = server.decider.models.version
        answers = set()
        for path in outside:
            status, raw = c.raw("POST", "/admin/reload", json.dumps({"path": path}).encode())
            out = json.loads(raw)
            assert status == 403 and out["changed"] is False, (path, status, out)
            assert "secret" not in out["Error"] and "passwd" not in out["Error"]
            answers.add(raw)
        assert len(answers) == 1, answers  # nothing tells an existing file from a missing one
        assert server.decider.models.version == v0
        write_scaled(policy.parent / "next.pt", 0.5)
        status, raw = c.raw("POST", "/admin/reload", json.dumps({"path": "next.pt"}).encode())
        assert status == 200 and json.loads(raw)["changed"] is True  # relative: in the policy directory
        text = c.get("/metrics")[1]
    assert metric(text, "fedsched_model_reloads_total", result="error", reason="forbidden") == len(outside)


def test_serve_listens_on_loopback_unless_told_otherwise() -> None:
    import argparse

    from fedsched.cli import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    opts = serve.resolve_options(parser.parse_args(["serve", "--policy", "learned"]))
    assert opts["host"] == "127.0.0.1"
    opts = serve.resolve_options(parser.parse_args(["serve", "--policy", "learned", "--host", "0.0.0.0"]))
    assert opts["host"] == "0.0.0.0"
