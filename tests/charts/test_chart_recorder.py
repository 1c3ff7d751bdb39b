"""The agent chart's recorder (issue 27): ``fedsched record`` runs beside the extender on the PVC,
its rendered flags are read by the command's own parser, and its files are the member's validation
twin: the SuperNode's node config points at them unless ``federation.data`` names others."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

import pytest

from bench.harness.charts import AGENT, documents, fullname, load_values, one
from fedsched.cli import record
from tests.charts.chart_support import argv, container, containers, flag, merge, mounts, render

DEFAULTS = "defaults-values.yaml"
TWIN = {"nodes-csv": "/var/lib/fedsched/twin/nodes.csv", "pods-csv": "/var/lib/fedsched/twin/pods.csv"}


def deployment(values: dict[str, Any]) -> dict[str, Any]:
    return one(documents(render(AGENT, values)), "Deployment", fullname(AGENT))


def node_config(dep: dict[str, Any]) -> dict[str, str]:
    text = flag(argv(container(dep, "supernode")), "--node-config")
    assert text is not None
    return dict(part.split("=", 1) for part in shlex.split(text))


def record_args(dep: dict[str, Any]) -> argparse.Namespace:
    args = argv(container(dep, "recorder"))
    assert args[:2] == ["fedsched", "record"]
    parser = argparse.ArgumentParser()
    record.register(parser.add_subparsers())
    return parser.parse_args(["record", *args[2:]])


def test_the_recorder_writes_the_twin_on_the_pvc_and_the_member_validates_on_it() -> None:
    values = merge(load_values(AGENT, DEFAULTS), {"extender": {"prometheusUrl": "http://prom.monitoring:9090"}})
    dep = deployment(values)
    opts = record_args(dep)
    assert str(opts.out) == "/var/lib/fedsched/twin"
    assert (opts.max_pods, opts.flush_interval, opts.telemetry_interval) == (20000, 30.0, 30.0)
    assert opts.prometheus == "http://prom.monitoring:9090"
    rec, ext = container(dep, "recorder"), container(dep, "extender")
    assert mounts(dep, rec)["/var/lib/fedsched"] == mounts(dep, ext)["/var/lib/fedsched"]  # the one PVC
    assert {k: node_config(dep)[k] for k in TWIN} == TWIN


def test_the_values_set_the_recorder_and_named_data_wins() -> None:
    values = merge(load_values(AGENT, DEFAULTS), {
        "recorder": {"maxPods": 500, "flushIntervalSeconds": 5, "telemetryIntervalSeconds": 12.5},
        "federation": {"data": {"nodesCsv": "/var/lib/fedsched/data/n.csv",
                                "podsCsv": "/var/lib/fedsched/data/p.csv"}}})
    dep = deployment(values)
    opts = record_args(dep)
    got = (opts.max_pods, opts.flush_interval, opts.telemetry_interval, opts.prometheus)
    assert got == (500, 5.0, 12.5, None)
    cfg = node_config(dep)
    assert (cfg["nodes-csv"], cfg["pods-csv"]) == ("/var/lib/fedsched/data/n.csv",
                                                   "/var/lib/fedsched/data/p.csv")


def test_without_the_recorder_nothing_records_and_the_member_has_no_twin() -> None:
    dep = deployment(merge(load_values(AGENT, DEFAULTS), {"recorder": {"enabled": False}}))
    assert "recorder" not in {c["name"] for c in containers(dep)}
    assert "nodes-csv" not in node_config(dep)


@pytest.mark.parametrize("bad", [{"maxPods": 0}, {"flushIntervalSeconds": 0}, {"maxpods": 5},
                                 {"enabled": "yes"}])
def test_the_schema_refuses_bad_recorder_values(bad: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="recorder"):
        render(AGENT, merge(load_values(AGENT, DEFAULTS), {"recorder": bad}))
