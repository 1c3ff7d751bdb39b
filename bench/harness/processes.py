"""Processes started by a benchmark or a test, each in its own session with its output in a log
file (:class:`Procs`: start, stop, stop all, the group's children included), and the end of a
log (:func:`tail`) for error messages. Imports only the standard library."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


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
