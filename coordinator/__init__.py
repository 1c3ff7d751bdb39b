"""The hub: the Flower ServerApp (``server_app``), its strategies (``strategies``: INT8 updates,
update validation, the parent's aggregation), central evaluation (``evaluation``), the
mutual-TLS gateway and sidecar configs (``mtls``) and the Helm charts' generated files
(``chart_configs``). The local experiment that runs hub and members together is
``fedsched.experiment``.

May import: ``fedsched.common`` only (never ``fedsched.agent``: the hub runs without the members'
code).
"""
