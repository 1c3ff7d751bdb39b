"""Config generators for the hub link's mutual TLS around Flower (which has none itself).

Flower 1.42's SuperLink serves the Fleet API (``/v1/fleet/...``, protobuf over HTTP/1.1),
the Control API (``/v1/control/...``, unauthenticated in the open-source build) and the
Runtime API (``/v1/runtime/...``) on one HTTP(S) port; it never asks for a client
certificate and a SuperNode cannot present one. The hub link is
therefore::

    SuperNode --TLS--> member sidecar (stunnel) --mTLS, cluster's client cert--> hub ingress
    (nginx, ssl_verify_client on, only /v1/fleet/) --TLS--> SuperLink

:func:`nginx_conf` writes the hub ingress, :func:`stunnel_conf` a member's sidecar. Both take
the files of a :mod:`fedsched.common.security.certs` directory (``ca.crt``, ``hub.{crt,key}``,
``clients/NAME.{crt,key}``, ``servers/NAME.{crt,key}``) and keep every runtime file (pid,
logs, nginx temp dirs) inside ``workdir``, so they run as foreground processes without
touching system paths::

    nginx -p WORKDIR -e WORKDIR/error.log -c WORKDIR/nginx.conf -g 'daemon off;'
    stunnel WORKDIR/stunnel.conf

SuperNode authentication (``flower-superlink --enable-supernode-auth`` with keys registered
by ``flwr supernode register``) still applies end to end: its signed headers
(``flwr-public-key``, ``flwr-signature``, ``flwr-timestamp``) pass through both proxies.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from fedsched.common.security.certs import CA_CRT, HUB_CRT, HUB_KEY

#: Only these request URIs reach the SuperLink: the Fleet API's ``/v1/fleet/<method>``
#: (raw URI, checked before nginx's normalisation so ``..``/``%2e`` tricks cannot escape).
FLEET_URI_REGEX = r"^/v1/fleet/[A-Za-z0-9-]+$"
FLEET_PREFIX = "/v1/fleet/"


def _q(path: str | os.PathLike) -> str:
    """A path as an nginx/stunnel config value (absolute; no quoting metacharacters)."""
    p = str(Path(path).resolve())
    if any(c in p for c in ' ";{}\n\\'):
        raise ValueError(f"path {p!r} contains characters that cannot be used in the config")
    return p


def _log_target(path: str) -> str:
    """A log destination as given (``/dev/stdout``): absolute, no config metacharacters."""
    if not path.startswith("/") or any(c in path for c in ' ";{}\n\\'):
        raise ValueError(f"log path {path!r} must be absolute and free of config metacharacters")
    return path


def _split_host_port(host_port: str) -> tuple[str, int]:
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {host_port!r}")
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def nginx_conf(certs_dir: str | os.PathLike, listen_port: int, upstream_port: int,
               workdir: str | os.PathLike, *, listen_host: str = "127.0.0.1",
               upstream_host: str = "127.0.0.1", upstream_ssl_name: str = "localhost",
               upstream_ca: str | os.PathLike | None = None, user: str | None = None,
               max_body: str = "512m", read_timeout_s: int = 300,
               access_log: str | None = None, error_log: str | None = None) -> str:
    """The hub ingress: an nginx config that terminates mutual TLS and forwards only the Fleet API.

    * TLS server with ``CERTS/hub.crt``/``hub.key`` on ``listen_host:listen_port``;
      ``ssl_verify_client on`` against ``CERTS/ca.crt`` (depth 1: leaves of that CA only).
      A missing, foreign-CA or expired client certificate gets nginx's HTTP 400
      ("No required SSL certificate was sent" / "The SSL certificate error").
    * ``POST /v1/fleet/<method>`` is proxied over TLS to ``upstream_host:upstream_port`` (the
      SuperLink), verifying its certificate against ``upstream_ca`` (default ``CERTS/ca.crt``)
      for the DNS name ``upstream_ssl_name`` (default ``localhost``, the first DNS SAN of
      ``hub.crt`` from :func:`fedsched.common.security.certs.init_ca`; nginx checks DNS SANs only, never
      IP SANs, so with an IP ``upstream_host`` this must be a DNS name in the SuperLink's
      certificate, e.g. its Kubernetes service name). Unbuffered both ways
      (model updates and streamed object pulls). The verified client's subject and
      certificate fingerprint are passed on as ``X-Client-Subject``/``X-Client-Fingerprint``.
    * Other methods on the Fleet prefix get 403; every other path (``/v1/control/``,
      ``/v1/runtime/``, ``/``, anything non-canonical) gets 404.
    * pid, error/access logs and all temp paths live in ``workdir``; ``access_log`` and
      ``error_log`` send the logs elsewhere instead (a container's ``/dev/stdout`` and
      ``/dev/stderr``, taken as given: not resolved, which would follow the symlinks). ``user`` emits a
      ``user`` directive: when nginx starts as root its workers otherwise run as ``nobody``,
      which may be unable to write temp files in ``workdir``.

    Run with ``nginx -p WORKDIR -e WORKDIR/error.log -c FILE -g 'daemon off;'``.
    """
    certs, work = Path(certs_dir), Path(workdir)
    ca = _q(certs / CA_CRT)
    up_ca = _q(upstream_ca) if upstream_ca is not None else ca
    ssl_name = upstream_ssl_name
    up = f"[{upstream_host}]" if ":" in upstream_host else upstream_host
    listen = f"[{listen_host}]" if ":" in listen_host else listen_host
    w = _q(work)
    user_line = f"user {user};\n" if user else ""
    err_log = _log_target(error_log) if error_log is not None else f"{w}/error.log"
    acc_log = _log_target(access_log) if access_log is not None else f"{w}/access.log"
    return f"""# fedsched hub ingress: mutual TLS in front of the Flower SuperLink (Fleet API only).
{user_line}worker_processes 1;
pid {w}/nginx.pid;
error_log {err_log} info;

events {{
    worker_connections 512;
}}

http {{
    default_type application/octet-stream;
    access_log {acc_log};
    client_body_temp_path {w}/client_body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    server_tokens off;

    server {{
        listen {listen}:{int(listen_port)} ssl;
        server_name _;

        ssl_certificate {_q(certs / HUB_CRT)};
        ssl_certificate_key {_q(certs / HUB_KEY)};
        ssl_protocols TLSv1.2 TLSv1.3;
        # Mutual TLS: only leaf certificates issued by the fleet's CA.
        ssl_client_certificate {ca};
        ssl_verify_client on;
        ssl_verify_depth 1;

        client_max_body_size {max_body};

        location {FLEET_PREFIX} {{
            if ($request_uri !~ "{FLEET_URI_REGEX}") {{
                return 404;
            }}
            limit_except POST {{
                deny all;
            }}
            proxy_pass https://{up}:{int(upstream_port)};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Client-Subject $ssl_client_s_dn;
            proxy_set_header X-Client-Fingerprint $ssl_client_fingerprint;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {up_ca};
            proxy_ssl_name {ssl_name};
            proxy_ssl_server_name on;
            proxy_ssl_protocols TLSv1.2 TLSv1.3;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout {int(read_timeout_s)}s;
            proxy_send_timeout {int(read_timeout_s)}s;
        }}

        # The Control and Runtime APIs share the SuperLink's port: never expose them.
        location / {{
            return 404;
        }}
    }}
}}
"""


def stunnel_conf(client_cert: str | os.PathLike, client_key: str | os.PathLike, ca_cert: str | os.PathLike,
                 accept_port: int, connect_host_port: str, workdir: str | os.PathLike, *,
                 server_cert: str | os.PathLike | None = None, server_key: str | os.PathLike | None = None,
                 hop_port: int | None = None, accept_host: str = "127.0.0.1",
                 hub_name: str | None = None, debug: str = "info") -> str:
    """A member's sidecar: an stunnel config that presents the cluster's client certificate to the hub.

    The outgoing side connects to ``connect_host_port`` (the hub ingress) with TLS, presents
    ``client_cert``/``client_key`` and verifies the hub's certificate against ``ca_cert``
    (chain plus ``checkHost``/``checkIP`` of ``hub_name``, default the host of
    ``connect_host_port``; SNI set to it when it is a DNS name).

    The incoming side listens on ``accept_host:accept_port`` (loopback by default: the
    SuperNode runs beside it). With ``server_cert``/``server_key`` it accepts TLS (the
    SuperNode verifies that certificate with ``--root-certificates``): stunnel does either
    server- or client-mode TLS per service, so the two are chained through a plain hop on
    ``127.0.0.1:hop_port``. Without them it accepts plain TCP (then the SuperNode needs
    ``--insecure``; only for a sidecar reachable from its own pod).

    Foreground (``foreground = yes``), pid and log in ``workdir``: run ``stunnel FILE``.
    """
    host, _port = _split_host_port(connect_host_port)
    name = hub_name or host
    checks = f"checkIP = {name}" if _is_ip(name) else f"checkHost = {name}\nsni = {name}"
    w = _q(workdir)
    accept = f"[{accept_host}]" if ":" in accept_host else accept_host
    head = f"""; fedsched member sidecar: SuperNode -> (TLS) -> stunnel -> (mutual TLS) -> hub ingress
foreground = yes
pid = {w}/stunnel.pid
output = {w}/stunnel.log
syslog = no
debug = {debug}
"""
    outgoing = f"""client = yes
connect = {connect_host_port}
cert = {_q(client_cert)}
key = {_q(client_key)}
CAfile = {_q(ca_cert)}
verifyChain = yes
{checks}
sslVersionMin = TLSv1.2
"""
    if server_cert is None and server_key is None:
        return f"{head}\n[hub]\naccept = {accept}:{int(accept_port)}\n{outgoing}"
    if server_cert is None or server_key is None:
        raise ValueError("server_cert and server_key go together")
    if hop_port is None:
        raise ValueError("a TLS-accepting sidecar needs hop_port (a free loopback port between its halves)")
    return f"""{head}
; 1) TLS from the SuperNode, terminated with the sidecar's server certificate
[supernode-in]
accept = {accept}:{int(accept_port)}
connect = 127.0.0.1:{int(hop_port)}
cert = {_q(server_cert)}
key = {_q(server_key)}
sslVersionMin = TLSv1.2

; 2) mutual TLS to the hub ingress with the cluster's client certificate
[hub]
accept = 127.0.0.1:{int(hop_port)}
{outgoing}"""
