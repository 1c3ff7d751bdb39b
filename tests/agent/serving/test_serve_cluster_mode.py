"""``fedsched serve`` in cluster mode: cache from Kubernetes watches, HTTPS with mutual TLS.

The API server is the test's local server speaking the Kubernetes API (no kube-apiserver can
run here); the agent process reaches it through a kubeconfig with the official client, exactly
as it would reach a real one.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path

from bench.harness.polling import wait_for
from bench.harness.serve import serve_process
from tests.agent.cluster.test_k8s_watch import write_kubeconfig
from tests.extender_support import agent_pki
from tests.k8s_api_stub_server import KubeAPIStub
from tests.paths import TEST_DATA

K8S = TEST_DATA / "k8s"


def test_cluster_mode_follows_the_api_server_over_mutual_tls(tmp_path: Path):
    nodes = json.loads((K8S / "nodes.json").read_text())["items"]
    pods = json.loads((K8S / "pods.json").read_text())["items"]
    pki = agent_pki(tmp_path)
    srv, cli, ca = pki.server, pki.client, pki.ca
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cli.files.cert), str(cli.files.key))

    def call(path: str, body: dict | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(base + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                raw = r.read()
                return r.status, json.loads(raw) if body is not None else raw.decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    with KubeAPIStub(nodes, pods) as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        with serve_process(
            "--policy", "learned", "--gate", "off", "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1",
            "--port", "0",
            "--tls-cert", str(srv.files.cert), "--tls-key", str(srv.files.key), "--client-ca", str(ca),
        ) as sp:
            base = sp.base
            wait_for(lambda: call("/readyz")[0] == 200, 30, 0.2, "the cache synced from the API server")
            pod = next(
                p for p in pods if p["metadata"]["name"].startswith("llama-finetune")
            )  # 8 GPUs, Pending
            pod = json.loads(json.dumps(pod))
            pod["spec"]["schedulerName"] = "fedsched"
            names = [n["metadata"]["name"] for n in nodes]
            status, out = call("/scheduler/filter", {"Pod": pod, "NodeNames": names})
            assert status == 200
            assert {"cpu-node-c", "gpu-v100-1"} <= set(out["FailedNodes"])  # cordoned, NotReady
            status, prio = call(
                "/scheduler/prioritize", {"Pod": pod, "NodeNames": ["gpu-v100-0", "cpu-node-a"]}
            )
            # gpu-v100-0 has 6 of 8 GPUs free: the pod fits nowhere by the cache, so no opinion (fallback)
            assert status == 200 and [h["Host"] for h in prio] == ["gpu-v100-0", "cpu-node-a"]
            # the training job on gpu-v100-0 ends: the watch frees its GPUs and the pod now fits there
            done = json.loads(
                json.dumps(next(p for p in pods if p["metadata"]["name"].startswith("resnet50")))
            )
            done["status"]["phase"] = "Succeeded"
            api.update("pods", done)

            def picks_v100() -> bool:
                s, p = call("/scheduler/prioritize", {"Pod": pod, "NodeNames": ["gpu-v100-0", "cpu-node-a"]})
                return s == 200 and p[0]["Score"] == 10

            wait_for(picks_v100, 20, 0.2, "the freed node to win")
            status, text = call("/metrics")
            assert status == 200 and "fedsched_cache_pods 6.0" in text
    assert sp.proc.returncode == 0, sp.stderr
