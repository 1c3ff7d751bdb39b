"""Seeded generators of non-IID member clusters for federated learning.

Each generator returns a ``(NodeTable, PodTable)`` pair in the conventions of
:mod:`fedsched.common.model.cluster`. :func:`write_csvs` writes the pair in the openb CSV schema
(with the optional ``disk_io_mbps``/``net_mbps`` columns) and
:func:`fedsched.common.model.traces.load_nodes` / :func:`~fedsched.common.model.traces.load_pods` read
the files back to equal arrays. Pods are listed in arrival order.

Usage::

    nodes, pods = generate_cluster("web", seed=3)
    nodes, pods = generate_cluster("gpu", seed=3, n_nodes=40, spec_fraction=0.5)
    nodes, pods = GpuProfile(share_fraction=0.5).generate(seed=3)
    write_csvs(nodes, pods, "out/", "gpu3")   # out/gpu3_nodes.csv, out/gpu3_pods.csv

Determinism: the random stream is ``numpy.random.default_rng([seed, crc32(profile name)])``,
so the same profile, parameters and seed always give identical tables, different seeds give
different ones, and the three profiles draw independent streams for one seed.

Generative model (common to all profiles)
-----------------------------------------
1. Nodes. The node count is drawn uniformly from ``[nodes_min, nodes_max]`` unless
   ``n_nodes`` is passed to ``generate``. Each node draws a *shape* (cores, GiB of memory,
   and for GPU nodes a GPU count) from the profile's shape list with the given weights;
   GPU nodes draw one GPU model. Node disk and network capacities are per-profile
   constants. Node names are ``<profile>-node-NNNN``.
2. Pod count: ``round(pods_per_node * n_nodes)`` (at least 1) unless ``n_pods`` is passed.
3. Pod kind (CPU-only, GPU-sharing, whole-GPU job) is drawn per pod; requests are
   log-normal: a quantity with median ``m`` and log-sd ``s`` is ``m * exp(s * N(0, 1))``,
   clipped to the stated range and rounded (CPU to 50 milli-cores, memory to 64 MiB,
   GPU shares to 50 milli-GPU, disk/network to 0.1).
4. QoS classes are drawn from ``qos_weights`` over ``(BE, Burstable, LS, Guaranteed)``.
5. Arrival times follow the profile's process (below) over ``[0, trace_hours]``, conditioned
   on the pod count: the times are the order statistics of ``n_pods`` draws from the
   normalised rate function, which is exactly an inhomogeneous Poisson process given its
   count. Times are whole seconds.
6. Lifetimes are log-normal with median ``lifetime_median_s`` and log-sd ``lifetime_sigma``
   (whole seconds, at least 1); ``deletion_time = creation_time + lifetime``.
7. Applications: pods are grouped into applications (a Deployment's replicas, a job's
   workers) with ``pods_per_app`` pods on average: ``round(n_pods / pods_per_app)``
   applications get lognormal popularity weights (log-sd ``APP_SIZE_SIGMA`` = 1, so sizes
   are heavy-tailed) and each pod picks one by weight. Every replica copies its
   application's first pod: requests, GPUs, ``gpu_spec``, QoS and I/O demand (arrival time
   and lifetime stay the pod's own). ``PodTable.app`` holds the application (numbered in
   order of first appearance); the replay usage model gives the pods of one application a
   shared usage level. The grouping draws from its own stream
   (``default_rng([seed, crc32(name), 1])``), so the per-pod draws are those of a profile
   without applications (``pods_per_app=1``: every pod its own application).
8. Fit guarantee: a GPU pod never asks for more GPUs than the largest node of an acceptable
   model has, and a pod whose CPU and memory fit no eligible empty node is clipped to the
   largest eligible node (the one with the most CPU, then memory), so every pod fits at
   least one empty node and the strict loader accepts the files.

Profiles and their parameters
-----------------------------
``web`` (:class:`WebProfile`): a CPU-only web-serving cluster; many small pods.

- ``nodes_min``, ``nodes_max``: range of the node count (default 40-200).
- ``node_shapes``: ``(cores, memory GiB)`` per node shape (default 16x64, 32x64, 32x128,
  64x256); ``node_shape_weights``: their probabilities.
- ``node_disk_io_mbps``, ``node_net_mbps``: disk (MB/s) and network (Mbit/s) capacity of
  every node.
- ``pods_per_node``: default pod count per node; ``pods_per_app``: mean replicas per
  service (default 6).
- ``cpu_median_milli``, ``cpu_sigma``, ``cpu_min_milli``, ``cpu_max_milli``: log-normal CPU
  request and its clip range.
- ``mem_per_core_median_mib``, ``mem_sigma``, ``mem_min_mib``, ``mem_max_mib``: memory
  request = CPU cores x a log-normal MiB-per-core ratio, clipped.
- ``disk_median_mbps``, ``disk_sigma``, ``net_median_mbps``, ``net_sigma``: log-normal
  per-pod disk-I/O (MB/s) and network (Mbit/s) demand.
- ``qos_weights``: probabilities of BE, Burstable, LS, Guaranteed (Burstable-heavy).
- ``trace_hours``: span of the arrivals.
- ``diurnal_amplitude`` (``A`` in [0, 1)), ``diurnal_peak_hour`` (``h``),
  ``diurnal_period_hours`` (``P``, 24): the arrival rate is proportional to
  ``1 + A cos(2 pi (t - h) / P)`` with ``t`` in hours, so the peak-to-trough rate ratio is
  ``(1 + A) / (1 - A)``.
- ``lifetime_median_s``, ``lifetime_sigma``: log-normal pod lifetime.

``gpu`` (:class:`GpuProfile`): a GPU training cluster; multi-GPU jobs, GPU-sharing
inference pods, long lifetimes, GPU-model constraints.

- ``nodes_min``, ``nodes_max``: range of the node count (default 30-100).
- ``cpu_node_fraction``: share of CPU-only nodes (at least one node is a GPU node);
  ``cpu_node_shape``: their ``(cores, GiB)``.
- ``gpu_node_shapes``: ``(GPUs, cores, GiB)`` per GPU node shape (default 4x48x384 and
  8x96x768); ``gpu_node_shape_weights``: their probabilities.
- ``gpu_models``, ``gpu_model_weights``: GPU models and the probability that a GPU node
  carries each (one model per node).
- ``node_disk_io_mbps``, ``node_net_mbps``: node disk and network capacity.
- ``pods_per_node``: default pod count per node; ``pods_per_app``: mean pods per job or
  inference service (default 2).
- ``cpu_pod_fraction``, ``share_fraction``: probabilities that a pod is CPU-only or a
  GPU-sharing inference pod; the rest are whole-GPU jobs.
- ``job_gpu_counts``, ``job_gpu_weights``: GPUs per whole-GPU job (1, 2, 4, 8) and their
  probabilities (counts larger than any node are re-drawn among the feasible ones).
- ``cores_per_gpu_median``, ``mem_per_gpu_median_gib``, ``job_sigma``: a job asks for
  ``num_gpu`` x log-normal cores and GiB per GPU.
- ``share_milli_min``, ``share_milli_max``: uniform range of a sharing pod's GPU share;
  ``share_cpu_median_milli``, ``share_mem_median_mib``: its CPU and memory medians.
- ``cpu_pod_cpu_median_milli``, ``cpu_pod_mem_median_mib``: CPU-only pod medians;
  ``small_sigma``: log-sd of sharing and CPU-only pod requests.
- ``spec_fraction``: share of GPU pods with a ``gpu_spec``; the constraint names one
  model that has a node with enough GPUs.
- ``disk_per_gpu_median_mbps``, ``net_per_gpu_median_mbps``, ``io_sigma``: per-GPU
  log-normal disk and network demand (CPU-only pods count as one GPU).
- ``qos_weights``: BE, Burstable, LS, Guaranteed (LS-heavy).
- ``trace_hours``: span of the arrivals, which are a homogeneous Poisson process.
- ``lifetime_median_s``, ``lifetime_sigma``: log-normal lifetime (hours).

``edge`` (:class:`EdgeProfile`): a small edge cluster; small pods, bursty arrivals,
high churn.

- ``nodes_min``, ``nodes_max``: range of the node count (default 5-15).
- ``node_shapes``, ``node_shape_weights``: ``(cores, GiB)`` shapes (4-8 cores, 8-32 GiB).
- ``gpu_node_fraction``: probability that a node carries one small GPU of ``gpu_model``.
- ``node_disk_io_mbps``, ``node_net_mbps``: node disk and network capacity.
- ``pods_per_node``: default pod count per node; ``pods_per_app``: mean replicas per
  application (default 4).
- ``cpu_median_milli``, ``cpu_sigma``, ``cpu_min_milli``, ``cpu_max_milli``: CPU request.
- ``mem_median_mib``, ``mem_sigma``, ``mem_min_mib``, ``mem_max_mib``: memory request
  (independent of CPU).
- ``share_fraction``, ``share_milli_min``, ``share_milli_max``: probability and uniform
  share range of GPU-sharing pods (none when the cluster drew no GPU node).
- ``disk_median_mbps``, ``net_median_mbps``, ``io_sigma``: per-pod disk and network demand.
- ``qos_weights``: BE, Burstable, LS, Guaranteed (BE-heavy, no Guaranteed).
- ``trace_hours``: span of the arrivals.
- ``burst_fraction``, ``bursts_per_hour``, ``burst_spread_s``: a share ``burst_fraction`` of
  pods arrives in bursts; the burst count is ``max(1, round(bursts_per_hour * trace_hours))``,
  burst starts are uniform, pods pick a burst uniformly and arrive an exponential delay
  (mean ``burst_spread_s``) after its start; the other pods arrive as a homogeneous Poisson
  process. Inter-arrival times thus have a coefficient of variation well above 1.
- ``lifetime_median_s``, ``lifetime_sigma``: log-normal lifetime (minutes).

The three profiles are non-IID by construction: ``web`` has no GPUs, sub-core CPU-heavy
pods and Burstable-heavy QoS; ``gpu`` is dominated by GPU requests of whole GPUs, tens of
cores per job and LS-heavy QoS; ``edge`` has tiny nodes and pods, BE-heavy QoS, minute-scale
lifetimes and bursty arrivals.

Every parameter is checked when a profile is made (a ValueError naming it): every number, alone
or in a tuple, must be finite (a NaN ``diurnal_peak_hour`` made the arrivals' rejection sampling
loop forever), and each has its range as stated above.
"""

from __future__ import annotations

import csv
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import ClassVar

import numpy as np

from fedsched.common.model.cluster import MAX_GPUS_PER_NODE, MILLI_PER_GPU, QOS_CLASSES, NodeTable, PodTable

HOUR = 3600.0
NODE_CSV_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model", "disk_io_mbps", "net_mbps")
POD_CSV_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
                   "creation_time", "deletion_time", "disk_io_mbps", "net_mbps", "app",
                   "cpu_limit_milli", "memory_limit_mib", "cpu_use_milli", "memory_use_mib")

CPU_STEP_MILLI = 50
MEM_STEP_MIB = 64
SHARE_STEP_MILLI = 50
APP_SIZE_SIGMA = 1.0  # log-sd of the applications' popularity weights (heavy-tailed sizes)


# ---- validation helpers ------------------------------------------------------------

def _check(cond: bool, profile: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{profile}: {message}")


def _check_finite(profile: str, name: str, value: object) -> None:
    """A numeric parameter, or every number inside a tuple one, is finite (a NaN would make the
    draws loop forever or fill the cluster with NaN)."""
    if isinstance(value, tuple):
        for v in value:
            _check_finite(profile, name, v)
    elif isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        _check(math.isfinite(value), profile, f"{name} must be a finite number, got {value}")


def _check_weights(profile: str, name: str, weights: Sequence[float], n: int) -> None:
    _check(len(weights) == n, profile, f"{name} has {len(weights)} entries, expected {n}")
    _check(all(w >= 0 and math.isfinite(w) for w in weights) and sum(weights) > 0, profile,
           f"{name} must be non-negative with a positive sum, got {tuple(weights)}")


def _check_range(profile: str, lo_name: str, lo: float, hi_name: str, hi: float,
                 minimum: float = 0) -> None:
    _check(lo >= minimum and hi >= lo, profile,
           f"need {minimum} <= {lo_name} <= {hi_name}, got {lo} and {hi}")


def _check_positive(profile: str, **values: float) -> None:
    for k, v in values.items():
        _check(v > 0 and math.isfinite(v), profile, f"{k} must be positive, got {v}")


def _check_fraction(profile: str, **values: float) -> None:
    for k, v in values.items():
        _check(0 <= v <= 1, profile, f"{k} must be in [0, 1], got {v}")


# ---- sampling helpers --------------------------------------------------------------

def _rng(name: str, seed: int) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def _probs(weights: Sequence[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    return w / w.sum()


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(n))


def _quantise(x: np.ndarray, step: int, lo: float, hi: float) -> np.ndarray:
    """Round to a multiple of ``step`` within ``[lo, hi]`` (bounds rounded inward)."""
    lo_q = math.ceil(lo / step) * step
    hi_q = max(lo_q, math.floor(hi / step) * step)
    return np.clip(np.round(x / step) * step, lo_q, hi_q).astype(np.int64)


def _round_io(x: np.ndarray) -> np.ndarray:
    return np.round(x, 1)


def _counts(n_nodes: int | None, n_pods: int | None, rng: np.random.Generator,
            nodes_min: int, nodes_max: int, pods_per_node: float) -> tuple[int, int]:
    if n_nodes is None:
        n_nodes = int(rng.integers(nodes_min, nodes_max + 1))
    if n_nodes < 1:
        raise ValueError(f"n_nodes must be at least 1, got {n_nodes}")
    if n_pods is None:
        n_pods = max(1, round(pods_per_node * n_nodes))
    if n_pods < 1:
        raise ValueError(f"n_pods must be at least 1, got {n_pods}")
    return int(n_nodes), int(n_pods)


def _uniform_times(rng: np.random.Generator, n: int, span_s: float) -> np.ndarray:
    """Homogeneous Poisson arrivals on [0, span) given their count ``n``."""
    return np.sort(rng.uniform(0.0, span_s, n))


def diurnal_rate(t_s: np.ndarray, amplitude: float, peak_hour: float,
                 period_hours: float = 24.0) -> np.ndarray:
    """Relative arrival rate ``1 + A cos(2 pi (t - peak) / period)`` at times ``t_s`` (s)."""
    phase = 2 * np.pi * (np.asarray(t_s, dtype=np.float64) / HOUR - peak_hour) / period_hours
    return 1.0 + amplitude * np.cos(phase)


def _diurnal_times(rng: np.random.Generator, n: int, span_s: float, amplitude: float,
                   peak_hour: float, period_hours: float) -> np.ndarray:
    """Inhomogeneous Poisson arrivals with a sinusoidal rate, given their count (rejection)."""
    out = np.empty(0)
    bound = 1.0 + amplitude
    while len(out) < n:
        m = max(64, int(1.2 * (n - len(out)) * bound) + 16)
        t = rng.uniform(0.0, span_s, m)
        keep = rng.uniform(0.0, bound, m) < diurnal_rate(t, amplitude, peak_hour, period_hours)
        out = np.concatenate([out, t[keep]])
    return np.sort(out[:n])


def _bursty_times(rng: np.random.Generator, n: int, span_s: float, burst_fraction: float,
                  n_bursts: int, spread_s: float) -> np.ndarray:
    """Background Poisson arrivals plus clustered bursts, wrapped into [0, span)."""
    in_burst = rng.random(n) < burst_fraction
    t = rng.uniform(0.0, span_s, n)
    starts = rng.uniform(0.0, span_s, n_bursts)
    k = int(in_burst.sum())
    t[in_burst] = starts[rng.integers(0, n_bursts, k)] + rng.exponential(spread_s, k)
    return np.sort(np.mod(t, span_s))


def _lifetimes(rng: np.random.Generator, n: int, median_s: float, sigma: float) -> np.ndarray:
    return np.maximum(1.0, np.round(_lognormal(rng, median_s, sigma, n)))


def _qos(rng: np.random.Generator, weights: Sequence[float], n: int) -> np.ndarray:
    return rng.choice(len(QOS_CLASSES), size=n, p=_probs(weights)).astype(np.int64)


# ---- table construction ------------------------------------------------------------

def _make_nodes(prefix: str, cores: np.ndarray, mem_gib: np.ndarray, gpus: np.ndarray,
                model_names: Sequence[str], disk: float, net: float) -> NodeTable:
    """A NodeTable laid out exactly as ``load_nodes`` would build it from the CSV."""
    n = len(cores)
    gpus = np.asarray(gpus, dtype=np.int64)
    models = tuple(sorted({m for m, g in zip(model_names, gpus, strict=True) if g > 0 and m}))
    lookup = {m: i for i, m in enumerate(models)}
    model = np.array([lookup.get(m, -1) if g > 0 else -1
                      for m, g in zip(model_names, gpus, strict=True)], dtype=np.int64)
    return NodeTable(
        names=tuple(f"{prefix}-node-{i:04d}" for i in range(n)),
        cpu=np.asarray(cores, dtype=np.int64) * 1000,
        mem=np.asarray(mem_gib, dtype=np.int64) * 1024,
        gpu=gpus, model=model, models=models,
        disk_io=np.full(n, float(disk)), net=np.full(n, float(net)),
    )


def _eligible(nodes: NodeTable, num_gpu: int, spec_mask: int) -> np.ndarray:
    ok = nodes.gpu >= num_gpu
    if num_gpu > 0 and spec_mask:
        ok &= (nodes.model >= 0) & (((spec_mask >> np.maximum(nodes.model, 0)) & 1) == 1)
    return ok


def _ensure_fit(nodes: NodeTable, cpu: np.ndarray, mem: np.ndarray, num_gpu: np.ndarray,
                spec_mask: np.ndarray) -> None:
    """Clip CPU/memory in place so every pod fits at least one eligible empty node."""
    fits = (nodes.cpu[None, :] >= cpu[:, None]) & (nodes.mem[None, :] >= mem[:, None])
    for i in np.flatnonzero(~fits.any(axis=1) | (num_gpu > 0)):
        elig = _eligible(nodes, int(num_gpu[i]), int(spec_mask[i]))
        if not elig.any():
            raise AssertionError(f"synthetic pod {i} has no eligible node (generator bug)")
        if (fits[i] & elig).any():
            continue
        cand = np.flatnonzero(elig)
        best = cand[np.lexsort((nodes.mem[cand], nodes.cpu[cand]))[-1]]
        cpu[i] = min(cpu[i], nodes.cpu[best])
        mem[i] = min(mem[i], nodes.mem[best])


def _applications(prefix: str, seed: int, n: int, pods_per_app: float) -> tuple[np.ndarray, np.ndarray]:
    """Application code of each pod (in order of first appearance) and its leader pod.

    Drawn from a stream of its own, ``default_rng([seed, crc32(name), 1])``, so the per-pod
    draws of the profile are the same with and without applications.
    """
    if pods_per_app <= 1.0 or n <= 1:
        idx = np.arange(n, dtype=np.int64)
        return idx, idx
    rng = np.random.default_rng([int(seed), zlib.crc32(prefix.encode()), 1])
    n_apps = max(1, round(n / pods_per_app))
    weight = np.exp(APP_SIZE_SIGMA * rng.standard_normal(n_apps))
    raw = rng.choice(n_apps, size=n, p=weight / weight.sum())
    _, first, inv = np.unique(raw, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inv.ravel()], first[inv.ravel()].astype(np.int64)


def _make_pods(prefix: str, nodes: NodeTable, cpu: np.ndarray, mem: np.ndarray,
               num_gpu: np.ndarray, gpu_milli: np.ndarray, spec_mask: np.ndarray, qos: np.ndarray,
               creation: np.ndarray, lifetime: np.ndarray, disk: np.ndarray,
               net: np.ndarray, seed: int = 0, pods_per_app: float = 1.0) -> PodTable:
    n = len(cpu)
    app, leader = _applications(prefix, seed, n, pods_per_app)
    # Replicas of an application are copies of its first pod (requests, GPUs, QoS, I/O).
    cpu = np.asarray(cpu, dtype=np.int64)[leader].copy()
    mem = np.asarray(mem, dtype=np.int64)[leader].copy()
    num_gpu = np.asarray(num_gpu, dtype=np.int64)[leader]
    gpu_milli = np.asarray(gpu_milli, dtype=np.int64)[leader]
    spec_mask = np.asarray(spec_mask, dtype=np.int64)[leader]
    qos = np.asarray(qos, dtype=np.int64)[leader]
    disk = np.asarray(disk, dtype=np.float64)[leader]
    net = np.asarray(net, dtype=np.float64)[leader]
    _ensure_fit(nodes, cpu, mem, num_gpu, spec_mask)
    creation = np.round(np.asarray(creation, dtype=np.float64))
    return PodTable(
        names=tuple(f"{prefix}-pod-{i:05d}" for i in range(n)),
        cpu=cpu, mem=mem, num_gpu=num_gpu, gpu_milli=gpu_milli,
        spec_mask=spec_mask, qos=qos,
        creation=creation, deletion=creation + np.asarray(lifetime, dtype=np.float64),
        disk_io=disk, net=net, app=app,
    )


# ---- profiles ----------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """The parameters every profile has (their meaning below; each profile sets its own
    defaults) and their checks. A profile is a frozen dataclass whose ``generate`` draws one
    seeded cluster; fields are keyword-only."""

    nodes_min: int
    """Smallest node count drawn when ``n_nodes`` is not given."""
    nodes_max: int
    """Largest node count drawn when ``n_nodes`` is not given."""
    node_disk_io_mbps: float
    """Disk-I/O capacity of every node, MB/s."""
    node_net_mbps: float
    """Network capacity of every node, Mbit/s."""
    pods_per_node: float
    """Default number of pods per node."""
    pods_per_app: float
    """Mean number of pods (replicas) per application; 1 = every pod its own application."""
    qos_weights: tuple[float, float, float, float]
    """Probabilities of QoS BE, Burstable, LS, Guaranteed."""
    trace_hours: float
    """Span of the arrivals, hours."""
    lifetime_median_s: float
    """Median pod lifetime, seconds (log-normal)."""
    lifetime_sigma: float
    """Log-sd of the lifetime."""

    name: ClassVar[str]
    """The profile's name (its key in :data:`PROFILES`; also seeds its random stream)."""

    def __post_init__(self) -> None:
        p = self.name
        for f in fields(self):  # every profile's own fields too: they run this first
            _check_finite(p, f.name, getattr(self, f.name))
        _check_range(p, "nodes_min", self.nodes_min, "nodes_max", self.nodes_max, minimum=1)
        _check_weights(p, "qos_weights", self.qos_weights, len(QOS_CLASSES))
        _check(self.pods_per_app >= 1 and math.isfinite(self.pods_per_app), p,
               f"pods_per_app must be >= 1, got {self.pods_per_app}")
        _check_positive(p, pods_per_node=self.pods_per_node, node_disk_io_mbps=self.node_disk_io_mbps,
                        node_net_mbps=self.node_net_mbps, trace_hours=self.trace_hours,
                        lifetime_median_s=self.lifetime_median_s)
        _check(self.lifetime_sigma >= 0, p, "lifetime_sigma must be non-negative")

    def generate(self, seed: int, n_nodes: int | None = None,
                 n_pods: int | None = None) -> tuple[NodeTable, PodTable]:
        """Nodes and pods (in arrival order) of one seeded cluster of this profile."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class ShapedProfile(ClusterProfile):
    """A profile whose nodes draw from a list of (cores, memory GiB) shapes and whose pods' CPU
    and memory requests are log-normal and clipped to a range (``web``, ``edge``)."""

    node_shapes: tuple[tuple[int, int], ...]
    """Node shapes as (cores, memory GiB)."""
    node_shape_weights: tuple[float, ...]
    """Probability of each node shape."""
    cpu_median_milli: float
    """Median CPU request, milli-cores (log-normal)."""
    cpu_sigma: float
    """Log-sd of the CPU request."""
    cpu_min_milli: int
    """Smallest CPU request, milli-cores."""
    cpu_max_milli: int
    """Largest CPU request, milli-cores."""
    mem_sigma: float
    """Log-sd of the memory draw (``web``: the memory-per-core ratio; ``edge``: the request)."""
    mem_min_mib: int
    """Smallest memory request, MiB."""
    mem_max_mib: int
    """Largest memory request, MiB."""

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.name
        _check(len(self.node_shapes) > 0, p, "node_shapes is empty")
        _check(all(c > 0 and m > 0 for c, m in self.node_shapes), p, "node shapes must be positive")
        _check_weights(p, "node_shape_weights", self.node_shape_weights, len(self.node_shapes))
        _check_range(p, "cpu_min_milli", self.cpu_min_milli, "cpu_max_milli", self.cpu_max_milli,
                     minimum=CPU_STEP_MILLI)
        _check_range(p, "mem_min_mib", self.mem_min_mib, "mem_max_mib", self.mem_max_mib,
                     minimum=MEM_STEP_MIB)
        _check_positive(p, cpu_median_milli=self.cpu_median_milli)
        for k in ("cpu_sigma", "mem_sigma"):
            _check(getattr(self, k) >= 0, p, f"{k} must be non-negative")


@dataclass(frozen=True, kw_only=True)
class WebProfile(ShapedProfile):
    """CPU-only web-serving cluster: many small pods, diurnal arrivals (see module doc)."""

    # Defaults of the shared fields (meanings on ClusterProfile and ShapedProfile).
    nodes_min: int = 40
    nodes_max: int = 200
    node_shapes: tuple[tuple[int, int], ...] = ((16, 64), (32, 64), (32, 128), (64, 256))
    node_shape_weights: tuple[float, ...] = (0.3, 0.2, 0.35, 0.15)
    node_disk_io_mbps: float = 2000.0
    node_net_mbps: float = 25000.0
    pods_per_node: float = 25.0
    pods_per_app: float = 6.0
    cpu_median_milli: float = 250.0
    cpu_sigma: float = 0.9
    cpu_min_milli: int = 50
    cpu_max_milli: int = 4000
    mem_sigma: float = 0.5
    mem_min_mib: int = 64
    mem_max_mib: int = 16384
    qos_weights: tuple[float, float, float, float] = (0.15, 0.55, 0.25, 0.05)
    trace_hours: float = 72.0
    lifetime_median_s: float = 3600.0
    lifetime_sigma: float = 1.2

    mem_per_core_median_mib: float = 2048.0
    """Median memory per requested core, MiB (log-normal)."""
    disk_median_mbps: float = 5.0
    """Median per-pod disk-I/O demand, MB/s (log-normal)."""
    disk_sigma: float = 1.0
    """Log-sd of the disk demand."""
    net_median_mbps: float = 50.0
    """Median per-pod network demand, Mbit/s (log-normal)."""
    net_sigma: float = 1.0
    """Log-sd of the network demand."""
    diurnal_amplitude: float = 0.6
    """Relative amplitude A of the sinusoidal arrival rate, in [0, 1)."""
    diurnal_peak_hour: float = 14.0
    """Hour of day (from t = 0) at which the arrival rate peaks."""
    diurnal_period_hours: float = 24.0
    """Period of the arrival-rate cycle, hours."""

    name = "web"

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.name
        _check_positive(p, mem_per_core_median_mib=self.mem_per_core_median_mib,
                        disk_median_mbps=self.disk_median_mbps, net_median_mbps=self.net_median_mbps,
                        diurnal_period_hours=self.diurnal_period_hours)
        _check(0 <= self.diurnal_amplitude < 1, p,
               f"diurnal_amplitude must be in [0, 1), got {self.diurnal_amplitude}")
        _check(math.isfinite(2 * math.pi * (self.trace_hours + abs(self.diurnal_peak_hour))
                             / self.diurnal_period_hours), p,
               f"diurnal_peak_hour {self.diurnal_peak_hour} and diurnal_period_hours "
               f"{self.diurnal_period_hours} put the arrival rate's phase past float range")
        for k in ("disk_sigma", "net_sigma"):
            _check(getattr(self, k) >= 0, p, f"{k} must be non-negative")

    def generate(self, seed: int, n_nodes: int | None = None,
                 n_pods: int | None = None) -> tuple[NodeTable, PodTable]:
        """Nodes and pods (in arrival order) of one seeded ``web`` cluster."""
        rng = _rng(self.name, seed)
        n_nodes, n_pods = _counts(n_nodes, n_pods, rng, self.nodes_min, self.nodes_max,
                                  self.pods_per_node)
        shapes = np.asarray(self.node_shapes, dtype=np.int64)
        pick = rng.choice(len(shapes), size=n_nodes, p=_probs(self.node_shape_weights))
        nodes = _make_nodes(self.name, shapes[pick, 0], shapes[pick, 1], np.zeros(n_nodes, np.int64),
                            [""] * n_nodes, self.node_disk_io_mbps, self.node_net_mbps)
        cpu = _quantise(_lognormal(rng, self.cpu_median_milli, self.cpu_sigma, n_pods),
                        CPU_STEP_MILLI, self.cpu_min_milli, self.cpu_max_milli)
        ratio = _lognormal(rng, self.mem_per_core_median_mib, self.mem_sigma, n_pods)
        mem = _quantise(cpu / 1000.0 * ratio, MEM_STEP_MIB, self.mem_min_mib, self.mem_max_mib)
        disk = _round_io(_lognormal(rng, self.disk_median_mbps, self.disk_sigma, n_pods))
        net = _round_io(_lognormal(rng, self.net_median_mbps, self.net_sigma, n_pods))
        qos = _qos(rng, self.qos_weights, n_pods)
        creation = _diurnal_times(rng, n_pods, self.trace_hours * HOUR, self.diurnal_amplitude,
                                  self.diurnal_peak_hour, self.diurnal_period_hours)
        life = _lifetimes(rng, n_pods, self.lifetime_median_s, self.lifetime_sigma)
        zeros = np.zeros(n_pods, dtype=np.int64)
        pods = _make_pods(self.name, nodes, cpu, mem, zeros, zeros, zeros, qos, creation, life,
                          disk, net, seed, self.pods_per_app)
        return nodes, pods


@dataclass(frozen=True, kw_only=True)
class GpuProfile(ClusterProfile):
    """GPU training cluster: multi-GPU jobs, GPU-sharing inference, long lifetimes."""

    # Defaults of the shared fields (meanings on ClusterProfile).
    nodes_min: int = 30
    nodes_max: int = 100
    node_disk_io_mbps: float = 5000.0
    node_net_mbps: float = 100000.0
    pods_per_node: float = 8.0
    pods_per_app: float = 2.0
    qos_weights: tuple[float, float, float, float] = (0.1, 0.1, 0.6, 0.2)
    trace_hours: float = 168.0  # homogeneous Poisson arrivals
    lifetime_median_s: float = 6 * HOUR
    lifetime_sigma: float = 1.0

    cpu_node_fraction: float = 0.1
    """Share of CPU-only nodes (rounded; at least one node has GPUs)."""
    cpu_node_shape: tuple[int, int] = (64, 256)
    """CPU-only node shape as (cores, memory GiB)."""
    gpu_node_shapes: tuple[tuple[int, int, int], ...] = ((4, 48, 384), (8, 96, 768))
    """GPU node shapes as (GPUs, cores, memory GiB)."""
    gpu_node_shape_weights: tuple[float, ...] = (0.5, 0.5)
    """Probability of each GPU node shape."""
    gpu_models: tuple[str, ...] = ("A100", "V100")
    """GPU models of the cluster (one per GPU node)."""
    gpu_model_weights: tuple[float, ...] = (0.6, 0.4)
    """Probability that a GPU node carries each model."""
    cpu_pod_fraction: float = 0.1
    """Probability that a pod is CPU-only (data loaders, controllers)."""
    share_fraction: float = 0.2
    """Probability that a pod is a GPU-sharing inference pod (gpu_milli < 1000)."""
    job_gpu_counts: tuple[int, ...] = (1, 2, 4, 8)
    """Whole GPUs a training job may ask for."""
    job_gpu_weights: tuple[float, ...] = (0.35, 0.25, 0.2, 0.2)
    """Probability of each GPU count."""
    cores_per_gpu_median: float = 6.0
    """Median cores requested per GPU of a training job (log-normal)."""
    mem_per_gpu_median_gib: float = 48.0
    """Median memory requested per GPU of a training job, GiB (log-normal)."""
    job_sigma: float = 0.3
    """Log-sd of the per-GPU core and memory requests."""
    share_milli_min: int = 100
    """Smallest GPU share of a sharing pod, milli-GPU."""
    share_milli_max: int = 900
    """Largest GPU share of a sharing pod, milli-GPU (below 1000)."""
    share_cpu_median_milli: float = 2000.0
    """Median CPU request of a sharing pod, milli-cores."""
    share_mem_median_mib: float = 8192.0
    """Median memory request of a sharing pod, MiB."""
    cpu_pod_cpu_median_milli: float = 4000.0
    """Median CPU request of a CPU-only pod, milli-cores."""
    cpu_pod_mem_median_mib: float = 16384.0
    """Median memory request of a CPU-only pod, MiB."""
    small_sigma: float = 0.5
    """Log-sd of sharing and CPU-only pod requests."""
    spec_fraction: float = 0.25
    """Share of GPU pods constrained to one GPU model (gpu_spec)."""
    disk_per_gpu_median_mbps: float = 100.0
    """Median disk-I/O demand per GPU, MB/s (log-normal)."""
    net_per_gpu_median_mbps: float = 1000.0
    """Median network demand per GPU, Mbit/s (log-normal)."""
    io_sigma: float = 0.7
    """Log-sd of the disk and network demand."""

    name = "gpu"

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.name
        _check_fraction(p, cpu_node_fraction=self.cpu_node_fraction, spec_fraction=self.spec_fraction,
                        cpu_pod_fraction=self.cpu_pod_fraction, share_fraction=self.share_fraction)
        _check(self.cpu_pod_fraction + self.share_fraction <= 1, p,
               "cpu_pod_fraction + share_fraction must not exceed 1")
        _check(self.cpu_node_shape[0] > 0 and self.cpu_node_shape[1] > 0, p,
               "cpu_node_shape must be positive")
        _check(len(self.gpu_node_shapes) > 0, p, "gpu_node_shapes is empty")
        _check(all(1 <= g <= MAX_GPUS_PER_NODE and c > 0 and m > 0 for g, c, m in self.gpu_node_shapes),
               p, f"GPU node shapes need 1..{MAX_GPUS_PER_NODE} GPUs and positive cores/memory")
        _check_weights(p, "gpu_node_shape_weights", self.gpu_node_shape_weights,
                       len(self.gpu_node_shapes))
        _check(len(self.gpu_models) > 0 and all(m and "|" not in m and m == m.strip()
                                                for m in self.gpu_models)
               and len(set(self.gpu_models)) == len(self.gpu_models), p,
               "gpu_models must be distinct non-empty names without '|' or surrounding blanks")
        _check_weights(p, "gpu_model_weights", self.gpu_model_weights, len(self.gpu_models))
        _check(len(self.job_gpu_counts) > 0
               and all(1 <= g <= MAX_GPUS_PER_NODE for g in self.job_gpu_counts), p,
               f"job_gpu_counts must be in 1..{MAX_GPUS_PER_NODE}")
        _check_weights(p, "job_gpu_weights", self.job_gpu_weights, len(self.job_gpu_counts))
        _check_range(p, "share_milli_min", self.share_milli_min, "share_milli_max",
                     self.share_milli_max, minimum=SHARE_STEP_MILLI)
        _check(self.share_milli_max < MILLI_PER_GPU, p, "share_milli_max must be below 1000")
        _check_positive(p, cores_per_gpu_median=self.cores_per_gpu_median,
                        mem_per_gpu_median_gib=self.mem_per_gpu_median_gib,
                        share_cpu_median_milli=self.share_cpu_median_milli,
                        share_mem_median_mib=self.share_mem_median_mib,
                        cpu_pod_cpu_median_milli=self.cpu_pod_cpu_median_milli,
                        cpu_pod_mem_median_mib=self.cpu_pod_mem_median_mib,
                        disk_per_gpu_median_mbps=self.disk_per_gpu_median_mbps,
                        net_per_gpu_median_mbps=self.net_per_gpu_median_mbps)
        for k in ("job_sigma", "small_sigma", "io_sigma"):
            _check(getattr(self, k) >= 0, p, f"{k} must be non-negative")

    def generate(self, seed: int, n_nodes: int | None = None,
                 n_pods: int | None = None) -> tuple[NodeTable, PodTable]:
        """Nodes and pods (in arrival order) of one seeded ``gpu`` cluster."""
        rng = _rng(self.name, seed)
        n_nodes, n_pods = _counts(n_nodes, n_pods, rng, self.nodes_min, self.nodes_max,
                                  self.pods_per_node)
        # Nodes: GPU nodes first, then the CPU-only ones.
        n_cpu_nodes = min(round(self.cpu_node_fraction * n_nodes), n_nodes - 1)
        n_gpu_nodes = n_nodes - n_cpu_nodes
        shapes = np.asarray(self.gpu_node_shapes, dtype=np.int64)
        pick = rng.choice(len(shapes), size=n_gpu_nodes, p=_probs(self.gpu_node_shape_weights))
        model_pick = rng.choice(len(self.gpu_models), size=n_gpu_nodes, p=_probs(self.gpu_model_weights))
        gpus = np.concatenate([shapes[pick, 0], np.zeros(n_cpu_nodes, np.int64)])
        cores = np.concatenate([shapes[pick, 1], np.full(n_cpu_nodes, self.cpu_node_shape[0])])
        mem_gib = np.concatenate([shapes[pick, 2], np.full(n_cpu_nodes, self.cpu_node_shape[1])])
        model_names = [self.gpu_models[k] for k in model_pick] + [""] * n_cpu_nodes
        nodes = _make_nodes(self.name, cores, mem_gib, gpus, model_names, self.node_disk_io_mbps,
                            self.node_net_mbps)
        # Largest GPU count per model present (index into nodes.models).
        max_gpus = np.array([int(nodes.gpu[nodes.model == k].max()) for k in range(len(nodes.models))])

        # Pod kinds: 0 CPU-only, 1 GPU-sharing, 2 whole-GPU job.
        u = rng.random(n_pods)
        kind = np.where(u < self.cpu_pod_fraction, 0,
                        np.where(u < self.cpu_pod_fraction + self.share_fraction, 1, 2))
        counts = np.asarray(self.job_gpu_counts, dtype=np.int64)
        max_count = int(max_gpus.max())
        job_p = _probs(self.job_gpu_weights) * (counts <= max_count)
        # Counts larger than every node are re-drawn among the feasible ones; if none is
        # feasible the draws are clipped to the largest node below.
        job_p = job_p / job_p.sum() if job_p.sum() > 0 else _probs(self.job_gpu_weights)
        num_gpu = np.where(kind == 2, counts[rng.choice(len(counts), size=n_pods, p=job_p)],
                           np.where(kind == 1, 1, 0)).astype(np.int64)
        num_gpu = np.minimum(num_gpu, max_count)
        share = _quantise(rng.uniform(self.share_milli_min, self.share_milli_max, n_pods),
                          SHARE_STEP_MILLI, self.share_milli_min, self.share_milli_max)
        gpu_milli = np.where(kind == 2, MILLI_PER_GPU, np.where(kind == 1, share, 0))
        # gpu_spec: one model that has a node with enough GPUs.
        constrained = (num_gpu > 0) & (rng.random(n_pods) < self.spec_fraction)
        spec_draw = rng.random(n_pods)
        spec_mask = np.zeros(n_pods, dtype=np.int64)
        for i in np.flatnonzero(constrained):
            ok = np.flatnonzero(max_gpus >= num_gpu[i])
            spec_mask[i] = 1 << int(ok[int(spec_draw[i] * len(ok))])

        per_gpu_cores = _lognormal(rng, self.cores_per_gpu_median, self.job_sigma, n_pods)
        per_gpu_gib = _lognormal(rng, self.mem_per_gpu_median_gib, self.job_sigma, n_pods)
        small_cpu = _lognormal(rng, 1.0, self.small_sigma, n_pods)
        small_mem = _lognormal(rng, 1.0, self.small_sigma, n_pods)
        cpu_raw = np.select([kind == 2, kind == 1],
                            [num_gpu * per_gpu_cores * 1000.0, small_cpu * self.share_cpu_median_milli],
                            small_cpu * self.cpu_pod_cpu_median_milli)
        mem_raw = np.select([kind == 2, kind == 1],
                            [num_gpu * per_gpu_gib * 1024.0, small_mem * self.share_mem_median_mib],
                            small_mem * self.cpu_pod_mem_median_mib)
        cpu = _quantise(cpu_raw, CPU_STEP_MILLI, CPU_STEP_MILLI, float(nodes.cpu.max()))
        mem = _quantise(mem_raw, MEM_STEP_MIB, MEM_STEP_MIB, float(nodes.mem.max()))
        io_units = np.maximum(num_gpu, 1)
        disk = _round_io(io_units * _lognormal(rng, self.disk_per_gpu_median_mbps, self.io_sigma, n_pods))
        net = _round_io(io_units * _lognormal(rng, self.net_per_gpu_median_mbps, self.io_sigma, n_pods))
        qos = _qos(rng, self.qos_weights, n_pods)
        creation = _uniform_times(rng, n_pods, self.trace_hours * HOUR)
        life = _lifetimes(rng, n_pods, self.lifetime_median_s, self.lifetime_sigma)
        pods = _make_pods(self.name, nodes, cpu, mem, num_gpu, gpu_milli, spec_mask, qos, creation,
                          life, disk, net, seed, self.pods_per_app)
        return nodes, pods


@dataclass(frozen=True, kw_only=True)
class EdgeProfile(ShapedProfile):
    """Small edge cluster: small nodes and pods, bursty arrivals, high churn."""

    # Defaults of the shared fields (meanings on ClusterProfile and ShapedProfile).
    nodes_min: int = 5
    nodes_max: int = 15
    node_shapes: tuple[tuple[int, int], ...] = ((4, 8), (4, 16), (8, 16), (8, 32))
    node_shape_weights: tuple[float, ...] = (0.3, 0.3, 0.25, 0.15)
    node_disk_io_mbps: float = 200.0
    node_net_mbps: float = 1000.0
    pods_per_node: float = 40.0
    pods_per_app: float = 4.0
    cpu_median_milli: float = 200.0
    cpu_sigma: float = 0.7
    cpu_min_milli: int = 50
    cpu_max_milli: int = 2000
    mem_sigma: float = 0.7
    mem_min_mib: int = 64
    mem_max_mib: int = 4096
    qos_weights: tuple[float, float, float, float] = (0.5, 0.35, 0.15, 0.0)
    trace_hours: float = 24.0
    lifetime_median_s: float = 300.0
    lifetime_sigma: float = 1.0

    gpu_node_fraction: float = 0.3
    """Probability that a node carries one small GPU."""
    gpu_model: str = "T4"
    """Model name of the edge GPUs."""
    mem_median_mib: float = 256.0
    """Median memory request, MiB (log-normal, independent of CPU)."""
    share_fraction: float = 0.1
    """Probability that a pod shares a GPU (only if the cluster has GPU nodes)."""
    share_milli_min: int = 100
    """Smallest GPU share, milli-GPU."""
    share_milli_max: int = 500
    """Largest GPU share, milli-GPU (below 1000)."""
    disk_median_mbps: float = 2.0
    """Median per-pod disk-I/O demand, MB/s (log-normal)."""
    net_median_mbps: float = 10.0
    """Median per-pod network demand, Mbit/s (log-normal)."""
    io_sigma: float = 0.8
    """Log-sd of the disk and network demand."""
    burst_fraction: float = 0.7
    """Share of pods that arrive in bursts."""
    bursts_per_hour: float = 1.0
    """Mean number of bursts per hour of trace."""
    burst_spread_s: float = 60.0
    """Mean delay of a burst's pods after the burst start, seconds (exponential)."""

    name = "edge"

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.name
        _check_fraction(p, gpu_node_fraction=self.gpu_node_fraction, share_fraction=self.share_fraction,
                        burst_fraction=self.burst_fraction)
        _check(bool(self.gpu_model) and "|" not in self.gpu_model
               and self.gpu_model == self.gpu_model.strip(), p,
               "gpu_model must be a non-empty name without '|' or surrounding blanks")
        _check_range(p, "share_milli_min", self.share_milli_min, "share_milli_max",
                     self.share_milli_max, minimum=SHARE_STEP_MILLI)
        _check(self.share_milli_max < MILLI_PER_GPU, p, "share_milli_max must be below 1000")
        _check_positive(p, mem_median_mib=self.mem_median_mib, disk_median_mbps=self.disk_median_mbps,
                        net_median_mbps=self.net_median_mbps, bursts_per_hour=self.bursts_per_hour,
                        burst_spread_s=self.burst_spread_s)
        _check(self.io_sigma >= 0, p, "io_sigma must be non-negative")

    def generate(self, seed: int, n_nodes: int | None = None,
                 n_pods: int | None = None) -> tuple[NodeTable, PodTable]:
        """Nodes and pods (in arrival order) of one seeded ``edge`` cluster."""
        rng = _rng(self.name, seed)
        n_nodes, n_pods = _counts(n_nodes, n_pods, rng, self.nodes_min, self.nodes_max,
                                  self.pods_per_node)
        shapes = np.asarray(self.node_shapes, dtype=np.int64)
        pick = rng.choice(len(shapes), size=n_nodes, p=_probs(self.node_shape_weights))
        gpus = (rng.random(n_nodes) < self.gpu_node_fraction).astype(np.int64)
        nodes = _make_nodes(self.name, shapes[pick, 0], shapes[pick, 1], gpus,
                            [self.gpu_model if g else "" for g in gpus], self.node_disk_io_mbps,
                            self.node_net_mbps)
        share_p = self.share_fraction if gpus.any() else 0.0
        shared = rng.random(n_pods) < share_p
        num_gpu = shared.astype(np.int64)
        share = _quantise(rng.uniform(self.share_milli_min, self.share_milli_max, n_pods),
                          SHARE_STEP_MILLI, self.share_milli_min, self.share_milli_max)
        gpu_milli = np.where(shared, share, 0)
        cpu = _quantise(_lognormal(rng, self.cpu_median_milli, self.cpu_sigma, n_pods),
                        CPU_STEP_MILLI, self.cpu_min_milli, self.cpu_max_milli)
        mem = _quantise(_lognormal(rng, self.mem_median_mib, self.mem_sigma, n_pods),
                        MEM_STEP_MIB, self.mem_min_mib, self.mem_max_mib)
        disk = _round_io(_lognormal(rng, self.disk_median_mbps, self.io_sigma, n_pods))
        net = _round_io(_lognormal(rng, self.net_median_mbps, self.io_sigma, n_pods))
        qos = _qos(rng, self.qos_weights, n_pods)
        n_bursts = max(1, round(self.bursts_per_hour * self.trace_hours))
        creation = _bursty_times(rng, n_pods, self.trace_hours * HOUR, self.burst_fraction, n_bursts,
                                 self.burst_spread_s)
        life = _lifetimes(rng, n_pods, self.lifetime_median_s, self.lifetime_sigma)
        pods = _make_pods(self.name, nodes, cpu, mem, num_gpu, gpu_milli,
                          np.zeros(n_pods, dtype=np.int64), qos, creation, life, disk, net, seed,
                          self.pods_per_app)
        return nodes, pods


Profile = WebProfile | GpuProfile | EdgeProfile

PROFILES: dict[str, Profile] = {"web": WebProfile(), "gpu": GpuProfile(), "edge": EdgeProfile()}
"""The default profile of each kind, by name."""


def generate_cluster(name: str, seed: int, **overrides: object) -> tuple[NodeTable, PodTable]:
    """Generate a cluster of profile ``name``; ``overrides`` are profile fields or
    ``n_nodes``/``n_pods`` (e.g. ``generate_cluster("gpu", 1, n_nodes=40, spec_fraction=0.5)``)."""
    if name not in PROFILES:
        raise ValueError(f"unknown synthetic profile {name!r}; expected one of {', '.join(PROFILES)}")
    profile = PROFILES[name]
    n_nodes = overrides.pop("n_nodes", None)
    n_pods = overrides.pop("n_pods", None)
    known = {f.name for f in fields(profile)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown parameter(s) {', '.join(unknown)} for profile {name!r}; "
                        f"known: n_nodes, n_pods, {', '.join(sorted(known))}")
    if overrides:
        profile = replace(profile, **overrides)
    return profile.generate(seed, n_nodes=n_nodes, n_pods=n_pods)  # type: ignore[arg-type]


# ---- CSV output --------------------------------------------------------------------

def _fmt_float(x: float) -> str:
    """Shortest text that parses back to the same float; empty for NaN."""
    x = float(x)
    if math.isnan(x):
        return ""
    if math.isfinite(x) and x == int(x) and abs(x) < 2**53:
        return str(int(x))
    return repr(x)


def _spec_text(mask: int, models: tuple[str, ...]) -> str:
    return "|".join(m for k, m in enumerate(models) if (mask >> k) & 1)


def write_csvs(nodes: NodeTable, pods: PodTable, directory: str | Path,
               prefix: str) -> tuple[Path, Path]:
    """Write ``<prefix>_nodes.csv`` and ``<prefix>_pods.csv`` under ``directory`` (created if
    needed) in the openb schema plus ``disk_io_mbps``/``net_mbps`` and the pods' ``app``
    (its code; empty when unknown), ``cpu_limit_milli`` and ``memory_limit_mib`` (empty when
    unknown); returns both paths.

    ``load_nodes(nodes_path)`` and ``load_pods(pods_path, that_nodes)`` give back equal
    tables for any tables the loader itself could have produced (application codes
    numbered in order of first appearance, as the generators and the loader number them).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    nodes_path = directory / f"{prefix}_nodes.csv"
    pods_path = directory / f"{prefix}_pods.csv"
    with nodes_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(NODE_CSV_COLUMNS)
        for i in range(len(nodes)):
            m = int(nodes.model[i])
            w.writerow([nodes.names[i], int(nodes.cpu[i]), int(nodes.mem[i]), int(nodes.gpu[i]),
                        nodes.models[m] if m >= 0 else "", _fmt_float(nodes.disk_io[i]),
                        _fmt_float(nodes.net[i])])
    with pods_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(POD_CSV_COLUMNS)
        for i in range(len(pods)):
            w.writerow([pods.names[i], int(pods.cpu[i]), int(pods.mem[i]), int(pods.num_gpu[i]),
                        int(pods.gpu_milli[i]), _spec_text(int(pods.spec_mask[i]), nodes.models),
                        QOS_CLASSES[int(pods.qos[i])], _fmt_float(pods.creation[i]),
                        _fmt_float(pods.deletion[i]), _fmt_float(pods.disk_io[i]),
                        _fmt_float(pods.net[i]), int(pods.app[i]) if pods.app[i] >= 0 else "",
                        int(pods.cpu_limit[i]) or "", int(pods.mem_limit[i]) or "",
                        _fmt_float(pods.cpu_use[i]), _fmt_float(pods.mem_use[i])])
    return nodes_path, pods_path
