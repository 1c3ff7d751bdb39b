"""Processes started by a benchmark or a test, each in its own session with its output in a log
file (:class:`Procs`), and the end of a log (:func:`tail`): :mod:`fedsched.experiment.processes`
(moved there so the kwok fleet, package code, starts its processes the same way), re-exported."""

from __future__ import annotations

from fedsched.experiment.processes import Procs, tail

__all__ = ["Procs", "tail"]
