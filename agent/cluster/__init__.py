"""The agent's view of its cluster: the serving cache (a simulator ``ClusterState`` kept current
from the API, ``cache``), Kubernetes objects as the simulator's pods and nodes
(``k8s_objects``), list-and-watch against the API server (``k8s_watch``) and real use from
Prometheus (``telemetry``).

May import: ``fedsched.common``.
"""
