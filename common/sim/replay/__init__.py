"""Replay mode: a discrete-event simulation of a trace with arrivals, departures and churn.

Each module's docstring describes its part of the model; every default is a
:class:`ReplayConfig` field.

``config``: :class:`ReplayConfig`, every knob of replay mode with its ``validate()``,
:class:`NodeStats` (per-node side information, written by the usage model, churn and the
event loop), and the code constants shared by the other modules: pod status
(``NOT_ARRIVED``, ``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``), node status
(``NODE_UP``, ``NODE_FAILED``, ``NODE_REMOVED``, ``NODE_BOOTING``) and the queued event
kinds (``EV_*``); also how the run's randomness is split into independent generators.

``workload``: :class:`ReplayWorkload` and :func:`replay_workload`, which trace pods are
replayed, their arrival times and durations (time compression, jitter, the
``target_load`` solve of ``duration_scale``, the horizon).

``usage``: the usage model, real CPU and memory use of each running pod (a level shared by
the pods of one application, calibrated by QoS class against published production
statistics, :func:`usage_targets`; a daily cycle per class; minute-scale noise; limits and
the best-effort idle-capacity cap; :data:`BEST_EFFORT`, :data:`GUARANTEED`,
``INNOVATION_TABLE_MIN``), OOM kills and overload transitions at each usage tick;
:class:`UsageModel`, an object the simulator owns (``sim.usage``) and calls.

``usage_kernel``: the usage model's start, stop and tick loops and the telemetry window
compiled with numba (the same bits as ``usage``'s numpy forms), which the simulator hands the
usage model; it imports no other module of the sub-package.

``churn``: node failures and repairs and the autoscaler (spare pool, scale-up,
scale-down); :class:`NodeChurn`, an object the simulator owns (``sim.churn``) and calls.

``simulator``: :class:`ReplaySimulator`, the event loop (pending queue with backoff,
start-up latency, departures, per-tick metrics) with its stepping API
(``next_pod`` / ``bind`` / ``finish``), :class:`ReplayResult` and :func:`run_replay` (one
run of a scheduler); its read-only ``expected_use`` / ``expected_node_use`` expose the
hidden usage levels.

``oracle``: a reference point that cheats: it reads those hidden levels (what no real
scheduler knows) to show how much room a learned policy has; never a baseline.

Inside the sub-package ``config`` comes first, ``workload``, ``usage`` and ``churn`` use
it (and not one another), ``simulator`` uses them all, and ``oracle`` only ``simulator``'s
public accessors; no module imports one later in this order. May import:
``fedsched.common.model``, ``fedsched.common.schedulers`` and
``fedsched.common.learning.features`` (for ``Telemetry``).
"""

from fedsched.common.sim.replay.churn import NodeChurn
from fedsched.common.sim.replay.config import (
    COMPLETED,
    EV_ATTEMPT,
    EV_BOOT,
    EV_DEPART,
    EV_FAIL,
    EV_REPAIR,
    EV_START,
    EV_TICK,
    FAILED,
    NODE_BOOTING,
    NODE_FAILED,
    NODE_REMOVED,
    NODE_UP,
    NOT_ARRIVED,
    PENDING,
    RUNNING,
    NodeStats,
    ReplayConfig,
)
from fedsched.common.sim.replay.simulator import ReplayResult, ReplaySimulator, run_replay
from fedsched.common.sim.replay.usage import (
    BEST_EFFORT,
    GUARANTEED,
    INNOVATION_TABLE_MIN,
    UsageModel,
    usage_targets,
)
from fedsched.common.sim.replay.workload import ReplayWorkload, replay_workload

__all__ = [
    "BEST_EFFORT",
    "COMPLETED",
    "EV_ATTEMPT",
    "EV_BOOT",
    "EV_DEPART",
    "EV_FAIL",
    "EV_REPAIR",
    "EV_START",
    "EV_TICK",
    "FAILED",
    "GUARANTEED",
    "INNOVATION_TABLE_MIN",
    "NODE_BOOTING",
    "NODE_FAILED",
    "NODE_REMOVED",
    "NODE_UP",
    "NOT_ARRIVED",
    "PENDING",
    "RUNNING",
    "NodeChurn",
    "NodeStats",
    "ReplayConfig",
    "ReplayResult",
    "ReplaySimulator",
    "ReplayWorkload",
    "UsageModel",
    "replay_workload",
    "run_replay",
    "usage_targets",
]
