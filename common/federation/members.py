"""The member clusters of the federation.

- :data:`MEMBERS` / :func:`member_cluster`: which cluster a simulated member runs, by partition
  id. Five non-IID profiles: a GPU training cluster, a CPU web cluster with a daily cycle, a
  small edge cluster, a GPU inventory whose work is mostly CPU-heavy pods (where keeping CPU pods
  off GPU nodes matters), and a second web cluster that joins the federation late, of 40-100
  nodes (run config ``member-size = "full"``; ``"small"``: 6-10-node smoke variants). Two of them
  are *data-scarce*: they schedule few pods per round (``scarce`` decisions budget in the run
  config). Partition ids past the table cycle through it with other generator seeds, so any
  number of members can be simulated. Every member's pods are split by the project's stable
  hash into train (its local experience), validation (its per-round quality) and test (the
  held-out workload the main job judges on).
- :func:`member_from_node_config`: a deployed member's own cluster from its node config (its
  node inventory and recent pods as openb-schema CSVs).

May import: ``fedsched.common.model`` and ``fedsched.common.sim.replay`` (the recorded load).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.model.traces import (
    builtin_trace,
    fits_somewhere,
    load_nodes,
    load_pods,
    split_train_val_test,
)
from fedsched.common.sim.replay.config import ReplayConfig
from fedsched.common.sim.replay.workload import replay_workload

TEST_FRACTION, VAL_FRACTION = 0.3, 0.15  # a member's own pods: more validation pods than usual
TEST_SPLIT, VAL_SPLIT = 0.3, 0.1  # the openb trace's split, as every trainer and benchmark uses it


MEMBER_SIZES = ("full", "small")  # the run config's member-size


@dataclass(frozen=True)
class MemberSpec:
    """One row of the member table: a synthetic profile with its generator parameters at its
    realistic size (``params``) and the overrides of its small smoke variant (``small``)."""

    name: str
    profile: str  # a synthetic profile of fedsched.common.model.synthetic
    params: dict[str, Any]  # generate_cluster overrides: the member at its realistic size
    small: dict[str, Any]  # what member-size "small" changes in params (6-10 nodes: a smoke test)
    scarce: bool = False  # schedules the run config's scarce-decisions per round instead of local-decisions
    late: bool = False  # joins at the run config's late-round
    why: str = ""

    def generator(self, size: str = "full") -> dict[str, Any]:
        """The generate_cluster overrides of the member at ``size`` (one of :data:`MEMBER_SIZES`)."""
        if size not in MEMBER_SIZES:
            raise ValueError(f"member size must be one of {', '.join(MEMBER_SIZES)}, got {size!r}")
        return {**self.params, **(self.small if size == "small" else {})}


# Sizes: what a platform team runs (40-100 nodes, half a day to a day of pods at the member's
# load), with as many pods per node-hour as the online benchmark's scenarios of the same profile
# (gpu 5, web 26, edge 31). The density, not the node count, is what narrows a member's paired
# intervals: the replay lengthens the pods' lives to reach the load, so fewer pods means fewer,
# longer-lived ones and rarer, lumpier trouble (web at 160 nodes, LoadVariationRiskBalancing
# against kube-default over 8 seeds: 24,000 pods a day +-1.08, 60,000 +-0.36, 120,000 +-0.26).
MEMBERS: tuple[MemberSpec, ...] = (
    MemberSpec("gpu-train", "gpu", {"n_nodes": 100, "n_pods": 12000, "trace_hours": 24.0,
                                    "cpu_pod_fraction": 0.3, "share_fraction": 0.3,
                                    "cores_per_gpu_median": 6.0},
               {"n_nodes": 10, "n_pods": 1100},
               why="GPU training and inference, 30% CPU-side pods"),
    MemberSpec("web", "web", {"n_nodes": 100, "n_pods": 62000, "trace_hours": 24.0, "cpu_median_milli": 900.0,
                              "cpu_max_milli": 8000, "diurnal_amplitude": 0.35},
               {"n_nodes": 8, "n_pods": 4000},
               why="CPU-only web services with a daily cycle"),
    MemberSpec("edge", "edge", {"n_nodes": 40, "n_pods": 15000, "trace_hours": 12.0, "gpu_node_fraction": 0.0,
                                "cpu_median_milli": 600.0, "cpu_max_milli": 3000, "mem_median_mib": 512.0},
               {"n_nodes": 6, "n_pods": 1600, "trace_hours": 8.0},
               scarce=True, why="small edge nodes, bursty best-effort pods; few pods per round"),
    MemberSpec("gpu-cpuheavy", "gpu", {"n_nodes": 60, "n_pods": 7200, "trace_hours": 24.0,
                                       "cpu_pod_fraction": 0.6, "share_fraction": 0.2,
                                       "cpu_pod_cpu_median_milli": 10000.0, "cores_per_gpu_median": 10.0},
               {"n_nodes": 8, "n_pods": 900},
               scarce=True, why="a GPU inventory running mostly CPU-heavy pods; few pods per round"),
    MemberSpec("web-late", "web", {"n_nodes": 60, "n_pods": 37000, "trace_hours": 24.0,
                                   "cpu_median_milli": 1200.0, "cpu_max_milli": 8000,
                                   "diurnal_amplitude": 0.25},
               {"n_nodes": 6, "n_pods": 3000},
               late=True, why="a web cluster that joins the federation late"),
)


@dataclass
class Member:
    """A member cluster: its nodes, its training pods and its held-out pods."""

    name: str
    nodes: NodeTable
    train: PodTable  # the member's own experience (training)
    test: PodTable  # its held-out pods (final evaluation only)
    val: PodTable | None = None  # its validation pods (per-round quality, model selection)
    spec: MemberSpec | None = None
    replay: dict[str, Any] = field(default_factory=lambda: {"target_load": 0.85})


def member_spec(partition_id: int) -> MemberSpec:
    """The table row of a partition (cycling past the table's end)."""
    return MEMBERS[partition_id % len(MEMBERS)]


def member_cluster(partition_id: int, seed: int | None = None, size: str = "full") -> Member:
    """The simulated member cluster of a partition (see the module docstring) at ``size``
    (``full``: its realistic size; ``small``: the smoke variant); ``seed`` (default ``1000 +
    partition_id``) draws another cluster of the same profile (the hub's held-out clusters)."""
    if partition_id < 0:
        raise ValueError(f"partition id must be >= 0, got {partition_id}")
    spec = member_spec(partition_id)
    nodes, pods = generate_cluster(spec.profile, seed=1000 + partition_id if seed is None else seed,
                                   **spec.generator(size))
    train, val, test = split_train_val_test(fits_somewhere(pods, nodes), TEST_FRACTION, VAL_FRACTION)
    return Member(f"{spec.name}-{partition_id}", nodes, train, test, val, spec)


def member_from_node_config(node_config: Mapping[str, Any] | None) -> Member | None:
    """A deployed member's own cluster, from its SuperNode's ``--node-config``:
    ``cluster-name``, ``nodes-csv`` and ``pods-csv`` (openb schema: its node inventory and its
    recent pods, as ``fedsched record`` writes them), and ``recording-speed`` (optional, 1 by
    default: how much faster the recording's clock ran than the cluster's, :func:`stretched`).
    Each pod runs as long as it ran, its wait for a node taken out (:func:`without_recorded_waits`).
    Its validation pods replay at the load its whole recording offered
    (:func:`recorded_load`). None in simulation (no ``nodes-csv``)."""
    nodes_csv = node_config.get("nodes-csv") if node_config else None
    if not nodes_csv:
        return None
    pods_csv = node_config.get("pods-csv")
    if not pods_csv:
        raise ValueError("node config: nodes-csv needs pods-csv (the member's recent pods)")
    speed = recording_speed(node_config.get("recording-speed", 1.0))
    nodes = load_nodes(str(nodes_csv))
    recorded = load_pods(str(pods_csv), nodes, allow_oversized=True)
    pods = stretched(fits_somewhere(without_recorded_waits(recorded, str(pods_csv)), nodes), speed)
    train, val, test = split_train_val_test(pods, TEST_FRACTION, VAL_FRACTION)
    return Member(str(node_config.get("cluster-name", Path(str(nodes_csv)).stem)), nodes, train, test, val,
                  replay={"target_load": recorded_load(pods, nodes)})


def recording_speed(value: Any) -> float:
    """The node config's ``recording-speed`` as a float: finite and positive, else a clear error."""
    try:
        speed = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"node config: recording-speed must be a number, got {value!r}") from None
    if not (math.isfinite(speed) and speed > 0):
        raise ValueError(f"node config: recording-speed must be finite and > 0, got {value!r}")
    return speed


def without_recorded_waits(pods: PodTable, pods_csv: str | Path) -> PodTable:
    """A recording's pods (``pods``: the file ``pods_csv`` as :func:`load_pods` read it, row for
    row) with each pod's wait for a node taken out of its life: the deletion time moved earlier by
    ``scheduled_time - creation_time``. The replay runs a pod for ``deletion - creation`` from the
    moment it starts; a recording of a busy cluster counts the pending time in it, so without this
    the twin's pods would run longer by as much as they once waited, load the twin more than the
    cluster was and wait longer in turn (measured on a loaded kwok member: pending p99 46 s for
    real, 228 s in the twin). Rows without a scheduling time, or with one outside
    ``[creation, deletion]``, are left as they are."""
    with open(pods_csv, newline="") as f:
        reader = csv.DictReader(f)
        if "scheduled_time" not in (reader.fieldnames or ()):
            return pods
        sched = np.array([_time(row.get("scheduled_time")) for row in reader])
    if len(sched) != len(pods):
        raise ValueError(f"{pods_csv}: {len(sched)} rows, {len(pods)} pods read from them")
    creation, deletion = pods.creation.astype(float), pods.deletion.astype(float)
    ok = np.isfinite(sched) & np.isfinite(creation) & np.isfinite(deletion) & \
        (sched >= creation) & (sched <= deletion)
    if not ok.any():
        return pods
    return dataclasses.replace(pods, deletion=np.where(ok, deletion - (sched - creation), deletion))


def _time(text: str | None) -> float:
    try:
        return float(text) if text else math.nan
    except ValueError:
        return math.nan


def stretched(pods: PodTable, speed: float) -> PodTable:
    """A recording whose clock ran ``speed`` times faster than the life of the cluster it stands
    for (1 for a real cluster; the kwok fleet plays a day of trace in minutes) back on the
    cluster's time scale: creation and deletion times times ``speed``. The twin's fixed windows
    (the 5-minute hot-node mean, the telemetry's 15 minutes, the usage model's ticks, noise and
    daily cycle) then judge the workload on the scale they were made for; on the compressed
    clock a pod lives seconds and no 5-minute mean is ever hot. ``pods`` itself at speed 1."""
    if speed == 1.0:
        return pods
    return dataclasses.replace(pods, creation=pods.creation * speed, deletion=pods.deletion * speed)


def recorded_load(pods: PodTable, nodes: NodeTable) -> float:
    """The requested load the recorded workload really put on its cluster (time-averaged, as the
    replay measures it), so that a part of it (the validation pods) replays at the load the whole
    did: the twin is as busy as the member's cluster was, not a fixed benchmark load."""
    as_recorded = ReplayConfig(arrival_jitter_s=0.0, duration_jitter=0.0)
    load = replay_workload(pods, nodes, as_recorded, np.random.default_rng(0)).offered_load
    if not math.isfinite(load) or load <= 0:
        raise ValueError(f"the recorded workload of {len(pods)} pods offers no measurable load: "
                         "record longer before the member joins")
    return float(load)


@functools.cache
def reference_typical(test_fraction: float = TEST_SPLIT, val_fraction: float = VAL_SPLIT) -> TypicalPods:
    """The typical pods of the fragmentation features, one set for every member, the hub, the
    online recipe and serving: the openb default trace's train part under the project's hash
    split (``test_fraction``, ``val_fraction``). Loaded once per process."""
    all_nodes = load_nodes(builtin_trace("openb_node_list_all_node.csv"))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), all_nodes)
    return TypicalPods.from_pods(split_train_val_test(pods, test_fraction, val_fraction)[0])
