"""``fedsched serve`` as a separate process, for the benchmarks and the tests:
:func:`serve_process` runs it until it listens and SIGTERMs it on exit (:class:`ServeProcess`, an
extender :class:`~.extender_client.Endpoint`); :func:`serve_agent` is a benchmark's agent on top
of it: pinned to one core with one BLAS/OpenMP thread, its logs in a file, waited on until ready
(:class:`Agent`); :func:`get` is a GET on a fresh connection. Talk to it with
:class:`~.extender_client.Client`. Imports the standard library and its sibling modules."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .cpu import ONE_THREAD_ENV, rss_mb
from .extender_client import Client, Endpoint
from .ports import free_port

__all__ = ["Agent", "Client", "ServeProcess", "free_port", "get", "serve_agent", "serve_process"]


def get(endpoint: Endpoint, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET ``path`` on a connection of its own: the status and the body."""
    client = Client(endpoint, timeout=timeout)
    try:
        return client.raw("GET", path)
    finally:
        client.close()


@dataclass
class ServeProcess:
    """A running ``fedsched serve`` process (see :func:`serve_process`)."""

    proc: subprocess.Popen
    url: str = ""  # the verbs' URL prefix, e.g. http://127.0.0.1:PORT/scheduler
    base: str = ""  # the server's root (for /metrics, /readyz)
    stderr: str = ""  # the process's logs, after it stopped

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None, self.url
        return port

    @property
    def prefix(self) -> str:
        return urlsplit(self.url).path


@contextlib.contextmanager
def serve_process(
    *args: str,
    command_prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    stderr_path: Path | None = None,
) -> Iterator[ServeProcess]:
    """Run ``fedsched serve ARGS`` until it listens; SIGTERM it on exit (its logs in ``stderr``).

    ``command_prefix`` runs it under another command (``taskset -c 0``), ``env`` is added to its
    environment, and with ``stderr_path`` its logs go to that file as it runs (read into
    ``stderr`` at exit) rather than to a pipe read only at exit, which a long run would fill."""
    base_env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    log = open(stderr_path, "w") if stderr_path is not None else None  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [*command_prefix, sys.executable, "-m", "fedsched.cli.main", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if log is None else log,
        text=True,
        env={**base_env, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    sp = ServeProcess(proc)
    try:
        line = proc.stdout.readline()
        if "listening on" not in line:
            if stderr_path is not None:
                raise AssertionError(line + stderr_path.read_text(errors="replace")[-2000:])
            raise AssertionError(proc.stderr.read() if proc.poll() is not None else line)
        sp.url = line.split("listening on ")[1].split()[0]
        sp.base = sp.url.rsplit("/scheduler", 1)[0]
        yield sp
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if log is not None:
                log.close()
        sp.stderr = err if stderr_path is None else stderr_path.read_text(errors="replace")


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
