"""The Flower run config's values (``[tool.flwr.app.config]`` in ``pyproject.toml``).
"""

from __future__ import annotations

import os


def config_value(run_config, key: str, default):
    """A run-config value, else the environment's ``FEDSCHED_<KEY>`` (dashes as underscores),
    else ``default``; converted to ``default``'s type. The environment fallback serves
    ``flwr.simulation.run_simulation`` (which passes no run config) and deployments."""

    value = run_config.get(key) if run_config is not None else None
    if value is None:
        value = os.environ.get("FEDSCHED_" + key.upper().replace("-", "_"))
    return default if value is None else type(default)(value)
