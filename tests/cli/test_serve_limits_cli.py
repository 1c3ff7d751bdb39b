"""``fedsched serve``'s connection and body bounds, learned-node bound, admin callers and listening
address (issue 26, items 2, 4, 5 and 8): in ``--help`` with their defaults, and bad values refused
with a message naming them."""

from __future__ import annotations

import re

import pytest

from tests.cli.test_serve_cli import NODES, fedsched


def test_help_names_the_limits_the_admin_callers_and_the_address_with_their_defaults() -> None:
    r = fedsched("serve", "--help")
    assert r.returncode == 0, r.stderr
    text = re.sub(r"\s+", " ", r.stdout)
    for flag, default in [("--max-connections", "128"), ("--idle-timeout", "120.0"),
                          ("--header-timeout", "10.0"), ("--body-timeout", "30.0"),
                          ("--max-body", "2097152"), ("--max-learned-nodes", "5000"),
                          ("--host", "127.0.0.1")]:
        assert re.search(rf"{flag} \S+ .*?\(default: {re.escape(default)}\)", text), flag
    assert "--admin-clients" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--max-connections", "0"], "max connections must be a positive integer"),
    (["--idle-timeout", "0"], "idle timeout must be a positive number"),
    (["--header-timeout", "nan"], "header timeout must be a positive number"),
    (["--body-timeout", "-1"], "body timeout must be a positive number"),
    (["--max-body", "0"], "max body must be a positive number of bytes"),
    (["--max-learned-nodes", "-1"], "max learned nodes must be a non-negative integer"),
])
def test_bad_limits_are_refused_with_a_clear_message(args: list[str], message: str) -> None:
    r = fedsched("serve", "--policy", "learned", "--cluster-csv", NODES, "--insecure", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
