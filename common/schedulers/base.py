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

Arguments (modelled on kubernetes-sigs/scheduler-plugins' ``*Args``): every scheduler class
names its typed arguments in :attr:`Scheduler.Args`, a frozen dataclass derived from
:class:`SchedulerArgs` that validates itself in ``__post_init__`` (a ``ValueError`` naming the
field, the value and the allowed range). A scheduler without knobs has an empty ``Args`` of
its own, so ``dataclasses.fields(cls.Args)`` lists the knobs of any scheduler. The
constructor takes ``args=None`` (the defaults) or an instance of exactly that type.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedsched.common.model.cluster import MILLI_PER_GPU, ClusterState, Pod, PodTable


@dataclass
class SchedulerContext:
    """What a scheduler may know before it runs.

    ``train_pods`` is the training part of the workload (FGD's typical pods and any
    learned statistic come from it only); ``rng`` is the run's seeded generator.
    """

    train_pods: PodTable | None = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))


@dataclass(frozen=True)
class SchedulerArgs:
    """Base of every scheduler's typed arguments; empty itself (a scheduler with no knobs).

    Subclasses are frozen dataclasses with one docstring line under each field and check
    their values in ``__post_init__`` with :func:`check_int` / :func:`check_float`.
    """


def _interval(name: str, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    """The allowed range as a chained comparison, e.g. ``0 < target_utilization < 100``."""
    left = "" if lo is None else f"{lo} {'<' if lo_open else '<='} "
    right = "" if hi is None else f" {'<' if hi_open else '<='} {hi}"
    return f"{left}{name}{right}"


def _check(args: SchedulerArgs, name: str, value: Any, lo: float | None, hi: float | None,
           lo_open: bool, hi_open: bool, integer: bool) -> None:
    where = f"{type(args).__name__}.{name} = {value!r}"
    kind = "integers" if integer else "finite numbers"
    allowed = f"allowed: {kind} with {_interval(name, lo, hi, lo_open, hi_open)}"
    typed = not isinstance(value, bool) and (
        isinstance(value, int) if integer
        else isinstance(value, int | float) and math.isfinite(value))
    if not typed:
        raise ValueError(f"{where} is not {'an integer' if integer else 'a finite number'}; {allowed}")
    if not ((lo is None or (value > lo if lo_open else value >= lo))
            and (hi is None or (value < hi if hi_open else value <= hi))):
        raise ValueError(f"{where} is out of range; {allowed}")


def check_int(args: SchedulerArgs, name: str, lo: int | None = None, hi: int | None = None,
              *, lo_open: bool = False, hi_open: bool = False) -> None:
    """Refuse a non-integer or out-of-range ``args.<name>`` (bounds inclusive unless ``*_open``)."""
    _check(args, name, getattr(args, name), lo, hi, lo_open, hi_open, integer=True)


def check_float(args: SchedulerArgs, name: str, lo: float | None = None, hi: float | None = None,
                *, lo_open: bool = False, hi_open: bool = False) -> None:
    """Refuse a non-number, non-finite or out-of-range ``args.<name>``; stores it as a float."""
    _check(args, name, getattr(args, name), lo, hi, lo_open, hi_open, integer=False)
    object.__setattr__(args, name, float(getattr(args, name)))  # frozen: normalised once, at creation


class Scheduler(ABC):
    """Scores candidate nodes for a pod. Subclasses set ``name`` and implement ``score``.

    ``Args`` is the type of the scheduler's arguments (see :class:`SchedulerArgs`);
    ``self.args`` holds the validated instance the scheduler was built with.
    """

    name: str = "abstract"
    Args: ClassVar[type[SchedulerArgs]] = SchedulerArgs

    def __init__(self, ctx: SchedulerContext | None = None, args: SchedulerArgs | None = None) -> None:
        self.ctx = ctx or SchedulerContext()
        self.args = self.check_args(args)

    @classmethod
    def check_args(cls, args: SchedulerArgs | None) -> SchedulerArgs:
        """``args``, or the defaults for None; a ``TypeError`` unless it is exactly ``cls.Args``."""
        if args is None:
            return cls.Args()
        if type(args) is not cls.Args:
            raise TypeError(f"{cls.name} takes {cls.Args.__name__} (or None for the defaults), "
                            f"got {type(args).__name__}: {args!r}")
        return args

    @abstractmethod
    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        """Scores (float, higher is better) for the feasible candidate ``nodes``."""

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        return default_gpu_choice(state, pod, node)


def default_gpu_choice(state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
    """Lowest-indexed free GPUs for whole-GPU pods; best-fit GPU for a sharing pod."""
    if pod.num_gpu == 0:
        return ()
    free = state.gpu_free[node].tolist()  # a handful of slots: Python scalars beat numpy calls
    if pod.is_gpu_share:
        m = pod.gpu_milli
        left = [f - m if f >= m else MILLI_PER_GPU + 1 for f in free]
        return (left.index(min(left)),)  # the first least, as argmin
    return tuple([g for g, f in enumerate(free) if f >= MILLI_PER_GPU][: pod.num_gpu])


@dataclass(frozen=True)
class Placement:
    node: int  # -1 when the pod fits nowhere
    gpus: tuple[int, ...] = ()


class NonFiniteScores(ValueError):
    """A scheduler returned NaN or infinite scores."""


@dataclass(frozen=True)
class Ranking:
    """A scheduler's verdict on one pod: the feasible candidates, their scores, the pick."""

    nodes: np.ndarray  # int64 ids of the feasible candidate nodes
    scores: np.ndarray  # float64, one per node
    best: int  # position in ``nodes`` of the chosen node, -1 when the pod fits nowhere

    @property
    def node(self) -> int:
        return int(self.nodes[self.best]) if self.best >= 0 else -1


def rank(scheduler: Scheduler, state: ClusterState, pod: Pod, rng: np.random.Generator,
         candidates: np.ndarray | None = None, node_rank: np.ndarray | None = None) -> Ranking:
    """Filter, score and pick the best node (see :func:`place`); the extender calls this too.

    With ``candidates`` (node ids) only they are checked (a pass over them, not over the cluster:
    the extender's few hundred candidates of a large cluster). Either way the ranked nodes are the
    feasible ones in node id order.
    """
    if candidates is not None:
        cand = np.sort(candidates)
        if len(cand) > 1 and (cand[1:] == cand[:-1]).any():
            cand = np.unique(cand)  # np.unique's own cost is 15x a sort's at 500 candidates
        nodes = cand[state.feasible(pod, cand)]
    else:
        nodes = np.flatnonzero(state.feasible(pod))
    if len(nodes) == 0:
        return Ranking(nodes, np.zeros(0), -1)
    scores = np.asarray(scheduler.score(state, pod, nodes), dtype=np.float64)
    if scores.shape != nodes.shape:
        raise ValueError(f"{scheduler.name} returned {scores.shape} scores for {len(nodes)} nodes")
    if not np.isfinite(scores).all():
        raise NonFiniteScores(f"{scheduler.name} returned non-finite scores")
    best = np.flatnonzero(scores == scores.max())
    if len(best) == 1:
        pick = int(best[0])
    elif node_rank is not None:
        pick = int(best[np.argmin(node_rank[nodes[best]])])
    else:
        pick = int(best[rng.integers(len(best))])
    return Ranking(nodes, scores, pick)


def place(scheduler: Scheduler, state: ClusterState, pod: Pod,
          rng: np.random.Generator, candidates: np.ndarray | None = None,
          node_rank: np.ndarray | None = None) -> Placement:
    """Filter, score, pick the best node and its GPUs.

    Ties among the best go to a uniformly random node (kube-scheduler's ``selectHost``),
    or, when ``node_rank`` is given, to the best-ranked node: the FGD artefact's
    simulator renames nodes with a seeded random prefix and takes the first best node in
    name order, i.e. a fixed random priority per run.

    Over all nodes (no ``candidates``), a scheduler with a ``top_nodes(state, pod)`` method
    (kube-default) hands over the best feasible nodes itself, ids ascending, exactly those
    :func:`rank` would tie between; the pick among them is the same.
    """
    top_nodes = getattr(scheduler, "top_nodes", None) if candidates is None else None
    if top_nodes is None:
        r = rank(scheduler, state, pod, rng, candidates, node_rank)
        if r.best < 0:
            return Placement(-1)
        return Placement(r.node, scheduler.select_gpus(state, pod, r.node))
    # The scheduler's shortcut: the nodes rank() would tie between, the same draw among them.
    best = top_nodes(state, pod)
    if len(best) == 0:
        return Placement(-1)
    if len(best) == 1:
        node = int(best[0])
    elif node_rank is not None:
        node = int(best[np.argmin(node_rank[best])])
    else:
        node = int(best[rng.integers(len(best))])
    return Placement(node, scheduler.select_gpus(state, pod, node))
