"""``single_threaded`` leaves every numeric library of the process on one thread (fedsched serve,
the evaluation runs, the main job's and the hub's worker processes call it: an idle OpenBLAS
worker spins on its core after each call)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json
import numpy, torch  # noqa: F401  (load their thread pools first)
from threadpoolctl import threadpool_info
before = [p["num_threads"] for p in threadpool_info()]
from fedsched.common.compute import single_threaded
single_threaded()
print(json.dumps({"before": before, "after": [p["num_threads"] for p in threadpool_info()],
                  "torch": torch.get_num_threads()}))
"""


def test_single_threaded_leaves_one_thread_in_every_pool():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] and max(got["before"]) == 2  # the environment asked for two
    assert set(got["after"]) == {1} and got["torch"] == 1


WORKER = """
import json
import numpy  # noqa: F401  (its BLAS pool first)
from threadpoolctl import threadpool_info
from fedsched.common.compute import single_threaded_worker
single_threaded_worker()
import torch
after = [p["num_threads"] for p in threadpool_info()]
print(json.dumps({"after": after, "torch": torch.get_num_threads()}))
"""


def test_worker_processes_start_single_threaded():
    """The main job's pool and the hub's central evaluation workers: one thread in every pool."""
    out = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(got["after"]) == {1} and got["torch"] == 1
