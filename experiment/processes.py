"""Processes of a local experiment (the kwok fleet, and the benchmarks' and tests' harness, which
re-exports this module as ``bench.harness.processes`` / ``ports`` / ``polling``): each process in
its own session with its output in a log file (:class:`Procs`: start, stop, stop all, the group's
children included), the end of a log (:func:`tail`) for error messages, a free TCP port on
loopback (:func:`free_port`) and polling a condition until a deadline (:func:`wait_for`).

Imports only the standard library and :mod:`fedsched.common.compute` (the parent-death signal).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from fedsched.common.compute import kill_with_parent_thread

__all__ = ["HOST", "Procs", "ephemeral_range", "free_port", "stopped_by_signals", "tail", "wait_for"]

HOST = "127.0.0.1"
T = TypeVar("T")


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FREE_PORT_FLOOR = 10000  # below: ports well-known services may listen on
_handed_out: set[int] = set()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux's default where it cannot be read)."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _candidates() -> list[int]:
    """Ports a test's server may take: from FREE_PORT_FLOOR up, outside the ephemeral range."""
    lo, hi = ephemeral_range()
    return [p for p in range(FREE_PORT_FLOOR, 65536) if (p < lo or p > hi) and p not in _handed_out]


def free_port(rng: random.Random | None = None) -> int:
    """A TCP port nothing listens on now (on loopback), never one handed out before in this process.

    It is drawn outside the kernel's ephemeral range: a port from that range (what binding to port 0
    gives) may be taken as the local port of any outgoing connection between this call and the bind
    of the server it is for, which failed a CI run with "Address already in use"."""
    rng = rng or random.SystemRandom()
    pool = _candidates()
    tries = rng.sample(pool, min(len(pool), 200))
    for port in tries:
        if _binds(port):
            _handed_out.add(port)
            return port
    for _ in range(100):  # nothing free outside the range: the kernel's choice
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError("no free TCP port on loopback")


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
    """Processes started by the test or the fleet, each in its own session so teardown ends its
    children too, and each dying with the thread that started it
    (:func:`~fedsched.common.compute.kill_with_parent_thread`)."""

    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.logs / f"{name}.log"
        with log.open("ab") as f:
            p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd or self.logs,
                                 start_new_session=True, preexec_fn=kill_with_parent_thread)
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


@contextlib.contextmanager
def stopped_by_signals(on_stop: Callable[[], None] | None = None) -> Iterator[None]:
    """Ctrl-C or SIGTERM (a job runner's stop) inside raises KeyboardInterrupt once, so that the
    block's ``with`` and ``finally`` clauses stop what it started (``on_stop`` runs first, e.g. to
    say so). From then on both are ignored until the process exits: one landing in that stop
    would cut it short (seen on the main job: killed in the middle of stopping its runtime, an
    exit that hung); SIGKILL still ends it at once. Without a signal, the handlers are put back as
    they were. For a command's main thread."""
    signals = (signal.SIGINT, signal.SIGTERM)

    def interrupt(signum: int, frame: object) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        if on_stop is not None:
            on_stop()
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is interrupt:  # no signal came
            for sig, handler in previous.items():
                signal.signal(sig, handler)
