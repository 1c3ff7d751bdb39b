"""The proxy configs that the Helm charts ship, rendered by :mod:`fedsched.coordinator.mtls`.

The charts (``charts/fedsched-hub``, ``charts/fedsched-agent``) cannot run Python, so the
nginx Fleet gateway and the stunnel sidecar configs are rendered here, with the in-pod
paths and ports the charts mount and expose, and checked in under each chart's ``files/``::

    python -m fedsched.coordinator.chart_configs --charts charts          # regenerate
    python -m fedsched.coordinator.chart_configs --charts charts --check  # exit 1 if stale

The only values a chart knows at install time and this module does not are host names
(the SuperLink's Service name, the hub's address); they are rendered as placeholders
(:data:`SUPERLINK_HOST`, :data:`HUB_ADDRESS`, :data:`HUB_NAME`) that the chart's templates
replace. :func:`hub_gateway_conf` and :func:`member_sidecar_conf` called with the real host
names give exactly what the chart renders (``tests/charts`` checks that equality on every CI
values file), so there is one source of these configs: ``mtls.py``.

The agent chart's PrometheusRule embeds the recording rules the package ships
(``common/data/prometheus/recording-rules.yaml``); the chart's ``files/recording-rules.yaml`` is a
relative symbolic link to that one file (Helm follows it when it loads or packages the chart), so
nothing is generated for it here.

May import: ``fedsched.coordinator.mtls`` and the standard library.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from fedsched.coordinator.mtls import nginx_conf, stunnel_conf

# ---- the hub's Fleet gateway (nginx, its own Deployment) -------------------------------------

#: The gateway's certificates as one projected volume: ``hub.crt``/``hub.key`` (the gateway's
#: serving certificate, from its kubernetes.io/tls Secret) and ``ca.crt`` (the CA of the
#: members' client certificates), the file names :func:`mtls.nginx_conf` reads.
GATEWAY_CERTS_DIR = "/etc/fedsched/gateway"
#: The CA that signed the SuperLink's certificate (``ca.crt`` of the SuperLink's TLS Secret).
GATEWAY_UPSTREAM_CA = "/etc/fedsched/superlink-ca/ca.crt"
#: emptyDir for nginx's pid and temp files (the root filesystem is read-only).
GATEWAY_WORKDIR = "/tmp/nginx"
GATEWAY_CONFIG_DIR = "/etc/fedsched/nginx"
GATEWAY_PORT = 9443  # container port (unprivileged); the Service maps 443 to it
SUPERLINK_PORT = 8000  # Flower 1.42's one HTTP(S) port: Fleet, Control and Runtime APIs
SUPERLINK_HEALTH_PORT = 8081  # --health-server-address (plain gRPC health, for probes)
#: Placeholder of the SuperLink Service's DNS name (``NAME.NAMESPACE.svc``): nginx proxies to
#: it and verifies the SuperLink's certificate for it.
SUPERLINK_HOST = "@SUPERLINK_HOST@"

# ---- a member's mTLS sidecar (stunnel, beside the SuperNode) --------------------------------

#: The member's client certificate for the hub link (``tls.crt``/``tls.key``) and the CA that
#: signed the hub gateway's certificate (``ca.crt``).
SIDECAR_CLIENT_DIR = "/etc/fedsched/hub-client"
#: The sidecar's serving certificate for the SuperNode (``localhost``/``127.0.0.1``); the
#: SuperNode verifies it with ``--root-certificates SIDECAR_SERVER_DIR/ca.crt``.
SIDECAR_SERVER_DIR = "/etc/fedsched/sidecar"
SIDECAR_WORKDIR = "/tmp/stunnel"
SIDECAR_CONFIG_DIR = "/etc/fedsched/stunnel"
SIDECAR_PORT = 9092  # the SuperNode's --superlink 127.0.0.1:9092
SIDECAR_HOP_PORT = 9093  # loopback hop between stunnel's server and client halves
#: stunnel logs to a file in its emptyDir: warnings and errors only (no line per connection).
SIDECAR_LOG_LEVEL = "warning"
#: Placeholders of the hub gateway's ``HOST:PORT`` (the port part is a stand-in: stunnel_conf
#: wants digits) and of the name its certificate is checked for.
HUB_ADDRESS = "@HUB_HOST@:1"
HUB_NAME = "@HUB_NAME@"

GATEWAY_FILE = Path("fedsched-hub") / "files" / "nginx.conf"
SIDECAR_FILE = Path("fedsched-agent") / "files" / "stunnel.conf"


def superlink_host(fullname: str, namespace: str) -> str:
    """The SuperLink Service's DNS name as the hub chart forms it (``<fullname>-superlink``)."""
    return f"{fullname}-superlink.{namespace}.svc"


def hub_gateway_conf(superlink: str = SUPERLINK_HOST) -> str:
    """The hub chart's nginx config: mTLS on :data:`GATEWAY_PORT`, only ``POST /v1/fleet/...``
    proxied to ``superlink:8000`` (verified for that name), logs to the container's output."""
    return nginx_conf(GATEWAY_CERTS_DIR, GATEWAY_PORT, SUPERLINK_PORT, GATEWAY_WORKDIR,
                      listen_host="0.0.0.0", upstream_host=superlink, upstream_ssl_name=superlink,
                      upstream_ca=GATEWAY_UPSTREAM_CA, access_log="/dev/stdout", error_log="/dev/stderr")


def member_sidecar_conf(hub_address: str = HUB_ADDRESS, hub_name: str = HUB_NAME) -> str:
    """The agent chart's stunnel config: TLS from the SuperNode on 127.0.0.1:9092, mutual TLS
    with the member's client certificate to ``hub_address`` (verified for ``hub_name``)."""
    return stunnel_conf(f"{SIDECAR_CLIENT_DIR}/tls.crt", f"{SIDECAR_CLIENT_DIR}/tls.key",
                        f"{SIDECAR_CLIENT_DIR}/ca.crt", SIDECAR_PORT, hub_address, SIDECAR_WORKDIR,
                        server_cert=f"{SIDECAR_SERVER_DIR}/tls.crt",
                        server_key=f"{SIDECAR_SERVER_DIR}/tls.key", hop_port=SIDECAR_HOP_PORT,
                        hub_name=hub_name, debug=SIDECAR_LOG_LEVEL)


@dataclass(frozen=True)
class ChartFile:
    path: Path  # relative to the charts directory
    text: str


def chart_files() -> list[ChartFile]:
    """Every generated file under ``charts/*/files/`` with its current content."""
    return [ChartFile(GATEWAY_FILE, hub_gateway_conf()), ChartFile(SIDECAR_FILE, member_sidecar_conf())]


def stale_files(charts: Path) -> list[Path]:
    """The generated files under ``charts`` that differ from (or lack) the current output."""
    return [charts / f.path for f in chart_files()
            if not (charts / f.path).is_file() or (charts / f.path).read_text() != f.text]


def write_files(charts: Path) -> list[Path]:
    """Write every generated file; returns those that changed."""
    changed = stale_files(charts)
    for f in chart_files():
        target = charts / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.text)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--charts", type=Path, default=Path("charts"), help="the charts directory")
    p.add_argument("--check", action="store_true", help="only check: exit 1 if a file is stale")
    args = p.parse_args(argv)
    if args.check:
        stale = stale_files(args.charts)
        for path in stale:
            print(f"stale: {path} (run python -m fedsched.coordinator.chart_configs)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_files(args.charts):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
