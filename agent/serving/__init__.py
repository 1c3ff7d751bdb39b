"""Serving decisions to kube-scheduler: the decider (safety filter, the policy within a budget,
kube-default fallback), the HTTP extender, the gRPC decision service, the hot-reloading model
store, Prometheus metrics, the decision log and outcome recording (the ``fedsched serve`` command
that starts them is ``fedsched.cli.serve``).

May import: ``fedsched.common`` and ``fedsched.agent.cluster``; never the trainers of
``fedsched.agent.learning`` (serving runs without them).
"""
