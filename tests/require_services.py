"""A pytest plugin: under CI a skipped test fails, so a missing real component cannot pass.

A test that needs a real component (nginx, stunnel, Prometheus, the Flower CLIs, ...) skips
with the reason when it is missing on a developer's machine. Under CI (``CI=true``, as
``.ci/run`` runs) or with ``FEDSCHED_REQUIRE_SERVICES=1`` the same skip is reported as a
failure that names the reason: a green CI run has run every real part. Loaded from
``tests/conftest.py``; ``pytest -rs`` (the project's default options) prints skip reasons
everywhere else.
"""

from __future__ import annotations

import os

import pytest


def required() -> bool:
    """True when skips must fail (CI, or FEDSCHED_REQUIRE_SERVICES=1)."""
    return (os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
            or os.environ.get("FEDSCHED_REQUIRE_SERVICES", "").strip() == "1")


def _reason(longrepr: object) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = _reason(report.longrepr).removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = (f"skipped where every real component is required (CI=true or "
                       f"FEDSCHED_REQUIRE_SERVICES=1): {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if required() and report.skipped and not hasattr(report, "wasxfail"):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    report = outcome.get_result()
    if required() and report.skipped:  # a module-level importorskip or skip
        _fail(report)
