"""The local multi-cluster federated experiment (the main job, ``fedsched federate``): Flower
simulations of non-IID member clusters with FedAvg and FedProx (``federate``), its settings
(``config``), the local-only baselines and per-member evaluation (``baselines``) and its report
as text (``report_text``) and as one HTML file (``report_html``); and the fleet on one machine
(``python -m fedsched.experiment.fleet``): kwok member clusters with the real Kubernetes
components, Prometheus, ``fedsched serve`` and ``fedsched record`` (``fleet``, ``kwok``,
``control_plane``, ``prometheus``, ``processes``), federated through a real hub behind mutual
TLS (``hub``, ``flower``).

May import: ``fedsched.common``, ``fedsched.agent`` (a member's round, for the local-only
baselines) and ``fedsched.coordinator`` (the hub's starting model).
"""
