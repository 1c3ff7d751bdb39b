"""Processes of a local experiment (the kwok fleet, and the benchmarks' and tests' harness, which
re-exports this module as ``bench.harness.processes`` / ``ports`` / ``polling``): each process in
its own session with its output in a log file (:class:`Procs`: start, stop, stop all, the group's
children included), the end of a log (:func:`tail`) for error messages, a free TCP port on
loopback (:func:`free_port`) and polling a condition until a deadline (:func:`wait_for`).

Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

__all__ = ["HOST", "Procs", "free_port", "tail", "wait_for"]

HOST = "127.0.0.1"
T = TypeVar("T")


def free_port() -> int:
    """A TCP port nothing listens on now (on loopback)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], T], timeout: float, interval: float = 0.25,
             what: str = "condition") -> T:
    """Poll ``predicate()`` until it returns something truthy; return that or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached in {timeout}s (last: {last!r})")


def tail(path: Path, n: int = 4000) -> str:
    """The last ``n`` characters of a log file (a note saying so when it does not exist)."""
    return path.read_text(errors="replace")[-n:] if path.exists() else f"(no {path})"


@dataclass
class Procs:
    """Processes started by the test, each in its own session so teardown ends its children too."""

    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.logs / f"{name}.log"
        with log.open("ab") as f:
            p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd or self.logs,
                                 start_new_session=True)
        self.procs.append(p)
        return p, log

    def stop(self, p: subprocess.Popen, timeout: float = 10) -> None:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # leftovers of the group (ClientApp/ServerApp children)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            self.stop(p)
