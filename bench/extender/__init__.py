"""The phases of ``bench/extender_load.py``, one module each: the cluster and the requests
(``workload``), the agent's /metrics (``metrics``), then ``latency``, ``throughput``, ``grpc``,
``fuzz``, ``soak`` and ``fallback``, and the goals and the printed summary (``report``)."""

import harness  # noqa: F401  (first: it puts the repository root on sys.path for the tests' helpers)
