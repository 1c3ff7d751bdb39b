"""The one scorer interface every scheduler implements, learned or heuristic.

A scheduler answers one question: *scores for these candidate nodes for this pod*
(:meth:`Scheduler.score`, higher is better). The simulator, the evaluation, the Gym
environment and the extender all go through :func:`place`, which filters the feasible
nodes, asks for scores, breaks ties among the best at random as kube-scheduler's
``selectHost`` does, and lets the scheduler pick the GPUs on the chosen node.

GPU choice on a node (:meth:`Scheduler.select_gpus`): whole-GPU pods take the lowest-
indexed fully free GPUs; a GPU-sharing pod goes to the fitting GPU with the least free
share (best fit), unless a scheduler overrides it (FGD picks the GPU that minimises
fragmentation).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from ..cluster import MILLI_PER_GPU, ClusterState, Pod, PodTable


@dataclass
class SchedulerContext:
    """What a scheduler may know before it runs.

    ``train_pods`` is the training part of the workload (FGD's typical pods and any
    learned statistic come from it only); ``rng`` is the run's seeded generator.
    """

    train_pods: PodTable | None = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))


class Scheduler(ABC):
    """Scores candidate nodes for a pod. Subclasses set ``name`` and implement ``score``."""

    name: str = "abstract"

    def __init__(self, ctx: SchedulerContext | None = None) -> None:
        self.ctx = ctx or SchedulerContext()

    @abstractmethod
    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        """Scores (float, higher is better) for the feasible candidate ``nodes``."""

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        return default_gpu_choice(state, pod, node)


def default_gpu_choice(state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
    """Lowest-indexed free GPUs for whole-GPU pods; best-fit GPU for a sharing pod."""
    if pod.num_gpu == 0:
        return ()
    free = state.gpu_free[node]
    if pod.is_gpu_share:
        fits = free >= pod.gpu_milli
        left = np.where(fits, free - pod.gpu_milli, MILLI_PER_GPU + 1)
        return (int(np.argmin(left)),)
    whole = np.flatnonzero(free >= MILLI_PER_GPU)
    return tuple(int(g) for g in whole[: pod.num_gpu])


@dataclass(frozen=True)
class Placement:
    node: int  # -1 when the pod fits nowhere
    gpus: tuple[int, ...] = ()


def place(scheduler: Scheduler, state: ClusterState, pod: Pod,
          rng: np.random.Generator, candidates: np.ndarray | None = None,
          node_rank: np.ndarray | None = None) -> Placement:
    """Filter, score, pick the best node and its GPUs.

    Ties among the best go to a uniformly random node (kube-scheduler's ``selectHost``),
    or, when ``node_rank`` is given, to the best-ranked node: the FGD artefact's
    simulator renames nodes with a seeded random prefix and takes the first best node in
    name order, i.e. a fixed random priority per run.
    """
    feasible = state.feasible(pod)
    if candidates is not None:
        mask = np.zeros_like(feasible)
        mask[candidates] = True
        feasible &= mask
    nodes = np.flatnonzero(feasible)
    if len(nodes) == 0:
        return Placement(-1)
    scores = np.asarray(scheduler.score(state, pod, nodes), dtype=np.float64)
    if scores.shape != nodes.shape:
        raise ValueError(f"{scheduler.name} returned {scores.shape} scores for {len(nodes)} nodes")
    if not np.isfinite(scores).all():
        raise ValueError(f"{scheduler.name} returned non-finite scores")
    best = np.flatnonzero(scores == scores.max())
    if len(best) == 1:
        node = int(nodes[best[0]])
    elif node_rank is not None:
        node = int(nodes[best[np.argmin(node_rank[nodes[best]])]])
    else:
        node = int(nodes[best[rng.integers(len(best))]])
    return Placement(node, scheduler.select_gpus(state, pod, node))
