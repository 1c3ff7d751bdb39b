"""The phases of ``bench/extender_load.py``, one module each: the cluster and the requests
(``workload``), the agent's /metrics (``metrics``), then ``latency``, ``throughput``, ``grpc``,
``fuzz``, ``soak`` and ``fallback``, and the goals and the printed summary (``report``).
They import ``fedsched``, the shared harness (``harness.*``, never ``tests``) and each other
(``extender.*``), with ``bench/`` on ``sys.path`` as ``python bench/NAME.py`` puts it."""
