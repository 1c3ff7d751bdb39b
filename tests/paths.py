"""Where the repository and the tests' data are, for tests in any sub-folder, and how a test
imports a benchmark script (``bench_module``)."""

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TEST_DATA = TESTS / "data"


@contextlib.contextmanager
def bench_module(name: str) -> Iterator[ModuleType]:
    """``bench/NAME.py`` imported as the script runs, its folder first on ``sys.path`` (the
    scripts import ``harness`` and each other from there) while the context lasts."""
    folder = str(REPO / "bench")
    sys.path.insert(0, folder)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(folder)
