"""A member cluster's side: the local learner, its Flower client, the online scheduler agent and
its view of the cluster.

Sub-packages: ``learning`` (Gymnasium env, PPO, TD3, behaviour cloning, training runs, the
``train`` command), ``cluster`` (the serving cache, Kubernetes objects and watches, Prometheus
telemetry), ``serving`` (decider with its safety filter and fallback, HTTP extender, gRPC
decision service, model store, metrics, decision log, outcomes, the ``serve`` command),
``federation`` (the Flower ClientApp, its task module and its mods). ``policies/`` holds the
shipped checkpoints, ``deploy/`` and ``prometheus/`` sample configuration.

May import: ``fedsched.common``; never ``fedsched.coordinator``.
"""
