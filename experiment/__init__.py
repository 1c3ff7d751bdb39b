"""The local multi-cluster federated experiment (the main job, ``fedsched federate``): Flower
simulations of non-IID member clusters with FedAvg and FedProx (``federate``), its settings
(``config``), the local-only baselines and per-member evaluation (``baselines``) and its report
as text (``report_text``) and as one HTML file (``report_html``).

May import: ``fedsched.common``, ``fedsched.agent`` (a member's round, for the local-only
baselines) and ``fedsched.coordinator`` (the hub's starting model).
"""
