"""Free TCP ports on loopback, for the servers a benchmark or a test starts (``fedsched serve``,
etcd, kube-apiserver, kube-scheduler, Flower). Imports only the standard library."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port nothing listens on now (on loopback)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])
