"""A real Kubernetes control plane on loopback for the tests and the scheduler benchmark: etcd,
kube-apiserver, kube-scheduler (:mod:`fedsched.experiment.control_plane`, moved there so the kwok
fleet, package code, starts it the same way; re-exported here for the tests and benchmarks)."""

from __future__ import annotations

from fedsched.experiment.control_plane import (
    ADMIN_TOKEN,
    BINARIES,
    HOST,
    K8S_BIN,
    START_TIMEOUT,
    ControlPlane,
    KubeAPI,
    KubeAPIError,
    KubeScheduler,
    Processes,
    check_scheduler_config,
    control_plane,
    create_nodes,
    kube_scheduler,
    missing_binaries,
    node_object,
    ready_condition,
    scheduler_config_for,
    scheduler_flags,
    set_node_ready,
    warnings_off,
    write_kubeconfig,
)

__all__ = ["ADMIN_TOKEN", "BINARIES", "HOST", "K8S_BIN", "START_TIMEOUT", "ControlPlane", "KubeAPI",
           "KubeAPIError", "KubeScheduler", "Processes", "check_scheduler_config", "control_plane",
           "create_nodes", "kube_scheduler", "missing_binaries", "node_object", "ready_condition",
           "scheduler_config_for", "scheduler_flags", "set_node_ready", "warnings_off", "write_kubeconfig"]
