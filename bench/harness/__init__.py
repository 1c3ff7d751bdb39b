"""The harness the benchmarks share, and the tests share with them (the tests import
``bench.harness.*``; nothing here imports ``tests`` or pytest). One module per concern:

- ``stats``: timing statistics;
- ``cpu``: CPU pinning, the BLAS/OpenMP thread variables, CPU accounting and process memory;
- ``provenance``: the git commit, the machine, and writing a result's JSON;
- ``ports``: free TCP ports on loopback;
- ``polling``: ``wait_for``, polling a condition until a deadline;
- ``processes``: processes in their own sessions with their logs (``Procs``), a log's tail;
- ``extender_client``: the scheduler extender's client as kube-scheduler talks to it
  (``Endpoint``, ``Client``) and a metric read from ``/metrics`` text;
- ``serve``: a ``fedsched serve`` process (``serve_process``), and a benchmark's pinned agent
  on top of it (``serve_agent``);
- ``fuzz_strategies``: the hypothesis strategies for requests a scheduler should never send;
- ``charts``: the Helm charts rendered offline (helm-python-sdk), manifest lookup, and the
  charts' in-pod layout mapped onto loopback (``Localizer``);
- ``control_plane``: a real etcd + kube-apiserver + kube-scheduler on loopback, from the
  binaries ``scripts/build_k8s.sh`` builds into ``.k8s/bin/``.

The modules import the standard library, third-party packages, ``fedsched`` and each other,
the latter relatively (``from .ports import free_port``): the benchmarks run as
``python bench/NAME.py``, which puts ``bench/`` on ``sys.path`` and imports this package as
``harness``, while the tests import it as ``bench.harness`` (the repository root on
``sys.path``). :data:`ROOT` is the repository root.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
