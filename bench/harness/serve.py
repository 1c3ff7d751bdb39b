"""``fedsched serve`` for a benchmark: started through the test suite's :func:`serve_process`,
pinned to one core with one BLAS/OpenMP thread, its logs in a file, waited on until ready; a
free port; a GET on a fresh connection. Talk to it with the test suite's :class:`Client`."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.cpu import ONE_THREAD_ENV, rss_mb
from tests.extender_support import Client, Endpoint, ServeProcess, serve_process

__all__ = ["Agent", "Client", "free_port", "get", "serve_agent"]


def free_port() -> int:
    """A TCP port nothing listens on now (on loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(endpoint: Endpoint, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET ``path`` on a connection of its own: the status and the body."""
    client = Client(endpoint, timeout=timeout)
    try:
        return client.raw("GET", path)
    finally:
        client.close()


@dataclass
class Agent:
    """A running ``fedsched serve``: HTTP on ``port`` (verbs under ``prefix``), gRPC on
    ``grpc_port`` when it was asked for, its logs in ``stderr_path``."""

    process: ServeProcess
    stderr_path: Path
    grpc_port: int | None = None

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def prefix(self) -> str:
        return self.process.prefix

    @property
    def pid(self) -> int:
        return self.process.proc.pid  # taskset execs the server: the same process

    @property
    def cmd(self) -> list[str]:
        return [str(x) for x in self.process.proc.args]

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(self.pid))

    def internal_error_lines(self) -> list[str]:
        """The log lines of requests it failed to handle."""
        text = self.stderr_path.read_text(errors="replace")
        return [x for x in text.splitlines() if "internal error" in x]


@contextlib.contextmanager
def serve_agent(
    *args: str, core: int, workdir: Path, name: str = "server", grpc: bool = False,
    ready_timeout_s: float = 60.0,
) -> Iterator[Agent]:
    """``taskset -c CORE fedsched serve ARGS --host 127.0.0.1 --port 0 --log-level warning``
    (and ``--grpc-port`` on a free port with ``grpc``), one BLAS/OpenMP thread, logs in
    ``WORKDIR/NAME.stderr.log``; yielded once /readyz answers 200, stopped (SIGTERM) on exit."""
    grpc_port = free_port() if grpc else None
    cmd = [*args, "--host", "127.0.0.1", "--port", "0", "--log-level", "warning"]
    if grpc_port is not None:
        cmd += ["--grpc-port", str(grpc_port)]
    stderr_path = workdir / f"{name}.stderr.log"
    with serve_process(*cmd, command_prefix=["taskset", "-c", str(core)], env=ONE_THREAD_ENV,
                       stderr_path=stderr_path) as sp:
        agent = Agent(sp, stderr_path, grpc_port)
        end = time.monotonic() + ready_timeout_s
        while True:
            try:
                if get(agent, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"fedsched serve never became ready: {stderr_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield agent
