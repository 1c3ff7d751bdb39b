"""A real Kubernetes control plane on loopback for the kwok fleet (:mod:`.fleet`), the tests and
the scheduler benchmark (re-exported as ``bench.harness.control_plane``): etcd, kube-apiserver,
kube-scheduler.

The binaries are the ones ``scripts/build_k8s.sh`` builds from their Go modules into
``.k8s/bin/`` of the repository (:data:`K8S_BIN`, or ``$FEDSCHED_K8S_BIN``: etcd 3.7.3,
kube-apiserver and kube-scheduler v1.37.2, kwok v0.8.0);
:func:`missing_binaries` names those that are not there. This module does not build them: the
tests get them through ``tests/k8s_support.py`` (which runs the script, or skips), the benchmark
checks :func:`missing_binaries` and exits with the command to run.

:func:`control_plane` starts etcd and kube-apiserver on free loopback ports in a temporary
directory with the flags the build script's header lists as verified (token authentication,
``AlwaysAllow``, ``--endpoint-reconciler-type none``, the apiserver's own self-signed serving
pair from ``--cert-dir``; ``apiserver_args`` adds flags), waits for ``/readyz``, writes an
admin kubeconfig and returns a :class:`ControlPlane` with a small JSON client (:class:`KubeAPI`:
``requests`` with the bearer token, the environment's CA bundle and proxies ignored; no
kubectl). :meth:`ControlPlane.stop_apiserver` / :meth:`~ControlPlane.start_apiserver` restart
kube-apiserver on the same port and etcd (gracefully, or as a crash), and
:meth:`ControlPlane.compact_etcd` compacts etcd's history through its v3 gRPC-gateway (JSON on
the client URL), for the watch tests. :func:`kube_scheduler`
runs a kube-scheduler against it with given arguments (``--config=FILE``: a
KubeSchedulerConfiguration made runnable outside a pod by :func:`scheduler_config_for`);
:func:`check_scheduler_config` has kube-scheduler itself decode, default and validate one and
exit. Every process runs in its own session (process group) and dies with the test process
(``PR_SET_PDEATHSIG``); teardown ends each group and checks that none is left.

:func:`create_nodes` registers the nodes of an openb :class:`~fedsched.common.model.cluster.NodeTable`
as a kubelet does (the Node with capacity and allocatable CPU, memory, pods and
``nvidia.com/gpu`` and the GPU model label, from
:func:`fedsched.agent.cluster.k8s_objects.node_to_json`; then its ``Ready`` condition through the
``/status`` subresource) and lifts the not-ready taint the apiserver's admission gave it, as the
node lifecycle controller would. No kubelet and no kube-controller-manager run: pods are bound
(``spec.nodeName``) but never start, a node set NotReady gets no taint, and each namespace
needs its ``default`` ServiceAccount created (:meth:`KubeAPI.ensure_namespace`).

Imports ``requests``, ``urllib3``, ``yaml``, ``cryptography``, ``fedsched.agent.cluster.k8s_objects``,
``fedsched.common.model.cluster`` and :mod:`.processes` (never pytest, ``bench`` or ``tests``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
import urllib3
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from fedsched.agent.cluster.k8s_objects import node_to_json
from fedsched.common.model.cluster import NodeTable
from fedsched.experiment.processes import Procs, free_port, tail, wait_for

#: The repository root of a source checkout (the package is installed editable from it).
ROOT = Path(__file__).resolve().parents[1]
K8S_BIN = Path(os.environ.get("FEDSCHED_K8S_BIN") or ROOT / ".k8s" / "bin")
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
HOST = "127.0.0.1"
ADMIN_TOKEN = "fedsched-admin-token"
START_TIMEOUT = 60.0


# ---- the binaries ------------------------------------------------------------------------------

def missing_binaries(bin_dir: Path = K8S_BIN) -> list[str]:
    """The control-plane binaries not (executable) in ``bin_dir``."""
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


# ---- processes -----------------------------------------------------------------------------------

class Processes(Procs):
    """:class:`~.processes.Procs` whose teardown checks that no process of their groups is left."""

    def leftovers(self) -> list[int]:
        """Process groups of ours that still have a live member."""
        left = []
        for p in self.procs:
            try:
                os.killpg(p.pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            left.append(p.pid)
        return left


# ---- the API client --------------------------------------------------------------------------------

class KubeAPIError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


class KubeAPI:
    """JSON over HTTPS to kube-apiserver with the admin bearer token (verified against the
    apiserver's own certificate)."""

    def __init__(self, url: str, token: str, ca: Path | None) -> None:
        self.url = url
        self.session = _session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.verify = str(ca) if ca is not None else False

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                ok: tuple[int, ...] = (200, 201, 202), timeout: float = 30.0, **params: Any) -> Any:
        data = json.dumps(body) if body is not None else None
        r = self.session.request(method, self.url + path, data=data, params=params or None, timeout=timeout,
                                 headers={"Content-Type": content_type} if data is not None else None)
        if r.status_code not in ok:
            raise KubeAPIError(method, path, r.status_code, r.text)
        return r.json() if r.content and r.headers.get("Content-Type", "").startswith("application/json") \
            else r.text

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, **params)

    def create(self, path: str, obj: dict) -> dict:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: dict) -> dict:
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def json_patch(self, path: str, ops: list[dict]) -> dict:
        return self.request("PATCH", path, ops, content_type="application/json-patch+json")

    def delete(self, path: str, grace_seconds: int | None = 0) -> Any:
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        return self.request("DELETE", path, body, ok=(200, 202, 404))

    def items(self, path: str, **params: Any) -> list[dict]:
        return self.get(path, **params)["items"]

    # ---- objects the tests use ----
    def ensure_namespace(self, name: str) -> None:
        """The namespace and its ``default`` ServiceAccount (no controller-manager runs to create
        it, and the ServiceAccount admission plugin refuses pods without it)."""
        for path, obj in (
            ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            (f"/api/v1/namespaces/{name}/serviceaccounts",
             {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"},
              "automountServiceAccountToken": False}),
        ):
            self.request("POST", path, obj, ok=(201, 409))

    def pods(self, namespace: str | None = None, **params: Any) -> list[dict]:
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        return self.items(path, **params)

    def delete_pods(self, namespace: str, wait_s: float = 30.0) -> None:
        """Every pod of ``namespace`` deleted at once (no kubelet: grace period 0)."""
        self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods",
                     {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        wait_for(lambda: not self.pods(namespace), wait_s, 0.2, f"the pods of {namespace} deleted")


# ---- the control plane -------------------------------------------------------------------------------

@dataclass
class ControlPlane:
    """etcd + kube-apiserver on loopback; ``kubeconfig`` is an admin kubeconfig (bearer token,
    the apiserver's self-signed certificate as its CA)."""

    root: Path
    bin: Path
    url: str
    ca: Path
    token: str
    kubeconfig: Path
    api: KubeAPI
    procs: Processes
    logs: dict[str, Path] = field(default_factory=dict)
    etcd_url: str = ""
    apiserver_argv: list[str] = field(default_factory=list)
    apiserver: subprocess.Popen | None = None

    def log_tail(self, name: str, n: int = 3000) -> str:
        return tail(self.logs[name], n)

    # ---- restarting kube-apiserver, compacting etcd ----
    def stop_apiserver(self, kill: bool = False, timeout: float = 30.0) -> None:
        """Stop kube-apiserver: SIGTERM, and SIGKILL after ``timeout`` (its graceful shutdown
        can outlast open watches), or at once with ``kill`` (a crash: every connection reset)."""
        proc, self.apiserver = self.apiserver, None
        if proc is None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        else:
            self.procs.stop(proc, timeout)

    def start_apiserver(self) -> None:
        """kube-apiserver again with the same flags: the same port, etcd and serving pair (its
        ``--cert-dir`` already holds one, so the kubeconfig's CA stays valid); waits for /readyz.
        Call it from the test's own thread: ``PR_SET_PDEATHSIG`` ends a process when the thread
        that started it ends."""
        assert self.apiserver is None, "kube-apiserver is running"
        self.apiserver = _start_apiserver(self.procs, self.apiserver_argv, self.url)
        self.api.session.close()  # its pooled connections were to the old process

    def etcd(self, method: str, body: dict) -> dict:
        """A call to etcd's v3 gRPC-gateway (JSON over HTTP on the client URL), e.g.
        ``etcd("kv/range", {"key": ...})``."""
        with _session() as s:
            r = s.post(f"{self.etcd_url}/v3/{method}", json=body, timeout=30)
        r.raise_for_status()
        return r.json()

    def etcd_revision(self) -> int:
        """etcd's current revision (what a List's resourceVersion is made of)."""
        return int(self.etcd("kv/range", {"key": "AA=="})["header"]["revision"])  # key "\0"

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (``etcdctl compact --physical``):
        a watch from an older revision is refused by etcd. Returns that revision."""
        rev = self.etcd_revision()
        self.etcd("kv/compaction", {"revision": str(rev), "physical": True})
        return rev


def write_kubeconfig(path: Path, server: str, ca: Path, token: str, name: str = "fedsched-test") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
        "users": [{"name": "admin", "user": {"token": token}}],
    }))
    path.chmod(0o600)
    return path


def _service_account_key(path: Path) -> Path:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return path


def _wait_ready(proc: subprocess.Popen, log: Path, probe: Callable[[], bool], what: str,
                timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(requests.RequestException):
            if probe():
                return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout}s:\n{tail(log)}")


def _session() -> requests.Session:
    """A session that ignores the environment: $REQUESTS_CA_BUNDLE would override ``verify``, and
    a proxy from $HTTPS_PROXY must not see loopback traffic."""
    s = requests.Session()
    s.trust_env = False
    return s


def _get_ok(url: str, **kw: Any) -> bool:
    with warnings_off(), _session() as s:
        r = s.get(url, timeout=2, **kw)
    return r.status_code == 200 and r.text.strip() == "ok"


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    """No InsecureRequestWarning for the probes that run before a certificate exists."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        yield


def _start_apiserver(procs: Processes, argv: list[str], url: str) -> subprocess.Popen:
    proc, log = procs.start("kube-apiserver", argv)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    _wait_ready(proc, log, lambda: _get_ok(f"{url}/readyz", headers=auth, verify=False), "kube-apiserver")
    return proc


@contextlib.contextmanager
def control_plane(root: Path, bin_dir: Path | None = None,
                  apiserver_args: tuple[str, ...] = ()) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver in ``root`` on free loopback ports, ready; stopped on exit.
    ``bin_dir`` holds the binaries (default :data:`K8S_BIN`, which must have them: see
    :func:`missing_binaries`). ``apiserver_args`` are added to kube-apiserver's flags (e.g.
    ``--watch-cache=false``)."""
    bin_dir = bin_dir or K8S_BIN
    root.mkdir(parents=True, exist_ok=True)
    procs = Processes(root)
    try:
        client_port, peer_port = free_port(), free_port()
        etcd_url, peer_url = f"http://{HOST}:{client_port}", f"http://{HOST}:{peer_port}"
        etcd, etcd_log = procs.start("etcd", [
            str(bin_dir / "etcd"), "--data-dir", str(root / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}", "--listen-metrics-urls", "",
            "--log-level", "warn",
            # a throw-away store on a shared disk: no fsync per write
            "--unsafe-no-fsync",
        ])
        _wait_ready(etcd, etcd_log, lambda: _etcd_healthy(etcd_url), "etcd")
        sa_key = _service_account_key(root / "sa.key")
        tokens = root / "tokens.csv"
        tokens.write_text(f"{ADMIN_TOKEN},admin,admin,system:masters\n")
        tokens.chmod(0o600)
        port = free_port()
        url = f"https://{HOST}:{port}"
        api_argv = [
            str(bin_dir / "kube-apiserver"), "--etcd-servers", etcd_url,
            "--bind-address", HOST, "--advertise-address", HOST, "--secure-port", str(port),
            "--cert-dir", str(root / "pki"),
            "--service-account-key-file", str(sa_key), "--service-account-signing-key-file", str(sa_key),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range", "10.96.0.0/12", "--endpoint-reconciler-type", "none",
            "--authorization-mode", "AlwaysAllow", "--token-auth-file", str(tokens),
            *apiserver_args,
        ]
        api_proc = _start_apiserver(procs, api_argv, url)
        api_log = procs.logs / "kube-apiserver.log"
        ca = root / "pki" / "apiserver.crt"  # the self-signed pair --cert-dir wrote (chain with its CA)
        kubeconfig = write_kubeconfig(root / "admin.kubeconfig", url, ca, ADMIN_TOKEN)
        api = KubeAPI(url, ADMIN_TOKEN, ca)
        assert api.get("/readyz") == "ok"
        yield ControlPlane(root, bin_dir, url, ca, ADMIN_TOKEN, kubeconfig, api, procs,
                           {"etcd": etcd_log, "kube-apiserver": api_log}, etcd_url, api_argv, api_proc)
    finally:
        procs.stop_all()
        left = procs.leftovers()
        assert not left, f"control-plane process groups still alive after teardown: {left}"


def _etcd_healthy(url: str) -> bool:
    with _session() as s:
        r = s.get(f"{url}/health", timeout=2)
    return r.status_code == 200 and json.loads(r.text).get("health") == "true"


# ---- kube-scheduler -------------------------------------------------------------------------------

@dataclass
class KubeScheduler:
    proc: subprocess.Popen
    log: Path
    config: Path
    port: int

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def scheduler_config_for(cp: ControlPlane, config: dict) -> dict:
    """``config`` with the one change a process outside a pod needs: the client connection's
    kubeconfig (in a pod kube-scheduler uses its service account, ``clientConnection.kubeconfig``
    empty; the ``--kubeconfig`` flag is ignored when ``--config`` is given)."""
    out = copy.deepcopy(config)
    out.setdefault("clientConnection", {})["kubeconfig"] = str(cp.kubeconfig)
    return out


def scheduler_flags(cp: ControlPlane, name: str, port: int) -> list[str]:
    """What a kube-scheduler outside a pod adds to its command: delegated authentication and
    authorization through the admin kubeconfig (in a pod: its service account), and /healthz on
    a free loopback port with a self-signed pair in the test directory."""
    kubeconfig = str(cp.kubeconfig)
    return ["--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
            "--bind-address", HOST, "--secure-port", str(port), "--cert-dir", str(cp.root / f"{name}-pki")]


@contextlib.contextmanager
def kube_scheduler(cp: ControlPlane, name: str, args: list[str]) -> Iterator[KubeScheduler]:
    """``kube-scheduler ARGS`` (e.g. ``--config=FILE --v=2``, or ``--kubeconfig`` for the built-in
    defaults) against ``cp`` with :func:`scheduler_flags`; healthy on entry, stopped on exit."""
    port = free_port()
    config = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), "")
    procs = Processes(cp.root)
    proc, log = procs.start(name, [str(cp.bin / "kube-scheduler"), *args, *scheduler_flags(cp, name, port)])
    try:
        _wait_ready(proc, log, lambda: _get_ok(f"https://{HOST}:{port}/healthz", verify=False), name)
        yield KubeScheduler(proc, log, Path(config), port)
    finally:
        procs.stop_all()
        left = procs.leftovers()
        assert not left, f"{name} still alive after teardown: {left}"


def check_scheduler_config(cp: ControlPlane, config: dict,
                           name: str = "config-check") -> tuple[int, str, dict]:
    """What kube-scheduler itself makes of ``config``: ``--write-config-to`` decodes it strictly,
    defaults and validates it, builds every profile's framework and the extenders' clients, writes
    the completed configuration and exits (no API server contact, no serving). Returns (exit
    status, its log, the completed configuration or {})."""
    cfg_path, out = cp.root / f"{name}.config.yaml", cp.root / f"{name}.completed.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    out.unlink(missing_ok=True)
    res = subprocess.run([str(cp.bin / "kube-scheduler"), "--config", str(cfg_path), "--write-config-to",
                          str(out), "--secure-port", "0"],
                         capture_output=True, text=True, timeout=60, check=False, cwd=cp.root)
    done = yaml.safe_load(out.read_text()) if res.returncode == 0 and out.exists() else {}
    return res.returncode, res.stdout + res.stderr, done


# ---- nodes -------------------------------------------------------------------------------------------

def ready_condition(ready: bool = True) -> dict:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"type": "Ready", "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kubelet is posting ready status" if ready else "container runtime network not ready",
            "lastHeartbeatTime": now, "lastTransitionTime": now}


def node_object(nodes: NodeTable, i: int, labels: dict[str, str] | None = None) -> dict:
    """Node ``i`` of ``nodes`` as a kubelet registers it (``node_to_json``: capacity and
    allocatable CPU, memory, pods, ``nvidia.com/gpu``; the GPU model label)."""
    obj = node_to_json(nodes, i)
    obj = {"apiVersion": "v1", "kind": "Node", **obj}
    obj["metadata"]["labels"].update({"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                                      **(labels or {})})
    obj["status"].pop("conditions", None)  # the kubelet posts them through /status
    return obj


def create_nodes(api: KubeAPI, nodes: NodeTable,
                 labels: dict[str, dict[str, str]] | None = None) -> list[dict]:
    """Register every node of ``nodes`` (``labels``: extra labels per node name), post its Ready
    condition through the ``/status`` subresource, and untaint it.

    The apiserver's TaintNodesByCondition admission plugin gives every new Node the
    ``node.kubernetes.io/not-ready:NoSchedule`` taint; kube-controller-manager's node lifecycle
    controller lifts it once the node reports Ready. No controller-manager runs here, so this
    does its part (without it kube-scheduler finds every node tainted)."""
    out = []
    for i, name in enumerate(nodes.names):
        api.create("/api/v1/nodes", node_object(nodes, i, (labels or {}).get(name)))
        set_node_ready(api, name, True)
        out.append(api.merge_patch(f"/api/v1/nodes/{quote(name)}", {"spec": {"taints": None}}))
    return out


def set_node_ready(api: KubeAPI, name: str, ready: bool) -> dict:
    """The kubelet's status update: the Ready condition, through ``/status`` (a strategic merge
    by condition type, as the kubelet patches it)."""
    return api.request("PATCH", f"/api/v1/nodes/{quote(name)}/status",
                       {"status": {"conditions": [ready_condition(ready)]}},
                       content_type="application/strategic-merge-patch+json")
