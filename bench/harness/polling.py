"""Waiting for a condition: :func:`wait_for` polls a predicate until it holds or a deadline
passes. Imports only the standard library."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


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
