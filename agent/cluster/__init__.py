"""The agent's view of its cluster: the serving cache (a simulator ``ClusterState`` kept current
from the API, ``cache``), Kubernetes objects as the simulator's pods and nodes
(``k8s_objects``), list-and-watch against the API server (``k8s_watch``), real use from
Prometheus (``telemetry``) and the cluster's recorded trace, the member's validation twin
(``recorder``, ``fedsched record``).

May import: ``fedsched.common``.
"""
