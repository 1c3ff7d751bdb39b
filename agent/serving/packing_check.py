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
scores, the policy logged). It is the choice ``best-of[<against>,<model>]`` makes in the benchmark.
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
model's first verdict it has no evidence (shadow); while it is checked again, or a changed table
is simulated, its last verdict stands.
A simulation that fails is logged, gives no evidence and is not retried for that model and table.
A model whose file holds another model by the time the child loads it (a newer file whose reload
was refused) is simulated in the thread instead.

May import: ``fedsched.common``, the serving model store and the arrival pool.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.process
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from fedsched.agent.serving.arrivals import ArrivalPool
from fedsched.agent.serving.model_store import LoadedModel, load_model
from fedsched.common.compute import background_worker
from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.schedulers import BASELINES, make_scheduler
from fedsched.common.sim.portfolio import proven_better, simulated_allocations

log = logging.getLogger("fedsched.serve")

MIN_POOL = 256  # pods asked for before the first simulation
SEEDS = 4  # simulated workloads per scheduler
MIN_INTERVAL_S = 600.0  # a changed node table is simulated again at most this often (autoscaling churn)
KEPT = 8  # model versions whose verdicts are kept (a federation reloads a new one every round)


@dataclass(frozen=True)
class PackingVerdict:
    """One check of a model on a node table: the simulated allocation (%) of the model and of the
    scheduler it replaces per workload, and whether the model is served actively."""

    model_version: str
    policy_runs: tuple[float, ...]
    against_runs: tuple[float, ...]
    pods: int
    nodes: int
    active: bool  # the policy allocates more with evidence (proven_better)
    lower: float  # the one-sided 95% lower bound of the mean paired difference policy - against

    @property
    def policy(self) -> float:
        return sum(self.policy_runs) / len(self.policy_runs)

    @property
    def against(self) -> float:
        return sum(self.against_runs) / len(self.against_runs)

    def reason(self, against: str) -> str:
        return (f"packing simulation of {self.pods} pods asked for on this cluster's {self.nodes} nodes, "
                f"{len(self.policy_runs)} workloads: the policy allocates {self.policy:.2f}%, {against} "
                f"{self.against:.2f}% (one-sided 95% lower bound of the difference {self.lower:+.2f})")


class PackingCheck:
    """See the module doc. ``on_verdict`` is called (on the check's thread) with each new verdict."""

    def __init__(self, arrivals: ArrivalPool, against: str = "kube-default", seeds: int = SEEDS,
                 min_pool: int = MIN_POOL, min_interval_s: float = MIN_INTERVAL_S,
                 on_verdict: Callable[[PackingVerdict], None] | None = None) -> None:
        if against not in BASELINES:
            raise ValueError(f"the packing check compares with a baseline ({', '.join(sorted(BASELINES))}), "
                             f"got {against!r}")
        if not 2 <= seeds <= 16 or min_pool < 1:
            raise ValueError(f"the packing check needs 2 <= seeds <= 16 and min_pool >= 1, "
                             f"got {seeds} and {min_pool}")
        self.arrivals, self.against, self.seeds, self.min_pool = arrivals, against, seeds, min_pool
        self.min_interval_s = min_interval_s
        self.on_verdict = on_verdict
        self._ended = -math.inf  # time.monotonic() when the last simulation ended
        self._lock = threading.Lock()
        # model version -> (node table simulated, its verdict or None when the simulation failed)
        self._done: dict[str, tuple[NodeTable, PackingVerdict | None]] = {}
        self._thread: threading.Thread | None = None
        self._child: multiprocessing.process.BaseProcess | None = None
        self.use_child = True  # False: simulate in the thread (bench/packing_check_latency.py compares)

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
                    runs = _simulate(model, self.against, nodes, pool, self.seeds)
            else:
                runs = _simulate(model, self.against, nodes, pool, self.seeds)
            policy, against = runs
        except Exception:
            log.exception("packing check: the simulation of model %s failed; served in shadow mode (no "
                          "evidence)", model.version)
            self._keep(model.version, (nodes, None))
            return
        active, lower = proven_better(policy, against)
        v = PackingVerdict(model.version, tuple(policy), tuple(against), len(pool), len(nodes), active, lower)
        self._keep(model.version, (nodes, v))
        (log.info if v.active else log.warning)(
            "packing check: model %s %s: %s", model.version,
            "stays active" if v.active else "served in shadow mode", v.reason(self.against))
        if self.on_verdict is not None:
            self.on_verdict(v)

    def _in_child(self, model: LoadedModel, nodes: NodeTable, pool: PodTable
                  ) -> tuple[list[float], list[float]] | None:
        """The simulation in a spawned process that loads the model's file itself, at the lowest CPU
        priority with one BLAS thread (:func:`~fedsched.common.compute.background_worker`): a thread
        of this process would hold the interpreter lock for up to its switch interval (5 ms) at a
        time, and the requests beside it would wait for it (``bench/packing_check_latency.py``)."""
        ctx = multiprocessing.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        args = (send, model.path, model.version, self.against, nodes, pool, self.seeds)
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


def _simulate(model: LoadedModel, against: str, nodes: NodeTable, pool: PodTable,
              seeds: int) -> tuple[list[float], list[float]]:
    """(the model's, ``against``'s) allocation per simulated workload."""
    make = model.make_scheduler
    assert make is not None
    return (simulated_allocations(nodes, pool, lambda _ctx: make(), seeds),
            simulated_allocations(nodes, pool, lambda ctx: make_scheduler(against, ctx), seeds))


def _child_main(send: Connection, path: str, version: str, against: str, nodes: NodeTable, pool: PodTable,
                seeds: int) -> None:
    """A spawned process's work: load the model file, simulate, send the figures (None when the
    file is no longer ``version``; the exception when something fails)."""
    background_worker()  # one BLAS thread, the lowest CPU priority, killed with the agent
    try:
        model = load_model(Path(path))
        send.send(None if model.version != version else _simulate(model, against, nodes, pool, seeds))
    except Exception as e:  # sent, so the parent logs it as its own
        send.send(e)
    finally:
        send.close()
