"""The hub of a fleet on one machine (the kwok fleet, :mod:`fedsched.experiment.fleet`): a Flower
1.42 SuperLink with SuperNode authentication behind the mutual-TLS gateway, and for each member
its stunnel sidecar and its SuperNode, on loopback, as ``tests/coordinator/test_mtls.py`` checks
the same link:

    flower-supernode --TLS--> stunnel sidecar --mTLS (member's client certificate)--> nginx gateway
        --TLS--> flower-superlink (--enable-supernode-auth, --database)

The gateway and the sidecar are :func:`fedsched.coordinator.mtls.nginx_conf` and
:func:`~fedsched.coordinator.mtls.stunnel_conf` (what the charts render); every certificate comes
from :mod:`fedsched.common.security.certs` (one CA: the hub's serving certificate, each member's
client certificate for the link and its sidecar's serving certificate). Each member's SuperNode
key (EC) is registered with ``flwr supernode register`` before it starts. The operator's
``flwr`` talks to the Control API on the SuperLink's own port, never through the gateway.

Imports the standard library, :mod:`fedsched.common.security.certs`,
:mod:`fedsched.coordinator.mtls` and this package's :mod:`.flower` and :mod:`.processes`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fedsched.common.security import certs
from fedsched.coordinator.mtls import nginx_conf, stunnel_conf
from fedsched.experiment.flower import (
    BIN,
    FLOWER_ENV,
    HOST,
    NGINX,
    STUNNEL,
    ec_auth_key,
    flwr,
    missing_tools,
    wait_online,
    wait_port,
    write_connection,
)
from fedsched.experiment.processes import Procs, free_port

__all__ = ["Hub", "MemberLink", "node_config_arg", "start_hub"]

CONNECTION = "hub"


def node_config_arg(config: Mapping[str, object]) -> str:
    """A SuperNode's ``--node-config`` value: ``key=value`` pairs, strings double-quoted (the
    form the agent chart renders)."""
    parts = []
    for k, v in config.items():
        parts.append(f'{k}={v}' if isinstance(v, int | float) and not isinstance(v, bool) else f'{k}="{v}"')
    return " ".join(parts)


@dataclass
class MemberLink:
    """A member's side of the hub link: its sidecar's port, its SuperNode key, its SuperNode."""

    name: str
    sidecar_port: int
    key: Path
    supernode: subprocess.Popen | None = None
    log: Path | None = None


@dataclass
class Hub:
    """A running hub (see the module docstring)."""

    root: Path
    certs: Path
    procs: Procs
    superlink_port: int
    ingress_port: int
    nginx_dir: Path
    flwr_env: dict[str, str]
    node_env: dict[str, str]
    members: dict[str, MemberLink] = field(default_factory=dict)

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return flwr(self.flwr_env, self.root, *args, timeout=timeout)

    def link(self, name: str) -> MemberLink:
        """Certificates, the stunnel sidecar and a registered SuperNode key for member ``name``."""
        certs.issue(self.certs, name)  # the cluster's client certificate for the hub link
        certs.issue(self.certs, f"sidecar-{name}", kind="server", hosts=["localhost"], ips=[HOST])
        port, hop = free_port(), free_port()
        sdir = self.root / f"stunnel-{name}"
        sdir.mkdir(exist_ok=True)
        client = certs.leaf_files(self.certs, name)
        server = certs.leaf_files(self.certs, f"sidecar-{name}", "server")
        (sdir / "stunnel.conf").write_text(stunnel_conf(
            client.cert, client.key, self.certs / certs.CA_CRT, port, f"{HOST}:{self.ingress_port}", sdir,
            server_cert=server.cert, server_key=server.key, hop_port=hop))
        st, _ = self.procs.start(f"stunnel-{name}", [str(STUNNEL), str(sdir / "stunnel.conf")])
        wait_port(port, st, sdir / "stunnel.log")
        keys = self.root / "keys"
        keys.mkdir(exist_ok=True)
        priv, pub = ec_auth_key(keys, f"supernode-{name}")
        reg = self.flwr("supernode", "register", str(pub), CONNECTION, "--format", "json")
        if reg.returncode != 0:
            raise RuntimeError(f"flwr supernode register failed:\n{reg.stdout}\n{reg.stderr}")
        link = MemberLink(name, port, priv)
        self.members[name] = link
        return link

    def start_supernode(self, name: str, node_config: Mapping[str, object],
                        env: Mapping[str, str] | None = None, extra: tuple[str, ...] = ()) -> MemberLink:
        """Member ``name``'s SuperNode through its sidecar with ``node_config`` (``extra``: more
        ``flower-supernode`` arguments)."""
        link = self.members[name]
        proc, log = self.procs.start(f"supernode-{name}", [
            str(BIN / "flower-supernode"), "--superlink", f"{HOST}:{link.sidecar_port}",
            "--root-certificates", str(self.certs / certs.CA_CRT),
            "--auth-supernode-private-key", str(link.key),
            "--node-config", node_config_arg(node_config),
            "--host", HOST, "--port", str(free_port()), *extra,
        ], env={**self.node_env, **(env or {})})
        link.supernode, link.log = proc, log
        return link

    def wait_online(self, count: int, timeout: float = 60) -> None:
        logs = [m.log for m in self.members.values() if m.log is not None] + [self.nginx_dir / "error.log"]
        wait_online(self.flwr_env, self.root, count, logs, CONNECTION, timeout)


@contextlib.contextmanager
def start_hub(root: Path) -> Iterator[Hub]:
    """The SuperLink (node authentication, TLS, a database) behind the nginx gateway, in ``root``;
    everything stopped on exit. Members join with :meth:`Hub.link` and :meth:`Hub.start_supernode`."""
    why = missing_tools()
    if why:
        raise RuntimeError("; ".join(why))
    cdir, logs = root / "certs", root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    certs.init_ca(cdir, hub_hosts=["localhost"], hub_ips=[HOST], force=True)
    procs = Procs(logs)
    base_env = {**os.environ, **FLOWER_ENV}
    try:
        sl_port = free_port()
        sl_home = root / "superlink-home"
        sl_home.mkdir(exist_ok=True)
        sl, sl_log = procs.start("superlink", [
            str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(cdir / certs.CA_CRT),
            "--ssl-certfile", str(cdir / certs.HUB_CRT), "--ssl-keyfile", str(cdir / certs.HUB_KEY),
            "--enable-supernode-auth", "--disable-runtime-dependency-installation",
            "--host", HOST, "--port", str(sl_port), "--database", str(root / "superlink.db"),
        ], env={**base_env, "FLWR_HOME": str(sl_home)})
        wait_port(sl_port, sl, sl_log)
        ingress_port = free_port()
        ngx_dir = root / "nginx"
        ngx_dir.mkdir(exist_ok=True)
        conf = ngx_dir / "nginx.conf"
        conf.write_text(nginx_conf(cdir, ingress_port, sl_port, ngx_dir,
                                   user="root" if os.geteuid() == 0 else None))
        ngx, _ = procs.start("nginx", [str(NGINX), "-p", str(ngx_dir), "-e", str(ngx_dir / "error.log"),
                                       "-c", str(conf), "-g", "daemon off;"])
        wait_port(ingress_port, ngx, ngx_dir / "error.log")
        home = root / "flwr-home"
        write_connection(home, f"{HOST}:{sl_port}", cdir / certs.CA_CRT, CONNECTION)
        yield Hub(root, cdir, procs, sl_port, ingress_port, ngx_dir, {**base_env, "FLWR_HOME": str(home)},
                  {**base_env, "FLWR_HOME": str(root / "supernode-home")})
    finally:
        procs.stop_all()
