"""Decision-time search: short look-ahead rollouts of a base scheduler's best candidates.

For each pod the base scheduler (any registered name: FGD, a learned policy, ...) scores the
feasible nodes. Its ``candidates`` best nodes in distinct states are then tried one by one
(nodes of the same capacity, GPU model and free resources have the same future, so the first
stands for them): in a *shadow* copy of the cluster state the pod is placed on the candidate,
``horizon`` pods arrive and the base scheduler places them, and the outcome is valued as

    value = (measured resource given to the arrivals) - (GPU fragmentation added on the nodes
            the rollout touched, the candidate included)

with the measured resource milli-GPU on a cluster with GPUs (milli-CPU otherwise) and
fragmentation by FGD's definition (:mod:`fedsched.common.model.fragmentation`, the typical pods
of the scheduler's training pods). The arriving pods are drawn uniformly, with replacement, from
the pods the scheduler was given to learn from (``SchedulerContext.train_pods``: the same pods
FGD takes its typical pods from; in the benchmarks the statistics part of the split; a serving
agent, ``fedsched serve --search``, gives the pods it was asked to place, :meth:`Lookahead.set_pool`),
which is also how the packing workload's tail draws them. Every
candidate sees the same ``futures`` draws (common random numbers) and ties are broken by one
fixed node priority, so the comparison sees the decision and not the luck of the draw; the
values are averaged over the draws. The best-valued candidate gets the top score; the base's own
first choice keeps it unless another candidate is strictly better. With ``horizon = 0`` the
value is the candidate's own fragmentation change: FGD's rule without its score's rounding.

Registry names: ``lookahead:<base>`` with the default arguments, ``lookahead[key=value,...]:<base>``
with others (:func:`parse_name`, :func:`parse_args`), e.g. ``lookahead[candidates=8,horizon=20]:fgd``.

The shadow state is kept between decisions and brought up to date from the live state's
changed nodes (:meth:`ClusterState.sync_rows`), so the base scheduler's per-node caches stay
warm; rollouts undo their placements. The live state is never written.

Cost: ``candidates x futures x horizon`` base decisions per pod (with FGD and the defaults, one
core: 11 / 21 / 32 ms at the median at 500 / 1,213 / 2,000 nodes, ``bench/inference_latency.py
--search``): meant for slow arrivals (GPU training pods), where a decision may take tens of
milliseconds.

May import: numpy, ``fedsched.common.model`` and the scheduler base; the base scheduler is
built by the caller (the registry) and passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod, PodTable
from fedsched.common.model.fragmentation import FragmentationModel, TypicalPods
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, SchedulerContext, check_int, place

_USE_FIELDS = ("cpu_used", "mem_used", "cpu_measured", "mem_measured")
PREFIX = "lookahead:"  # registry names: "lookahead:<base name>", e.g. "lookahead:fgd"
ARGS_PREFIX = "lookahead["  # ... or with arguments: "lookahead[candidates=8,futures=2]:fgd"


@dataclass(frozen=True)
class LookaheadArgs(SchedulerArgs):
    """The search's arguments."""

    candidates: int = 4
    """how many of the base's best nodes (in distinct states) are tried; in [1, 64]"""
    horizon: int = 10
    """arrivals placed by the base after the candidate, per rollout; in [0, 1000]"""
    futures: int = 1
    """independent draws of the arrivals per candidate (values averaged); in [1, 64]"""
    seed: int = 0
    """seed of the draws of the arrivals and of the node priority that breaks ties; >= 0"""

    def __post_init__(self) -> None:
        check_int(self, "candidates", 1, 64)
        check_int(self, "horizon", 0, 1000)
        check_int(self, "futures", 1, 64)
        check_int(self, "seed", 0)

    def spec(self) -> str:
        """Every argument as ``key=value,...`` (what :func:`parse_args` reads back): the search's
        name in evidence and logs."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def parse_args(text: str) -> LookaheadArgs:
    """The search's arguments from ``key=value,...`` (``candidates``, ``horizon``, ``futures``,
    ``seed``; integers; the others keep their defaults; empty: every default). An item that is not
    ``key=value``, an unknown or repeated key or a value out of range is a ``ValueError`` that
    says which."""
    fields = {f.name for f in dataclasses.fields(LookaheadArgs)}
    values: dict[str, int] = {}
    for item in text.split(",") if text.strip() else []:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in fields:
            raise ValueError(f"{item!r} is not key=value with a key among {', '.join(sorted(fields))}")
        if key in values:
            raise ValueError(f"{key} is given twice")
        try:
            values[key] = int(value.strip())
        except ValueError:
            raise ValueError(f"{key} must be an integer, got {value!r}") from None
    return LookaheadArgs(**values)


def parse_name(name: str) -> tuple[LookaheadArgs, str] | None:
    """``(args, base)`` of a search's registry name, or None when ``name`` names no search.

    ``lookahead:<base>`` runs the search with the default arguments; ``lookahead[key=value,...]:<base>``
    sets some of them (:func:`parse_args`). A malformed name, an unknown key or a value out of range
    is a ``ValueError`` that says which.
    """
    if name.startswith(PREFIX):
        args, base = LookaheadArgs(), name[len(PREFIX):]
    elif name.startswith(ARGS_PREFIX):
        inner, sep, base = name[len(ARGS_PREFIX):].partition("]:")
        if not sep:
            raise ValueError(f"{name!r}: expected {ARGS_PREFIX}key=value,...]:<base>, e.g. "
                             f"{ARGS_PREFIX}candidates=8,futures=2]:fgd")
        try:
            args = parse_args(inner)
        except ValueError as e:
            raise ValueError(f"{name!r}: {e}") from None
    else:
        return None
    if not base or base.startswith((PREFIX, ARGS_PREFIX)):
        raise ValueError(f"{name!r}: the look-ahead needs one base scheduler after its prefix, "
                         f"e.g. {PREFIX}fgd")
    return args, base


class Lookahead(Scheduler):
    """The search over ``make_base()``'s candidates (see the module docstring).

    ``make_base`` is called twice: one base scores the live state, the other places the
    rollouts' arrivals in the shadow state, so that each keeps its caches warm on its own state.
    """

    name = "lookahead"
    Args = LookaheadArgs
    args: LookaheadArgs

    def __init__(self, ctx: SchedulerContext | None, make_base: Callable[[], Scheduler],
                 args: LookaheadArgs | None = None) -> None:
        super().__init__(ctx, args)
        if self.ctx.train_pods is None or len(self.ctx.train_pods) == 0:
            raise ValueError("the look-ahead needs training pods to draw its arrivals from")
        self.base, self.rollout_base = make_base(), make_base()
        self.name = f"{PREFIX}{self.base.name}"
        self.set_pool(self.ctx.train_pods)
        self._priority_of = (-1, np.zeros(0, dtype=np.int64))  # (node count, its priority)
        self._rng = np.random.default_rng(self.args.seed)
        self._shadow: ClusterState | None = None
        self._live_serial = -1
        self._live_version = np.zeros(0, dtype=np.int64)
        self.searched = 0  # decisions with more than one distinct candidate
        self.switched = 0  # ... of which the search moved the pod off the base's first choice

    def set_pool(self, pods: PodTable) -> None:
        """Draw the arrivals from ``pods`` from now on, and value fragmentation by their typical
        pods (a serving agent gives the pods its cluster runs; a ``ValueError`` when empty)."""
        if len(pods) == 0:
            raise ValueError("the look-ahead needs pods to draw its arrivals from")
        self.pool = pods
        self._arrivals: dict[int, Pod] = {}
        self.typical = TypicalPods.from_pods(pods)
        self._frag_models: dict[int, FragmentationModel] = {}

    def reseed(self, key: int) -> None:
        """Draw the next decisions' arrivals from a stream fixed by ``(args.seed, key)``: a serving
        agent keys each decision by its place in the decision stream, so that a ranking computed
        ahead and one computed when asked draw the same arrivals."""
        self._rng = np.random.default_rng([self.args.seed, key])

    # ---- the search --------------------------------------------------------------------------
    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        scores = np.asarray(self.base.score(state, pod, nodes), dtype=np.float64)
        if len(nodes) == 0:
            return scores
        cands = self._candidates(state, nodes, scores)
        pick = cands[0]
        if len(cands) > 1:
            self.searched += 1
            values = self._values(state, pod, [int(nodes[i]) for i in cands])
            best = int(np.argmax(values))
            if values[best] > values[0]:
                pick = cands[best]
                self.switched += 1
        out = scores.copy()
        out[pick] = scores.max() + 1.0  # the one top score: place() takes it whatever its tie-break
        return out

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        return self.base.select_gpus(state, pod, node)

    def _candidates(self, state: ClusterState, nodes: np.ndarray, scores: np.ndarray) -> list[int]:
        """Positions in ``nodes`` of the base's best nodes in distinct states, best first (equal
        scores in the search's node priority)."""
        order = np.lexsort((self._priority(len(state.nodes))[nodes], -scores))
        k = self.args.candidates
        if k == 1:
            return [int(order[0])]
        ids = nodes[order]
        nt = state.nodes
        key = np.column_stack([nt.cpu[ids], nt.mem[ids], nt.model[ids], state.cpu_req[ids],
                               state.mem_req[ids], np.sort(state.gpu_free[ids], axis=1)])
        _, first = np.unique(key, axis=0, return_index=True)
        return [int(order[i]) for i in np.sort(first)[:k]]

    def _values(self, state: ClusterState, pod: Pod, cands: list[int]) -> np.ndarray:
        shadow = self._sync(state)
        draws = [self._rng.integers(len(self.pool), size=self.args.horizon) for _ in range(self.args.futures)]
        gpu_measure = bool(state.nodes.total_gpu_milli)
        values = np.zeros(len(cands))
        for i, c in enumerate(cands):
            gpus = self.base.select_gpus(state, pod, c)
            for draw in draws:
                values[i] += self._rollout(shadow, pod, c, gpus, draw, gpu_measure)
        return values / len(draws)

    def _rollout(self, shadow: ClusterState, pod: Pod, node: int, gpus: tuple[int, ...],
                 draw: np.ndarray, gpu_measure: bool) -> float:
        """The value of placing ``pod`` on ``node`` followed by the arrivals ``draw`` (given
        resource in milli-GPU when ``gpu_measure``, else milli-CPU); undone."""
        touched = [node]
        frag_before = self._frag(shadow, [node])
        given = 0.0
        priority = self._priority(len(shadow.nodes))
        rng = self._rng  # place() breaks ties by ``priority``: the generator is never drawn from
        # Listed before it is bound: allocate() has changed every array when it refuses an
        # over-allocation (a caller's node the pod does not fit), and release() undoes exactly that.
        done = [(node, pod, gpus)]
        try:
            shadow.allocate(node, pod, gpus)
            for j in draw.tolist():
                arrival = self._arrival(j)
                p = place(self.rollout_base, shadow, arrival, rng, node_rank=priority)
                if p.node < 0:
                    continue
                if p.node not in touched:
                    frag_before += self._frag(shadow, [p.node])
                    touched.append(p.node)
                done.append((p.node, arrival, p.gpus))
                shadow.allocate(p.node, arrival, p.gpus)
                given += arrival.gpu_request if gpu_measure else arrival.cpu
            return given - (self._frag(shadow, touched) - frag_before)
        finally:
            for n, q, g in reversed(done):
                shadow.release(n, q, g)

    # ---- helpers -----------------------------------------------------------------------------
    def _arrival(self, j: int) -> Pod:
        pod = self._arrivals.get(j)
        if pod is None:
            pod = self._arrivals[j] = Pod.from_table(self.pool, j)
        return pod

    def _priority(self, n: int) -> np.ndarray:
        """A fixed random priority of the nodes (lower first) that breaks ties among equal scores,
        in the candidates' order and in the rollouts: as the FGD artefact's simulator breaks them
        (a seeded order of names), which packs equal nodes in one order instead of spreading
        pods over them at random (on openb that spreading costs FGD's rollouts several points
        of GPU allocation)."""
        if self._priority_of[0] != n:  # one slot: a cluster's node count changes rarely
            self._priority_of = (n, np.random.default_rng([self.args.seed, n]).permutation(n))
        return self._priority_of[1]

    def _frag(self, state: ClusterState, nodes: list[int]) -> float:
        n_models = len(state.nodes.models)
        fm = self._frag_models.get(n_models)
        if fm is None:
            fm = self._frag_models[n_models] = FragmentationModel(self.typical, n_models)
        ids = np.asarray(nodes, dtype=np.int64)
        return float(fm.node_frag(state.nodes.cpu[ids] - state.cpu_req[ids], state.gpu_free[ids],
                                  state.nodes.model[ids]).sum())

    def _sync(self, state: ClusterState) -> ClusterState:
        """The shadow state, equal to ``state`` now (rebuilt when ``state`` is another object or
        its node table changed; otherwise only the nodes whose version moved are copied)."""
        sh = self._shadow
        if (sh is None or self._live_serial != state.serial or sh.nodes is not state.nodes
                or len(self._live_version) != len(state.version)):
            self._shadow = sh = state.copy()
            self._live_serial, self._live_version = state.serial, state.version.copy()
            return sh
        rows = np.flatnonzero(state.version != self._live_version)
        sh.sync_rows(state, rows)
        self._live_version[rows] = state.version[rows]
        # Measured use moves without a version (a serving agent's telemetry): taken whole.
        for k in _USE_FIELDS:
            np.copyto(getattr(sh, k), getattr(state, k))
        return sh

