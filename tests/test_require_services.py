"""Under CI a skip is a failure with its reason; elsewhere it stays a skip."""

from __future__ import annotations

import pytest

TESTS = '''
import pytest

nginx = pytest.mark.skipif(True, reason="nginx not found on PATH")

@nginx
def test_needs_nginx():
    pass

def test_skips_inside():
    pytest.skip("prometheus not installed")

def test_plain():
    assert True
'''


@pytest.mark.parametrize(("env", "value"), [("CI", "true"), ("FEDSCHED_REQUIRE_SERVICES", "1")])
def test_skips_fail_when_services_are_required(pytester: pytest.Pytester, monkeypatch, env, value) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("FEDSCHED_REQUIRE_SERVICES", raising=False)
    monkeypatch.setenv(env, value)
    pytester.makepyfile(test_x=TESTS)
    result = pytester.runpytest_inprocess("-p", "tests.require_services")
    result.assert_outcomes(passed=1, failed=1, errors=1)  # a skip in setup fails as an error
    result.stdout.fnmatch_lines(["*nginx not found on PATH*", "*prometheus not installed*"])


def test_module_level_importorskip_fails_too(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_y="import pytest\npytest.importorskip('no_such_module_xyz')\n"
                               "def test_a():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "tests.require_services")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*no_such_module_xyz*"])


def test_skips_stay_skips_on_a_developer_machine(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("FEDSCHED_REQUIRE_SERVICES", raising=False)
    pytester.makepyfile(test_x=TESTS)
    result = pytester.runpytest_inprocess("-p", "tests.require_services", "-rs")
    result.assert_outcomes(passed=1, skipped=2)
