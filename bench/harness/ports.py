"""Free TCP ports on loopback, for the servers a benchmark or a test starts (``fedsched serve``,
etcd, kube-apiserver, kube-scheduler, Flower): :func:`fedsched.experiment.processes.free_port`,
re-exported."""

from __future__ import annotations

from fedsched.experiment.processes import HOST, free_port

__all__ = ["HOST", "free_port"]
