"""Where a benchmark runs and what it costs: pinning to a core, the BLAS/OpenMP thread variables,
CPU time by process over a phase (``/proc``), and a process's resident memory."""

from __future__ import annotations

import os
import time
from pathlib import Path

# The variables that size the BLAS/OpenMP thread pools of numpy, torch and onnxruntime.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
ONE_THREAD_ENV = dict.fromkeys(THREAD_VARS, "1")


def pin_to_core(core: int | None = None) -> int | None:
    """Pin this process to ``core`` (default: the first it may run on); the core, or None where
    the OS has no CPU affinity."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    if core is None:
        core = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {core})
    return core


def pin_client_beside_server(server_core: int, client_core: int) -> str | None:
    """Check that ``taskset`` can pin a server to ``server_core`` and that the two cores are
    distinct and usable, then pin this client process to ``client_core`` with one BLAS thread.
    Returns why not (the caller exits with it), or None."""
    import shutil

    from threadpoolctl import threadpool_limits

    if shutil.which("taskset") is None:
        return "taskset (util-linux) is required to pin the server"
    cores = sorted(os.sched_getaffinity(0))
    if server_core not in cores or client_core not in cores or server_core == client_core:
        return f"need two distinct usable cores (have {cores})"
    pin_to_core(client_core)
    threadpool_limits(1)
    return None


def rss_mb(pid: int) -> float:
    """A process's resident memory (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for process {pid}")


class CpuMeter:
    """Who used the machine during a phase: a server, this client, and everyone else (other
    tenants of a shared machine: their share is what to judge the tails by)."""

    def __init__(self) -> None:
        self.tick = float(os.sysconf("SC_CLK_TCK"))
        self.pid = os.getpid()
        self.server_pid = -1
        self._start: tuple[float, float, float, float] | None = None

    def _busy(self) -> float:
        vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return (sum(vals) - vals[3] - vals[4]) / self.tick  # all but idle and iowait

    def _proc(self, pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def start(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self._start = (time.monotonic(), self._busy(), self._proc(server_pid), self._proc(self.pid))

    def take(self) -> dict[str, float]:
        """Cores used on average since start (and start again)."""
        assert self._start is not None
        t0, b0, s0, c0 = self._start
        t, b, sv, c = time.monotonic(), self._busy(), self._proc(self.server_pid), self._proc(self.pid)
        wall = max(t - t0, 1e-9)
        self._start = (t, b, sv, c)
        return {
            "wall_s": round(wall, 1),
            "server_cores": round((sv - s0) / wall, 3),
            "client_cores": round((c - c0) / wall, 3),
            "other_cores": round(max(b - b0 - (sv - s0) - (c - c0), 0.0) / wall, 3),
        }
