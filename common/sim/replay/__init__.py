"""Replay mode (see ``simulator``'s docstring); the public API re-exported."""

from fedsched.common.sim.replay.simulator import *  # noqa: F403
from fedsched.common.sim.replay.simulator import (  # noqa: F401
    COMPLETED,
    FAILED,
    GUARANTEED,
    NODE_BOOTING,
    NODE_FAILED,
    NODE_REMOVED,
    NODE_UP,
    NOT_ARRIVED,
    PENDING,
    QOS_USAGE_RATIO,
    RUNNING,
    NodeStats,
    ReplayConfig,
    ReplayResult,
    ReplaySimulator,
    ReplayWorkload,
    replay_workload,
    run_replay,
)
