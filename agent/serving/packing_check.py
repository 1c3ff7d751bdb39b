"""The packing check (``fedsched serve --packing-check``): the policy is served actively only where
a simulation of this cluster says it packs more than the scheduler it replaces.

Which packing rule allocates more depends on the inventory and the workload: on the openb GPU
cluster the learned packing policy and FGD allocate more GPU than kube-default, but on inventories
where CPU runs out before the GPUs kube-default's spreading can allocate several points more than
both. The check replays the pods this agent was asked to place (its
:class:`~fedsched.agent.serving.arrivals.ArrivalPool`) on this cluster's node table in the
packing benchmark's own simulation (:func:`fedsched.common.sim.portfolio.simulated_allocations`:
arrivals until 130% of the measured resource, ``seeds`` workloads), with the served model and with
``against`` (kube-default: what the agent answers in shadow mode) on the same workloads. The model
stays active only when it allocates more with evidence (the one-sided 95% lower bound of the mean
paired difference above 0, :func:`~fedsched.common.sim.portfolio.proven_better`: the roll-out
gate's test); otherwise, and until that evidence exists, the decider serves in shadow mode (default
scores, the policy logged). It is the choice ``best-of[<against>,<model>,...]`` makes in the benchmark.
With the decision-time search on (``fedsched serve --search``, ``search`` here) what serves as the
policy is the search over the model, and that is what is simulated: the same arguments, its
arrivals drawn from each workload's pods (as the serving search draws them from the pods asked
for). The search places pods the model alone would not, and on an inventory where CPU runs out
first it can allocate less than the model's base; the cost is the search's, tens of times the
model's (``bench/packing_check_cost.py``).

Alternatives (``fedsched serve --packing-alternatives``, FGD by default): baselines simulated
beside the model on the same workloads. Of the candidates allowed to serve (the model where the
roll-out gate admits it, an alternative where the gate admits it by its own evidence), those that
allocate more than ``against`` with evidence compete on their means, and the highest serves
(:meth:`PackingVerdict.choose`); none proven is shadow. When the model is checked again, what its
last verdict chose (the incumbent; at its first check, the alternative carried over to it, below)
keeps serving unless the highest is proven to allocate more than it: on openb's default workload
the model and FGD simulate a few hundredths apart, and each re-check would otherwise hand the
cluster to whichever its sample favoured. An alternative that serves breaks ties as
the simulation does, by a fixed node order (the decider's ``_tie_order``). FGD serves where it
packs this cluster's pods best (on openb's CPU-heavy workload it allocates about two points more
GPU than the shipped model), but never where its own replay evidence shows it harming a guardrail.
``fedsched serve`` turns it on by default (``--packing-check auto``) for a model the roll-out gate
admits on a packing objective (``--gate-objective gpu-alloc`` or ``gpu-frag``): the gate's evidence
comes from the benchmark's inventories, and on an inventory where CPU runs out before the GPUs the
shipped packing policy allocates several points less than kube-default.

The simulations run on a thread of their own, in a spawned process that loads the model's file (a
model without one, in the thread itself): no request waits for them, nor for the interpreter lock
they would hold. A verdict holds for its
model version and node table; a new model or a changed node table (a node added or removed) is
simulated again once the pool holds ``min_pool`` pods, one simulation at a time, and a changed
table at most every ``min_interval_s`` after the last simulation ended (a cluster whose nodes come
and go every minute would otherwise keep a core busy simulating). The first ``min_pool`` pods can
mislead (their sample is part of the uncertainty the workloads' paired test does not see: on a
CPU-bound inventory 256 pods once showed the model 2 points ahead where the whole workload had it
behind), so a model is checked again each time the pool has doubled since its verdict, until the
pool is full (256, 512, ..., 4,096 pods: at most five simulations per model and table). Until a
model's first verdict it has no evidence: shadow, or where the latest verdict of an earlier model
proved an alternative (FGD, say), the alternatives that verdict proves choose among themselves until
the new model's verdict (:meth:`PackingCheck.carried`; their evidence does not depend on the model). While a
model is checked again, or a changed table is simulated, its last verdict stands.
A simulation that fails is logged, gives no evidence and is not retried for that model and table.
A model whose file holds another model by the time the child loads it (a newer file whose reload
was refused) is simulated in the thread instead.

May import: ``fedsched.common``, the serving model store and the arrival pool.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.process
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from fedsched.agent.serving.arrivals import ArrivalPool
from fedsched.agent.serving.model_store import LoadedModel, load_model
from fedsched.common.compute import background_worker
from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.schedulers import (
    BASELINES,
    Lookahead,
    LookaheadArgs,
    Scheduler,
    SchedulerContext,
    make_scheduler,
)
from fedsched.common.sim.portfolio import best_proven, proven_better, simulated_allocations

log = logging.getLogger("fedsched.serve")

POLICY = "policy"  # the served model among the check's candidates
MIN_POOL = 256  # pods asked for before the first simulation
SEEDS = 4  # simulated workloads per scheduler
MIN_INTERVAL_S = 600.0  # a changed node table is simulated again at most this often (autoscaling churn)
KEPT = 8  # model versions whose verdicts are kept (a federation reloads a new one every round)


@dataclass(frozen=True)
class PackingVerdict:
    """One check of a model on a node table: the simulated allocation (%) of the model, of the
    scheduler it replaces and of each alternative per workload, and whether the model is served
    actively (the choice among every candidate: :meth:`choose`)."""

    model_version: str
    policy_runs: tuple[float, ...]
    against_runs: tuple[float, ...]
    pods: int
    nodes: int
    active: bool  # the policy allocates more with evidence (proven_better) and the most of those that do
    lower: float  # the one-sided 95% lower bound of the mean paired difference policy - against
    # (name, its allocation per workload) of each alternative (PackingCheck.alternatives)
    alternative_runs: tuple[tuple[str, tuple[float, ...]], ...] = ()
    pool: PodTable | None = field(default=None, compare=False, repr=False)  # the pods simulated
    # what served since the model's previous verdict (its choice among the candidates allowed to
    # serve; at the first verdict, the alternative carried over from an earlier model's; None: none):
    # a challenger replaces it only where proven to allocate more than it (best_proven)
    incumbent: str | None = None
    # the search the model was simulated through (LookaheadArgs.spec; "": the model alone)
    search: str = ""
    # choose()'s answers by eligible set: the decider asks on every decision, and each answer runs
    # paired tests (about a millisecond); a verdict never changes, so neither do they
    _choices: dict[tuple[str, ...], str | None] = field(default_factory=dict, init=False, compare=False,
                                                         repr=False)

    @property
    def policy(self) -> float:
        return sum(self.policy_runs) / len(self.policy_runs)

    @property
    def against(self) -> float:
        return sum(self.against_runs) / len(self.against_runs)

    def figures(self) -> dict[str, float]:
        """Each candidate's mean simulated allocation: ``policy``, each alternative's name."""
        return {POLICY: self.policy, **{n: sum(r) / len(r) for n, r in self.alternative_runs}}

    def choose(self, eligible: Collection[str]) -> str | None:
        """What serves among ``eligible`` candidates (:data:`POLICY`, alternatives' names): of those
        that allocate more than the scheduler they replace with evidence, the highest mean (the
        benchmark's ``best-of[<against>,...]``), the incumbent kept unless that one is proven to
        allocate more than it; None where none does (shadow)."""
        key = tuple(eligible)
        if key not in self._choices:
            runs = {POLICY: self.policy_runs, **dict(self.alternative_runs)}
            incumbent = self.incumbent if self.incumbent in eligible else None
            self._choices[key] = best_proven({n: r for n, r in runs.items() if n in eligible},
                                             self.against_runs, incumbent)
        return self._choices[key]

    def reason(self, against: str) -> str:
        alts = "".join(f", {n} {v:.2f}%" for n, v in self.figures().items() if n != POLICY)
        return (f"packing simulation of {self.pods} pods asked for on this cluster's {self.nodes} nodes, "
                f"{len(self.policy_runs)} workloads: the policy"
                + (f" (through the search {self.search})" if self.search else "")
                + f" allocates {self.policy:.2f}%, {against} "
                f"{self.against:.2f}%{alts} (one-sided 95% lower bound of the policy's difference "
                f"{self.lower:+.2f})"
                + (f"; {self.incumbent} served before this check" if self.incumbent is not None else ""))


class PackingCheck:
    """See the module doc. ``on_verdict`` is called (on the check's thread) with each new verdict;
    ``eligible(model)`` names the candidates allowed to serve with ``model`` (the decider's roll-out
    gate; default: every one), so that the incumbent a verdict keeps is what actually served."""

    def __init__(self, arrivals: ArrivalPool, against: str = "kube-default", seeds: int = SEEDS,
                 min_pool: int = MIN_POOL, min_interval_s: float = MIN_INTERVAL_S,
                 on_verdict: Callable[[PackingVerdict], None] | None = None,
                 alternatives: Sequence[str] = (),
                 eligible: Callable[[LoadedModel], Collection[str]] | None = None,
                 search: LookaheadArgs | None = None) -> None:
        if against not in BASELINES:
            raise ValueError(f"the packing check compares with a baseline ({', '.join(sorted(BASELINES))}), "
                             f"got {against!r}")
        self.alternatives = check_alternatives(alternatives, against)
        if not 2 <= seeds <= 16 or min_pool < 1:
            raise ValueError(f"the packing check needs 2 <= seeds <= 16 and min_pool >= 1, "
                             f"got {seeds} and {min_pool}")
        self.arrivals, self.against, self.seeds, self.min_pool = arrivals, against, seeds, min_pool
        self.min_interval_s = min_interval_s
        self.on_verdict = on_verdict
        self.eligible = eligible
        self.search = search  # the model is served through this search: simulated through it too
        self._ended = -math.inf  # time.monotonic() when the last simulation ended
        self._lock = threading.Lock()
        # model version -> (node table simulated, its verdict or None when the simulation failed)
        self._done: dict[str, tuple[NodeTable, PackingVerdict | None]] = {}
        self._thread: threading.Thread | None = None
        self._child: multiprocessing.process.BaseProcess | None = None
        self.use_child = True  # False: simulate in the thread (bench/packing_check_latency.py compares)
        # False: each verdict chooses afresh (bench/served_search_packing.py --no-incumbent compares)
        self.keep_incumbent = True

    def verdict(self, model: LoadedModel, nodes: NodeTable) -> PackingVerdict | None:
        """The model's verdict on ``nodes`` (its last one while ``nodes`` is being simulated; None
        before its first); starts the simulation when it is due: a new model or node table, or a
        pool twice the size of the last verdict's. Cheap: called per decision."""
        with self._lock:
            done = self._done.get(model.version)
            last = done[1] if done is not None else None
            same_table = done is not None and done[0] is nodes
            if same_table and (last is None or len(self.arrivals) < 2 * last.pods):
                return last
            if self.running or model.make_scheduler is None:
                return last
            if len(self.arrivals) < self.min_pool:
                return last
            if done is not None and not same_table and time.monotonic() - self._ended < self.min_interval_s:
                return last
            pool = self.arrivals.pool()
            if pool is None:
                return last
            self._thread = threading.Thread(target=self._simulate, args=(model, nodes, pool),
                                            name="fedsched-packing-check", daemon=True)
            self._thread.start()
            return last

    def carried(self, model: LoadedModel) -> PackingVerdict | None:
        """While ``model``'s first simulation is due or under way: the latest verdict of an earlier
        model (None otherwise, and where there is none). Its alternatives' evidence does not depend
        on the model, so an alternative it chose may keep serving meanwhile (a federation reloads
        a model every round); the earlier model's own evidence says nothing of this one, so the
        caller leaves :data:`POLICY` out of the candidates. A model whose simulation failed, or
        that cannot be simulated, gets nothing carried: that would serve an alternative on
        evidence never checked again."""
        with self._lock:
            if model.version in self._done or model.make_scheduler is None:
                return None
            for _, v in reversed(self._done.values()):
                if v is not None:
                    return v
        return None

    @property
    def running(self) -> bool:
        """A simulation is under way."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Until the running simulation (if any) is over."""
        t = self._thread
        if t is not None:
            t.join(timeout)

    def close(self) -> None:
        """Stop a simulation running in a child process (the thread waiting for it then ends)."""
        child = self._child
        if child is not None and child.is_alive():
            child.terminate()

    def _simulate(self, model: LoadedModel, nodes: NodeTable, pool: PodTable) -> None:
        try:
            if self.use_child and model.path and Path(model.path).is_file():
                runs = self._in_child(model, nodes, pool)
                if runs is None:  # the file is another model now (a refused reload keeps this one
                    # served): the model in memory is the only copy left
                    log.info("packing check: model %s's file changed before its simulation; simulating "
                             "it in the agent's own thread", model.version)
                    runs = _simulate(model, self.against, self.alternatives, nodes, pool, self.seeds,
                                     self.search)
            else:
                runs = _simulate(model, self.against, self.alternatives, nodes, pool, self.seeds, self.search)
            policy, against, alternatives = runs
        except Exception:
            log.exception("packing check: the simulation of model %s failed; served in shadow mode (no "
                          "evidence)", model.version)
            self._keep(model.version, (nodes, None))
            return
        lower = proven_better(policy, against)[1]
        alt_runs = tuple((n, tuple(r)) for n, r in zip(self.alternatives, alternatives, strict=True))
        candidates = (POLICY, *self.alternatives)
        allowed = candidates if self.eligible is None else tuple(self.eligible(model))
        with self._lock:
            previous = self._done.get(model.version, (None, None))[1]
        incumbent = None  # what served since the last verdict
        if self.keep_incumbent and previous is not None:
            incumbent = previous.choose(allowed)
        elif self.keep_incumbent and (carried := self.carried(model)) is not None:
            incumbent = carried.choose(tuple(a for a in allowed if a != POLICY))
        v = PackingVerdict(model.version, tuple(policy), tuple(against), len(pool), len(nodes), False, lower,
                           alt_runs, pool, incumbent, self.search.spec() if self.search else "")
        choice = v.choose(candidates)
        v = dataclasses.replace(v, active=choice == POLICY)
        self._keep(model.version, (nodes, v))
        (log.info if choice is not None else log.warning)(
            "packing check: model %s: %s: %s", model.version,
            "the model stays active" if choice == POLICY else f"{choice} serves" if choice else
            "served in shadow mode", v.reason(self.against))
        if self.on_verdict is not None:
            self.on_verdict(v)

    def _in_child(self, model: LoadedModel, nodes: NodeTable, pool: PodTable) -> Runs | None:
        """The simulation in a spawned process that loads the model's file itself, at the lowest CPU
        priority with one BLAS thread (:func:`~fedsched.common.compute.background_worker`): a thread
        of this process would hold the interpreter lock for up to its switch interval (5 ms) at a
        time, and the requests beside it would wait for it (``bench/packing_check_latency.py``)."""
        ctx = multiprocessing.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        args = (send, model.path, model.version, self.against, self.alternatives, nodes, pool, self.seeds,
                self.search)
        child = ctx.Process(target=_child_main, args=args, name="fedsched-packing-check", daemon=True)
        child.start()
        self._child = child
        send.close()
        try:
            answer = receive.recv()  # EOFError when the child dies without answering
        finally:
            receive.close()
            child.join()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _keep(self, version: str, done: tuple[NodeTable, PackingVerdict | None]) -> None:
        with self._lock:
            self._ended = time.monotonic()
            self._done.pop(version, None)
            self._done[version] = done
            while len(self._done) > KEPT:
                self._done.pop(next(iter(self._done)))


def check_alternatives(alternatives: Sequence[str], against: str) -> tuple[str, ...]:
    """The alternatives as a tuple: baselines, each once, none of them ``against``."""
    alts = tuple(alternatives)
    bad = [a for a in alts if a not in BASELINES]
    if bad:
        raise ValueError(f"the packing check's alternatives are baselines ({', '.join(sorted(BASELINES))}), "
                         f"got {', '.join(map(repr, bad))}")
    if len(set(alts)) != len(alts) or against in alts:
        raise ValueError(f"the packing check's alternatives must differ from each other and from "
                         f"{against!r}, got {', '.join(alts)}")
    return alts


Runs = tuple[list[float], list[float], list[list[float]]]
"""(the model's, ``against``'s, each alternative's) allocation per simulated workload."""


def _simulate(model: LoadedModel, against: str, alternatives: Sequence[str], nodes: NodeTable, pool: PodTable,
              seeds: int, search: LookaheadArgs | None = None) -> Runs:
    make = model.make_scheduler
    assert make is not None

    def served(ctx: SchedulerContext) -> Scheduler:
        """What serves as the policy: the model, or the search over it (its arrivals drawn from the
        workload's pods, as the serving search draws them from the pods asked for)."""
        return make() if search is None else Lookahead(ctx, make, search)

    return (simulated_allocations(nodes, pool, served, seeds),
            simulated_allocations(nodes, pool, lambda ctx: make_scheduler(against, ctx), seeds),
            [simulated_allocations(nodes, pool, lambda ctx, a=a: make_scheduler(a, ctx), seeds)
             for a in alternatives])


def _child_main(send: Connection, path: str, version: str, against: str, alternatives: tuple[str, ...],
                nodes: NodeTable, pool: PodTable, seeds: int, search: LookaheadArgs | None = None) -> None:
    """A spawned process's work: load the model file, simulate, send the figures (None when the
    file is no longer ``version``; the exception when something fails)."""
    background_worker()  # one BLAS thread, the lowest CPU priority, killed with the agent
    try:
        model = load_model(Path(path))
        send.send(None if model.version != version
                  else _simulate(model, against, alternatives, nodes, pool, seeds, search))
    except Exception as e:  # sent, so the parent logs it as its own
        send.send(e)
    finally:
        send.close()
