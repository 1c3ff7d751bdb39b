"""What the benchmarks share: timing statistics (``stats``), CPU pinning, CPU accounting and
process memory (``cpu``), the git commit, the machine and JSON output (``provenance``), and a
``fedsched serve`` process with a client for it (``serve``).

The benchmarks run as ``python bench/NAME.py``, which puts ``bench/`` (not the repository) on
``sys.path``: importing this package appends the repository root, so that ``serve`` and the
extender benchmark can use the test suite's helpers (``tests/extender_support.py``,
``tests/extender_fuzz_strategies.py``) rather than twins of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
