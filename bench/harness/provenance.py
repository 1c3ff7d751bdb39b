"""What a result was measured on, for its JSON: the commit and the tree's state, the machine
(CPU model, cores, Python, load average, thread variables), and writing the JSON itself."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import ROOT
from .cpu import THREAD_VARS


def git_commit() -> dict[str, Any]:
    """HEAD, whether tracked files differ from it, and which (``git status --porcelain``)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": sha, "dirty": bool(dirty), "dirty_files": dirty.splitlines()}


def machine() -> dict[str, Any]:
    """Cores, CPU model, Python, platform, the load average now and this process's thread
    variables (None: not set)."""
    cpu = next((x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith("model name")), platform.processor())
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_start": list(os.getloadavg()),
            "thread_env": {k: os.environ.get(k) for k in THREAD_VARS}}


def strict_json(x: Any) -> Any:
    """``x`` with NaN and infinities as None (strict JSON) and numpy scalars as Python numbers."""
    if hasattr(x, "item") and not isinstance(x, list | dict | tuple):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict_json(v) for v in x]
    return x


def write_json(path: str | Path, data: Any, default: Callable[[Any], Any] | None = None) -> None:
    """``data`` as indented JSON in ``path`` (its folder made); ``default`` as in ``json.dumps``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, default=default) + "\n")
