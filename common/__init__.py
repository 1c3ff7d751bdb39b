"""Shared by the hub and every member: the cluster model, the simulators, the baselines, the
learned policies' networks and checkpoints, the federation codec, certificates and shipped data.

Sub-packages, from the bottom up (each imports only packages listed before it):
``model`` (cluster tables, trace loader, synthetic clusters, fragmentation, metrics),
``schedulers`` (the scorer interface and the baselines), ``learning`` (features, networks,
checkpoints, scorers, ONNX export, decision records), ``sim`` (packing and replay
simulators, the evaluation harness), ``federation`` (weight codec and I/O, run config, member
clusters), ``security`` (certificates), ``proto`` (wire protocols); ``files`` holds the one
atomic-write helper every package uses, ``compute`` the one thread setting of the numeric
libraries, ``dataclass_flags`` command-line flags derived from a dataclass's fields.

May import: nothing from ``fedsched.agent``, ``fedsched.coordinator``, ``fedsched.experiment`` or
``fedsched.cli``, by any means: no import statement, no module named by string, no package data
read from them (checked by ``tests/test_architecture.py``).
"""
