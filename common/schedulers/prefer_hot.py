"""A reference point, not a heuristic anyone runs: prefer the node with the most real CPU use.

It piles pods onto nodes that are already busy. Its only use is to try metrics out: a metric
on which this scheduler beats kube-default rewards the wrong thing. The old
``overload_events`` counter (threshold crossings) is such a metric: nodes kept hot cross the
threshold less often than nodes kept near it, so this scheduler scored 0.42-0.50x
kube-default's count while its hot node-time, throttling and OOM kills were several times
worse (see :mod:`fedsched.common.model.load_metrics` for the metrics that replaced it).

Score: the node's real CPU use / capacity x 100 (``state.cpu_used``: replay's usage model or
telemetry; requests in packing mode and serving without telemetry, ``ClusterState``'s one
definition of real use).

Arguments: none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs


@dataclass(frozen=True)
class PreferHotArgs(SchedulerArgs):
    """No arguments."""


class PreferHot(Scheduler):
    name = "prefer-hot"
    Args = PreferHotArgs

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return 100.0 * state.cpu_used[nodes] / state.nodes.cpu[nodes]
