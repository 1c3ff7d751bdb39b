"""Shared by the hub and every member: the cluster model, the simulators, the baselines, the
learned policies' networks and checkpoints, the federation codec, certificates and the CLI.

Sub-packages, from the bottom up (each imports only packages listed before it):
``model`` (cluster tables, trace loader, synthetic clusters, fragmentation, metrics),
``schedulers`` (the scorer interface and the baselines), ``learning`` (features, networks,
checkpoints, scorers, ONNX export, decision records), ``sim`` (packing and replay
simulators, the evaluation harness), ``federation`` (weight codec and I/O, run config, member
clusters), ``security`` (certificates), ``proto`` (wire protocols), ``cli`` (the ``fedsched``
command: one module per subcommand, loaded by name); ``files`` holds the one atomic-write
helper every package uses, ``compute`` the one thread setting of the numeric libraries.

May import: nothing from ``fedsched.agent`` or ``fedsched.coordinator`` (checked by
``tests/test_architecture.py``).
"""
