"""The agent chart's extender flags for issue 26 (items 2, 5 and 8): it listens on every interface
by an explicit ``--host`` (the agent's default is loopback), bounds its connections with the
chart's ``extender.connections`` values and its learned nodes with ``extender.maxLearnedNodes``,
and allows the admin verbs to the client-certificate names in ``extender.adminClients`` only;
``extender.search`` turns on the decision-time search and ``extender.packingCheck`` the packing
check; every rendered flag is read by ``fedsched
serve``'s own parser."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench.harness.charts import AGENT, CHARTS, documents, fullname, load_values, one
from fedsched.cli import serve
from tests.charts.chart_support import argv, container, merge, render

DEFAULTS = "defaults-values.yaml"


def extender_options(values: dict[str, Any]) -> dict[str, Any]:
    """``fedsched serve``'s resolved options from the rendered extender container's arguments."""
    dep = one(documents(render(AGENT, values)), "Deployment", fullname(AGENT))
    args = argv(container(dep, "extender"))
    assert args[:2] == ["fedsched", "serve"]
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    return serve.resolve_options(parser.parse_args(["serve", *args[2:]]))


def test_the_extender_listens_on_every_interface_with_the_default_bounds_and_no_admin() -> None:
    opts = extender_options(load_values(AGENT, DEFAULTS))
    assert opts["host"] == "0.0.0.0"
    defaults = {k: v[1] for k, v in serve.OPTIONS.items()}
    assert serve.connection_limits(opts) == serve.connection_limits(defaults)
    assert opts["max-learned-nodes"] == defaults["max-learned-nodes"] == 5000
    assert not opts["admin-clients"]


def test_connection_bounds_and_admin_clients_from_the_values() -> None:
    values = merge(load_values(AGENT, DEFAULTS), {"extender": {
        "connections": {"max": 64, "idleTimeoutSeconds": 75, "headerTimeoutSeconds": 5,
                        "bodyTimeoutSeconds": 12.5, "maxBodyBytes": 8 * 1024 * 1024},
        "adminClients": ["fedsched-admin", "ops.example.com"], "maxLearnedNodes": 0,
    }})
    opts = extender_options(values)
    assert opts["max-learned-nodes"] == 0  # 0 is a value (learn none), not "the default"
    limits = serve.connection_limits(opts)
    got = (limits.max_connections, limits.idle_timeout_s, limits.header_timeout_s, limits.body_timeout_s,
           limits.max_body_bytes)
    assert got == (64, 75.0, 5.0, 12.5, 8 * 1024 * 1024)
    assert opts["admin-clients"] == "fedsched-admin,ops.example.com"


@pytest.mark.parametrize("bad", [
    {"connections": {"max": 0}},
    {"connections": {"headerTimeoutSeconds": 0}},
    {"connections": {"maxConnections": 5}},
    {"connections": {"maxBodyBytes": 0}},
    {"maxLearnedNodes": -1},
    {"adminClients": ["has,comma"]},
    {"adminClients": "fedsched-admin"},
    {"search": "candidates=4;horizon=10"},
    {"search": "candidates=4 --gate=off"},
    {"search": 4},
    {"packingCheck": "lookahead:fgd"},
    {"packingCheck": "kube-default --gate=off"},
    {"packingAlternatives": "fgd --gate=off"},
    {"packingAlternatives": "kube-default"},  # the baseline the check compares with, not an alternative
    {"packingAlternatives": "fgd,"},
    {"packingAlternatives": ""},
])
def test_the_schema_refuses_bad_bounds_and_admin_names(bad: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="extender"):
        render(AGENT, merge(load_values(AGENT, DEFAULTS), {"extender": bad}))


def test_the_search_is_off_by_default_and_reaches_the_agent_as_given() -> None:
    from fedsched.common.schedulers.lookahead import LookaheadArgs

    assert extender_options(load_values(AGENT, DEFAULTS))["search"] is None
    opts = extender_options(merge(load_values(AGENT, DEFAULTS), {"extender": {
        "search": "candidates=8,horizon=20", "budgetMs": 100}}))
    assert serve.search_args(opts["search"]) == LookaheadArgs(candidates=8, horizon=20)
    assert opts["budget-ms"] == 100
    opts = extender_options(merge(load_values(AGENT, DEFAULTS), {"extender": {"search": "default"}}))
    assert serve.search_args(opts["search"]) == LookaheadArgs()


@pytest.mark.parametrize(("values", "against"), [
    ({}, None),  # auto, in shadow mode (the chart's start)
    ({"mode": "active"}, None),  # auto, and the default gate objective is online health (trouble)
    ({"mode": "active", "gate": {"objective": "gpu-alloc"}}, "kube-default"),  # a packing cluster
    ({"mode": "active", "gate": {"objective": "gpu-frag"}}, "kube-default"),
    ({"mode": "active", "gate": {"objective": "gpu-alloc", "profile": "off"}}, None),  # no gate
    ({"gate": {"objective": "gpu-alloc"}}, None),  # shadow mode
    ({"mode": "active", "gate": {"objective": "gpu-alloc"}, "extender": {"packingCheck": "off"}}, None),
    ({"mode": "active", "extender": {"packingCheck": "fgd"}}, "fgd"),
])
def test_the_packing_check_is_on_by_default_for_a_packing_objective(values, against) -> None:
    """The rendered arguments, resolved by ``fedsched serve``'s own code, name the baseline the
    served model is checked against, and FGD is its alternative (dropped where it is that baseline)."""
    opts = extender_options(merge(load_values(AGENT, DEFAULTS), values))
    assert opts["packing-check"] == (values.get("extender", {}).get("packingCheck") or "auto")
    cfg = serve.decider_config(opts)
    assert cfg.packing_check_against == against
    assert cfg.packing_alternatives == (() if against == "fgd" else ("fgd",))


@pytest.mark.parametrize(("given", "alternatives"), [
    ("off", ()), ("fgd,most-allocated", ("fgd", "most-allocated"))])
def test_the_packing_alternatives_reach_the_agent_as_given(given, alternatives) -> None:
    opts = extender_options(merge(load_values(AGENT, DEFAULTS), {
        "mode": "active", "gate": {"objective": "gpu-alloc"}, "extender": {"packingAlternatives": given}}))
    assert serve.decider_config(opts).packing_alternatives == alternatives


def test_the_packing_checks_schema_lists_auto_off_and_exactly_the_baselines() -> None:
    import json

    from fedsched.common.schedulers import BASELINES

    schema = json.loads((CHARTS / AGENT / "values.schema.json").read_text())
    enum = schema["properties"]["extender"]["properties"]["packingCheck"]["enum"]
    assert set(enum) == {"auto", "off", *BASELINES}
    pattern = schema["properties"]["extender"]["properties"]["packingAlternatives"]["pattern"]
    inner = pattern.split("(", 2)[2].split(")", 1)[0]  # ^(off|(a|b|...)(,(a|b|...))*)$
    assert set(inner.split("|")) == set(BASELINES) - {"kube-default"}
