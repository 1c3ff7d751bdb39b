"""Choosing a packing scheduler by simulating the cluster's own pods on its own nodes.

Which packing rule allocates more depends on the inventory and the workload: on the openb GPU
cluster FGD allocates more GPU than kube-default; on an inventory where CPU runs out before the
GPUs and pods are pinned to GPU models, kube-default's spreading can allocate more than FGD's
packing, and on another such inventory FGD wins. No fixed rule is the better of the two
everywhere. ``best-of[<reference>,<name>,...]`` (:class:`BestOf`) decides, for each cluster it is
asked to place pods on, by the packing simulation (:func:`fedsched.common.sim.packing.run_packing`,
the benchmark's own protocol) of the scheduler's pods (``SchedulerContext.train_pods``: the pods it
may learn from) on that cluster's node table, ``BestOfArgs.seeds`` workloads per member, the same
workloads for every member: the first member listed is the reference and stays, unless another
member allocates more *with evidence* (the one-sided 95% lower bound of its mean paired difference
with the reference, Student t over the workloads, above 0: the roll-out gate's test); among those
that do, the one with the highest mean. From then on every decision is the chosen member's.

Why the evidence: two simulated workloads once picked a policy whose mean was 0.05 points above
kube-default's; six workloads put it 0.4 below, and on the test pods it allocated 0.9 less.

The simulations start from an empty cluster with the live node table: the choice is about the
inventory and the workload, not the moment. They run once per node table (a changed table, a
node added or removed, is simulated again) and cost ``members x seeds`` packing runs; a process
keeps the figures of its last :data:`KEPT_CHOICES` (node table, pool, members, seeds), by content,
so an evaluation's runs of one cluster (one per seed, each with its own scheduler) simulate once.

Registry names: ``best-of[kube-default,learned,fgd]`` (4 workloads each; ``learned`` in a packing
evaluation),
``best-of[kube-default,learned;seeds=6]``; any registry name is a member, and
``lookahead:best-of[...]`` searches over the choice.

May import: ``fedsched.common.model``, ``fedsched.common.schedulers`` and this package's packing
simulator and paired statistics.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsched.common.model.cluster import ClusterState, NodeTable, Pod, PodTable
from fedsched.common.schedulers import Scheduler, SchedulerArgs, SchedulerContext, make_scheduler, split_names
from fedsched.common.schedulers.base import check_int
from fedsched.common.sim.packing import run_packing
from fedsched.common.sim.paired import one_sided_bounds

PREFIX = "best-of["
SIM_TARGET_LOAD = 1.3  # the simulated workload: the packing protocol's 130% of capacity arrived
MAX_MEMBERS = 8
KEPT_CHOICES = 8  # (node table, pool, members, seeds) whose simulated figures a process keeps


@dataclass(frozen=True)
class BestOfArgs(SchedulerArgs):
    """The choice's arguments."""

    seeds: int = 4
    """simulated workloads per member (the same ones for every member); in [2, 16]"""

    def __post_init__(self) -> None:
        check_int(self, "seeds", 2, 16)


def parse_name(name: str) -> tuple[list[str], BestOfArgs] | None:
    """``(members, args)`` of ``best-of[a,b,...]`` or ``best-of[a,b,...;seeds=N]``; None for other
    names. Fewer than two members, more than :data:`MAX_MEMBERS`, a repeated member, a member that
    is itself a choice or an unknown argument is a ``ValueError`` that says which."""
    if not name.startswith(PREFIX):
        return None
    if not name.endswith("]"):
        raise ValueError(f"{name!r}: expected {PREFIX}<name>,<name>,...] e.g. {PREFIX}fgd,kube-default]")
    inner = name[len(PREFIX):-1]
    names, _, opts = inner.partition(";")
    members = split_names(names)
    if len(members) < 2:
        raise ValueError(f"{name!r}: the choice needs at least two scheduler names")
    if len(members) > MAX_MEMBERS:
        raise ValueError(f"{name!r}: at most {MAX_MEMBERS} members, got {len(members)}")
    if len(set(members)) != len(members):
        raise ValueError(f"{name!r}: a member is named twice")
    if any(PREFIX in m for m in members):
        raise ValueError(f"{name!r}: a member may not be a choice itself")
    values: dict[str, int] = {}
    for item in opts.split(",") if opts.strip() else []:
        key, eq, value = (x.strip() for x in item.partition("="))
        if key != "seeds" or not eq or key in values:
            raise ValueError(f"{name!r}: {item!r} is not seeds=N (once)")
        try:
            values[key] = int(value)
        except ValueError:
            raise ValueError(f"{name!r}: seeds must be an integer, got {value!r}") from None
    try:
        return members, BestOfArgs(**values)
    except ValueError as e:
        raise ValueError(f"{name!r}: {e}") from None


def simulated_allocations(nodes: NodeTable, pool: PodTable, make: Callable[[SchedulerContext], Scheduler],
                          seeds: int) -> list[float]:
    """The allocation (% of the measured resource) a scheduler reaches in the packing protocol's
    runs (130% arrived, :func:`run_packing`) with pods drawn from ``pool`` on ``nodes``, one per
    workload seed ``0 .. seeds-1``; ``make`` builds a fresh scheduler per run (a live scheduler's
    caches belong to its live state)."""
    allocs = []
    for s in range(seeds):
        sched = make(SchedulerContext(train_pods=pool, rng=np.random.default_rng(s)))
        res = run_packing(nodes, pool, sched, target_load=SIM_TARGET_LOAD, seed=s)
        allocs.append(float(res.alloc_pct[-1]) if len(res.alloc_pct) else 0.0)
    return allocs


def proven_better(candidate: list[float], reference: list[float]) -> tuple[bool, float]:
    """(whether ``candidate`` allocates more than ``reference`` with evidence, the one-sided 95%
    lower bound of their mean paired difference): the same workloads, in the same order."""
    _, lower, _, _ = one_sided_bounds([a - b for a, b in zip(candidate, reference, strict=True)])
    return bool(lower > 0), lower


def best_proven(runs: Mapping[str, Sequence[float]], reference: Sequence[float],
                incumbent: str | None = None) -> str | None:
    """The choice's rule, shared with the serving packing check: of the candidates in ``runs``
    (name -> allocation per workload, the reference's workloads in the same order) that allocate
    more than ``reference`` with evidence (:func:`proven_better`), the one with the highest mean
    (the first listed among equal means); None where none does. An ``incumbent`` (what served
    before: the serving check chooses again as its evidence grows) that is still proven stays
    unless the best is proven to allocate more than it: candidates a few hundredths apart would
    otherwise take turns as each simulation's noise falls."""
    ref = list(reference)
    proven = [n for n, r in runs.items() if proven_better(list(r), ref)[0]]
    best = max(proven, key=lambda n: float(np.mean(runs[n])), default=None)
    if best is None or incumbent is None or incumbent not in proven or best == incumbent:
        return best
    return best if proven_better(list(runs[best]), list(runs[incumbent]))[0] else incumbent


def content_digest(table: Any) -> str:
    """A digest of a node or pod table's content (every field, arrays by dtype, shape and bytes):
    equal tables built apart, e.g. in each run of an evaluation, have equal digests."""
    h = hashlib.sha256()
    for f in dataclasses.fields(table):
        v = getattr(table, f.name)
        h.update(f.name.encode())
        if isinstance(v, np.ndarray):
            h.update(f"{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


_simulated: OrderedDict[tuple[str, str, tuple[str, ...], int], dict[str, list[float]]] = OrderedDict()
_simulated_lock = threading.Lock()


def forget_simulations() -> None:
    """Drop the figures this process keeps (members are kept by name: a checkpoint file replaced
    under the same name is simulated again only after this)."""
    with _simulated_lock:
        _simulated.clear()


class BestOf(Scheduler):
    """Every decision by the member the packing simulation of the pods on this cluster chooses (see
    the module docstring); ``chosen`` names it once a cluster has been seen, ``simulated`` holds each
    member's mean simulated allocation (%) and ``per_seed`` its allocation per workload."""

    name = "best-of"
    Args = BestOfArgs
    args: BestOfArgs

    def __init__(self, ctx: SchedulerContext | None, members: list[str],
                 args: BestOfArgs | None = None) -> None:
        super().__init__(ctx, args)
        if self.ctx.train_pods is None or len(self.ctx.train_pods) == 0:
            raise ValueError("best-of needs the pods it may learn from to simulate its members")
        self.members = list(members)
        self.schedulers = [make_scheduler(m, self.ctx) for m in self.members]  # unknown names fail here
        self._table: NodeTable | None = None
        self._pick = 0
        self.simulated: dict[str, float] = {}
        self.per_seed: dict[str, list[float]] = {}

    @property
    def chosen(self) -> str | None:
        return self.members[self._pick] if self._table is not None else None

    def _choose(self, nodes: NodeTable) -> Scheduler:
        if nodes is not self._table:
            pool = self.ctx.train_pods
            assert pool is not None
            key = (content_digest(nodes), content_digest(pool), tuple(self.members), self.args.seeds)
            with _simulated_lock:
                known = _simulated.get(key)
            if known is None:
                known = {m: simulated_allocations(nodes, pool, lambda ctx, m=m: make_scheduler(m, ctx),
                                                  self.args.seeds) for m in self.members}
                with _simulated_lock:
                    _simulated[key] = known
                    while len(_simulated) > KEPT_CHOICES:
                        _simulated.popitem(last=False)
            self.per_seed = {m: list(v) for m, v in known.items()}
            self.simulated = {m: float(np.mean(v)) for m, v in self.per_seed.items()}
            reference, *others = self.members
            pick = best_proven({m: self.per_seed[m] for m in others}, self.per_seed[reference])
            self._pick = self.members.index(pick) if pick is not None else 0
            self._table = nodes
        return self.schedulers[self._pick]

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return self._choose(state.nodes).score(state, pod, nodes)

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        return self._choose(state.nodes).select_gpus(state, pod, node)
