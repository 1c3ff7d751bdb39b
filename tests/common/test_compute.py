"""``single_threaded`` leaves every numeric library of the process on one thread (fedsched serve,
the evaluation runs, the main job's and the hub's worker processes call it: an idle OpenBLAS
worker spins on its core after each call); ``die_with_parent`` ends a pool worker with its parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_a_background_worker_is_single_threaded_at_the_lowest_priority():
    """The main job's pool beside its Flower runs: one thread, and only the CPU time the runs
    leave idle (SCHED_IDLE on Linux, nice 19), while the process that started it keeps its own
    priority."""
    from concurrent.futures import ProcessPoolExecutor

    from fedsched.common.compute import BACKGROUND_NICE, background_worker

    before = _niceness_and_torch_threads()[:2]
    with ProcessPoolExecutor(1, initializer=background_worker) as pool:
        niceness, policy, threads = pool.submit(_niceness_and_torch_threads).result(timeout=120)
    assert niceness == BACKGROUND_NICE == 19 and threads == 1
    if sys.platform == "linux":
        assert policy == os.SCHED_IDLE
    assert _niceness_and_torch_threads()[:2] == before


def _niceness_and_torch_threads() -> tuple[int, int, int]:
    import torch

    return os.nice(0), os.sched_getscheduler(0), torch.get_num_threads()


PARENT = """
import sys, time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from fedsched.common.compute import die_with_parent

def work(seconds):
    import os
    print(os.getpid(), flush=True)
    time.sleep(seconds)

if __name__ == "__main__":
    kind = sys.argv[1]
    pool = ProcessPoolExecutor(1, mp_context=get_context(kind), initializer=die_with_parent)
    pool.submit(work, 120)
    time.sleep(120)
"""


@pytest.mark.parametrize("kind", ["fork", "spawn"])
def test_a_pool_worker_dies_with_the_process_that_started_it(tmp_path, kind) -> None:
    """The parent of a pool is killed outright (SIGKILL: no handler, no cleanup): its worker, busy
    with a long task, is gone within seconds instead of finishing it and then waiting forever."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), kind], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())  # the worker runs its task
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10

        def alive() -> bool:
            try:
                return Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except (OSError, IndexError):
                return False

        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive()
    finally:
        if parent.poll() is None:
            parent.kill()


def _handlers() -> tuple[int, int]:
    return int(signal.getsignal(signal.SIGINT)), int(signal.getsignal(signal.SIGTERM))


def test_a_pool_worker_leaves_ctrl_c_to_its_parent_and_ends_on_sigterm() -> None:
    """A forked worker inherits its parent's handlers (here: SIGTERM raising, as the main job's
    does); it ignores Ctrl-C (the terminal sends it to the whole group: the parent stops the pool)
    and SIGTERM ends it plainly, so stopping a worker prints no traceback of its own."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from fedsched.common.compute import die_with_parent

    def raising(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raising)
    try:
        with ProcessPoolExecutor(1, mp_context=get_context("fork"), initializer=die_with_parent) as pool:
            got = pool.submit(_handlers).result(timeout=60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == (int(signal.SIG_IGN), int(signal.SIG_DFL))


def _sleep(seconds: float) -> int:
    import os

    time.sleep(seconds)
    return os.getpid()


def test_a_failed_block_ends_its_worker_pool_at_once() -> None:
    """Leaving ``worker_pool``'s block by an exception (Ctrl-C here) neither runs the queued tasks
    nor waits for the running one (the executor's own ``with`` would do both: minutes here); the
    workers and the executor's manager thread are gone. Left normally, it waits for the work as
    the executor does."""
    from fedsched.common.compute import worker_pool

    with worker_pool(1) as pool:
        assert pool.submit(_sleep, 0.1).result(timeout=60) > 0
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), worker_pool(2) as pool:
        futures = [pool.submit(_sleep, 60) for _ in range(4)]
        workers = list(pool._processes.values())  # the test looks inside
        manager = pool._executor_manager_thread
        time.sleep(0.5)  # both running their first task
        raise KeyboardInterrupt
    assert time.monotonic() - t0 < 30
    # the executor's thread is done with its pipes before the block is left: at the interpreter's
    # exit one still closing them ended the exit with "OSError: Bad file descriptor" (2 exits of 30)
    assert manager is not None and not manager.is_alive()
    for w in workers:
        w.join(10)
        assert not w.is_alive()
    deadline = time.monotonic() + 10  # the executor's thread marks the broken pool's futures
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(f.cancelled() or f.exception() is not None for f in futures)  # none ran to its end
