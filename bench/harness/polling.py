"""Waiting for a condition: :func:`wait_for` polls a predicate until it holds or a deadline
passes (:func:`fedsched.experiment.processes.wait_for`, re-exported)."""

from __future__ import annotations

from fedsched.experiment.processes import wait_for

__all__ = ["wait_for"]
