"""A member cluster's side: the local learner, its Flower client, the online scheduler agent and
its view of the cluster.

Sub-packages: ``learning`` (Gymnasium env, PPO, TD3, behaviour cloning, training runs),
``cluster`` (the serving cache, Kubernetes objects and watches, Prometheus telemetry),
``serving`` (decider with its safety filter and fallback, HTTP extender, gRPC decision service,
model store, metrics, outcomes, the roll-out gate), ``federation`` (the Flower ClientApp, the
member's round and its learners, validation and mods). ``deploy/`` holds a sample
KubeSchedulerConfiguration for the extender. The ``train`` and ``serve`` commands are in
``fedsched.cli``; the shipped checkpoints and recording rules are package data of
``fedsched.common`` (``data/``).

May import: ``fedsched.common``; never ``fedsched.coordinator``.
"""
