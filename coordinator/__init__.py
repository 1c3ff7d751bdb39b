"""The hub: the Flower ServerApp (``server_app``), its strategies (``strategies``: INT8 updates,
update validation, the parent's aggregation), central evaluation (``evaluation``), the local
main job (``federate`` and its command, ``cli``) and the mutual-TLS gateway and sidecar
configs (``mtls``).

May import: ``fedsched.common``; ``fedsched.agent`` only in ``federate`` (the local main job
runs members in-process for its local-only baselines).
"""
