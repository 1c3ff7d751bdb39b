"""The measured load of candidate nodes, as the load-aware baselines read it.

Trimaran's LoadVariationRiskBalancing scores the windowed mean and standard deviation of each
node's utilisation; Koordinator's LoadAware the latest usage and how old it is. Both come from
``state.telemetry`` (a :class:`fedsched.common.learning.features.Telemetry`, read here by its
field names only: schedulers never import the learning package) when the source has them:
``cpu_mean`` / ``cpu_std`` / ``mem_mean`` / ``mem_std`` / ``cpu_peak`` / ``mem_peak``
(fractions of capacity; the peak is the window's largest sample) and ``metrics_age_s`` (seconds).

Fallbacks, per field and per node: a field that is None (packing mode, the replay simulator,
serving without telemetry) or a NaN entry (a node Prometheus has no value for) gives the mean
``state.cpu_used / capacity`` (``mem_used`` for memory), the deviation 0, the peak the mean's
value and the age 0 (fresh).
An age of ``inf`` stays: the source has never had a sample of the node (both upstream plugins
give a node without metrics their minimum score). A node without capacity of a resource has
mean 0 for it.

``state.cpu_used`` / ``mem_used`` follow the one definition of real use in
:class:`fedsched.common.model.cluster.ClusterState`: the node's requests where nothing measures it
(packing mode, serving without telemetry), measured use otherwise; ``NodeLoad.measured`` says
which, per candidate, for a scorer that wants to treat the two apart (none does today: the
fallback of an unmeasured node is then its requested share, in every mode alike).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState


@dataclass(frozen=True)
class NodeLoad:
    """Per candidate node (in the order of ``nodes``): utilisation as fractions of capacity."""

    cpu_mean: np.ndarray
    cpu_std: np.ndarray
    mem_mean: np.ndarray
    mem_std: np.ndarray
    cpu_peak: np.ndarray
    mem_peak: np.ndarray
    age_s: np.ndarray  # seconds since the node's newest sample at the last refresh (0: fresh, inf: none)
    measured: np.ndarray  # bool: CPU and memory use measured (False: requests stand in)


def _fraction(used: np.ndarray, cap: np.ndarray) -> np.ndarray:
    out = np.zeros(len(used))
    np.divide(used, cap, out=out, where=cap > 0)
    return out


def _field(state: ClusterState, name: str, nodes: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    arr = getattr(state.telemetry, name, None)
    if arr is None:
        return fallback
    v = np.asarray(arr, dtype=np.float64)[nodes]
    return np.where(np.isnan(v), fallback, v)


def _peak(state: ClusterState, which: int, nodes: np.ndarray, mean: np.ndarray) -> np.ndarray:
    peaks = getattr(state.telemetry, "peaks", None)
    arr = peaks()[which] if peaks is not None else None
    if arr is None:
        return mean
    v = np.asarray(arr, dtype=np.float64)[nodes]
    # never below the mean (a peak older than the mean's window, or a NaN peak beside a mean)
    return np.maximum(np.where(np.isnan(v), mean, v), mean)


def node_age(state: ClusterState, nodes: np.ndarray) -> np.ndarray:
    """``node_load(state, nodes).age_s`` alone (Koordinator reads nothing else)."""
    return _field(state, "metrics_age_s", nodes, np.zeros(len(nodes)))


def node_load(state: ClusterState, nodes: np.ndarray, with_peaks: bool = False) -> NodeLoad:
    """The measured load of ``nodes`` with the fallbacks of the module docstring; the peaks
    only ``with_peaks`` (else the means: the baselines do not read them, and a source may
    compute them on demand, ``Telemetry.peaks``)."""
    nt = state.nodes
    cpu_now = _fraction(state.cpu_used[nodes], nt.cpu[nodes].astype(np.float64))
    mem_now = _fraction(state.mem_used[nodes], nt.mem[nodes].astype(np.float64))
    zero = np.zeros(len(nodes))
    cpu_mean = _field(state, "cpu_mean", nodes, cpu_now)
    mem_mean = _field(state, "mem_mean", nodes, mem_now)
    return NodeLoad(
        cpu_mean=cpu_mean,
        cpu_std=_field(state, "cpu_std", nodes, zero),
        mem_mean=mem_mean,
        mem_std=_field(state, "mem_std", nodes, zero),
        cpu_peak=_peak(state, 0, nodes, cpu_mean) if with_peaks else cpu_mean,
        mem_peak=_peak(state, 1, nodes, mem_mean) if with_peaks else mem_mean,
        age_s=node_age(state, nodes),
        measured=state.cpu_measured[nodes] & state.mem_measured[nodes],
    )
