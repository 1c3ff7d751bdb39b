"""The Flower run config's one set of defaults: ``[tool.flwr.app.config]`` in the app's ``pyproject.toml``.

``flwr run`` hands the apps that table, fused with ``--run-config`` overrides, as
``context.run_config``; the apps read it as Flower's examples do (``context.run_config["key"]``).
Runtimes that pass no run config (``flwr.simulation.run_simulation``) or only part of one
get the missing keys from the same table: :func:`with_defaults` reads it from the Flower app
directory (:data:`APP_DIR`, the checkout that holds ``pyproject.toml``, where ``scripts/setup.sh``
installs the package in editable mode) with Flower's own parser and merge
(``flwr.common.config``), so there is no second copy of any default and an unknown key fails
as it does under ``flwr run``.
The apps never write ``context.run_config`` (Flower refuses a ClientApp context whose run
config changed): :func:`with_run_config_defaults` gives them a new ``Context`` with the completed
run config and the same node config and state. :func:`run_config_arg` writes overrides in
``flwr run --run-config`` syntax (the main job uses it).

May import: the standard library, Flower's config parser (``flwr.common.config``) and its
``Context`` type; nothing from ``fedsched.agent`` or ``fedsched.coordinator``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from flwr.app import Context
from flwr.common.config import flatten_dict, fuse_dicts, get_project_config

Value = bool | float | int | str  # a run-config value (flwr.app.UserConfigValue)

APP_DIR = Path(__file__).resolve().parents[2]
"""The Flower app directory: the checkout holding ``pyproject.toml`` (``flwr run APP_DIR``)."""


@cache
def _defaults(app_dir: Path) -> dict[str, Value]:
    if not (app_dir / "pyproject.toml").is_file():
        raise FileNotFoundError(
            f"no pyproject.toml in {app_dir}: the run-config defaults live in the Flower app's "
            "[tool.flwr.app.config] (install fedsched in editable mode, or pass a complete run config)")
    table = get_project_config(app_dir)["tool"]["flwr"]["app"].get("config", {})
    return flatten_dict(table)


def app_defaults(app_dir: Path = APP_DIR) -> dict[str, Value]:
    """A copy of ``[tool.flwr.app.config]``, flattened as Flower flattens it."""
    return dict(_defaults(app_dir))


def with_defaults(run_config: Mapping[str, Value], app_dir: Path = APP_DIR) -> dict[str, Value]:
    """``run_config`` with pyproject's defaults for every key it lacks (a new dict).

    Raises ValueError for a key the table does not define (a typo), as ``flwr run`` does.
    Without the app directory (fedsched installed from a wheel, as in a container image) the
    run config is returned as the runtime passed it: ``flwr run`` always passes the whole table
    of the app it runs."""
    if not (app_dir / "pyproject.toml").is_file():
        return dict(run_config)
    try:
        return fuse_dicts(dict(_defaults(app_dir)), dict(run_config))
    except ValueError as e:
        where = app_dir / "pyproject.toml"
        raise ValueError(f"run config: {e} ([tool.flwr.app.config] of {where})") from None


def with_run_config_defaults(context: Context) -> Context:
    """A new ``Context`` like ``context`` with :func:`with_defaults` applied to its run config;
    its node config and state are the same objects (what an app writes to ``state`` persists),
    and ``context`` itself is left as the runtime made it."""
    return Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                   state=context.state, run_config=with_defaults(context.run_config),
                   series_id=context.series_id)


def _toml(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # Flower splits the argument on spaces outside quotes; a literal string needs no escapes.
        return f"'{value}'" if "'" not in value else json.dumps(value)
    return repr(value)


def run_config_arg(overrides: Mapping[str, Value], app_dir: Path = APP_DIR) -> str:
    """``overrides`` as one ``flwr run --run-config`` argument (``key=value`` pairs, TOML values);
    every key must be one of pyproject's (checked here rather than by a failed run)."""
    with_defaults(overrides, app_dir)
    for key, value in overrides.items():
        if isinstance(value, str) and "'" in value and '"' in value:
            raise ValueError(f"run config {key}: a value cannot hold both quote characters")
    return " ".join(f"{key}={_toml(value)}" for key, value in overrides.items())
