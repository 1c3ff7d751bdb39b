"""Compute in worker processes: how many threads the numeric libraries use in one process, and
process pools that end with the process that started them.

For worker processes: :func:`worker_pool` (a process pool that a failure or Ctrl-C
ends at once), :func:`die_with_parent` (a pool worker's initializer that ends the worker with
the process that started it), :func:`single_threaded_worker` and :func:`background_worker`
(the same, one BLAS thread, and for the second the lowest CPU priority) and
:func:`kill_with_parent_thread` (the same for any child).

One BLAS (and torch) thread: the work of one decision is a few small matrix products, where a
second thread only adds overhead, and an idle OpenBLAS worker spins on its core for a while
after every call (in ``fedsched serve`` on 2 cores it burnt half a core beside kube-scheduler,
the API server and etcd). Parallelism comes from processes: evaluation runs, Flower members.

May import: nothing from fedsched.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import BaseContext

MANAGER_JOIN_S = 10.0  # stop_pool's wait for the executor's manager thread
BACKGROUND_NICE = 19  # background_worker's niceness: the lowest priority


def single_threaded() -> None:
    """One BLAS/OpenMP thread in this process, and one torch intra-op thread if torch is loaded."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def single_threaded_worker() -> None:
    """A worker process's initializer (the main job's pool, the hub's central evaluation): torch
    loaded first, then :func:`single_threaded`, so that its pool is limited too. Two processes
    each with two OpenBLAS threads on two cores ran the policy's network 3-4x slower at 500
    candidate nodes."""
    import torch  # noqa: F401  (loaded so that single_threaded limits its threads)

    die_with_parent()
    single_threaded()


def background_worker() -> None:
    """:func:`single_threaded_worker` at the lowest CPU priority: Linux's ``SCHED_IDLE`` policy
    (a CPU share of about 3 against a normal process's 1024), and nice ``BACKGROUND_NICE``
    where there is no such policy. A pool queued beside a foreground job that holds the
    critical path (the main job's Flower runs) takes the CPU time that job leaves idle (its
    runtime's start-up, a round's last member) instead of sharing every core with it. Nice 19
    alone is not enough there: Ray runs its workers at nice 15, against which nice 19 still
    took a third of the CPU. Where the OS refuses, the worker runs as it is."""
    single_threaded_worker()
    with contextlib.suppress(OSError, AttributeError):
        os.nice(BACKGROUND_NICE)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def kill_with_parent_thread() -> None:
    """SIGKILL this process when the thread that started it ends (``PR_SET_PDEATHSIG``, Linux;
    elsewhere nothing changes). Also a ``preexec_fn`` for services started with ``subprocess``."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def die_with_parent() -> None:
    """A pool worker's initializer: the worker is killed when the thread that started it ends
    (:func:`kill_with_parent_thread`), and ends now if its parent is already gone. A worker
    holds nothing to clean up; without this, the workers of a parent that was killed (SIGKILL,
    or SIGTERM without a handler) finish their task and then wait for work forever. Start the
    pool's workers from a thread that lives as long as the pool.

    Ctrl-C is the parent's to handle (a terminal sends it to the whole foreground group: each
    worker would print its own KeyboardInterrupt), and SIGTERM ends a worker whatever handler
    it inherited from a forking parent."""
    kill_with_parent_thread()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid != os.getppid():  # the parent died before the line above
        os._exit(1)


@contextlib.contextmanager
def worker_pool(workers: int, mp_context: BaseContext | None = None,
                initializer: Callable[[], None] = die_with_parent) -> Iterator[ProcessPoolExecutor]:
    """A :class:`ProcessPoolExecutor` of ``workers`` processes started with ``initializer`` (one
    that calls :func:`die_with_parent`). Leaving the block normally waits for the pool's work;
    leaving it by an exception (Ctrl-C included) ends the pool at once (:func:`stop_pool`),
    where the executor's own ``with`` would run every queued task first."""
    pool = ProcessPoolExecutor(workers, mp_context=mp_context, initializer=initializer)
    try:
        yield pool
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown()


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel what is queued and end the workers now: their running tasks' results would be lost
    anyway, and without this the interpreter's exit waits for every running task. The workers
    are reached through the executor's ``_processes`` (CPython's, there since 3.2; there is no
    public way to end running tasks).

    Returns once the executor's manager thread has seen its workers die and closed its pipes
    (``_executor_manager_thread``, at most ``MANAGER_JOIN_S``): at the interpreter's exit
    ``concurrent.futures`` wakes every manager thread still listed, and one closing its pipe at
    that moment ended the exit with ``OSError: [Errno 9] Bad file descriptor`` and a traceback."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        with contextlib.suppress(OSError, ValueError):
            worker.kill()
    if isinstance(manager, threading.Thread) and manager is not threading.current_thread():
        manager.join(MANAGER_JOIN_S)
