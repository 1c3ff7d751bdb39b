"""The oracle: a reference point that reads the replay simulator's hidden usage parameters.

Not a baseline and not registered in :data:`fedsched.common.schedulers.BASELINES` or
``REFERENCES`` (it cheats); the evaluation harness accepts it by the name :data:`ORACLE` in
replay mode only (:func:`fedsched.common.sim.evaluate.make_policy`), and
:func:`~fedsched.common.sim.replay.simulator.run_replay` attaches the simulator to it. Its
figures say roughly how far a scheduler that predicted use perfectly could get with one greedy
choice per pod: the room a learned policy has over the heuristics (not a strict bound: it is
greedy and does not know the future).

**What it knows that no real scheduler does.** Through
:meth:`ReplaySimulator.expected_use` and :meth:`ReplaySimulator.expected_node_use` it reads,
at every decision,

- the incoming pod's *true mean use* (CPU and memory), drawn by the usage model when the
  simulator was built, whereas a real scheduler sees only the pod's requests (and at best
  the history of its application);
- each node's *true current expected load*: the sum of those means over every pod bound to
  the node, including pods still starting that no measurement has seen yet, and free of
  the noise and the cycle a measurement of real use carries;
- the workload's true mean CPU use per requested CPU over every pod of the run (future pods
  included): one number, which a real scheduler could only estimate from history.

It does not know which pods arrive next or when, how long a pod runs, or the noise to come,
and it does not model the cycle (it scores means).

**Score** (higher is better; ``place`` takes the best feasible node). For candidate node
``n`` with expected load ``E_cpu[n]``, ``E_mem[n]``, capacities ``C_cpu[n]``, ``C_mem[n]``,
free CPU requests after the placement ``F_cpu[n] = max(C_cpu[n] - req_cpu[n] - pod_cpu, 0)``,
and the pod's means ``e_cpu``, ``e_mem``::

    cpu_risk  = (E_cpu[n] + e_cpu + fill * L_cpu * F_cpu[n]) / C_cpu[n]
    mem_after = (E_mem[n] + e_mem) / C_mem[n]
    score     = -cpu_risk                              if mem_after <= mem_guard
              = -GUARD_OFFSET - mem_after              otherwise

``L_cpu`` is the workload's true mean CPU use per requested CPU (the sum of every replayed
pod's hidden mean over the sum of their requests, read once at attach time). With ``fill``
0 the risk is the expected CPU use after the placement (water-filling the expected load);
with ``fill`` 1 it is the expected use the node will have once the rest of its free requests
are taken by average pods. The projection matters at high requested load: requests decide
where pods *can* go, and a greedy choice by current expected use alone fills the requests of
low-use nodes first, leaving later pods only the nodes that are already busy (on the quick
web scenario of ``bench/online_quality.py``, 3 seeds, hot CPU node-seconds: ``fill`` 0 5.4k,
0.5 4.2k, kube-default 15.7k). Memory is a guard against OOM kills: a node whose
expected memory after the placement would exceed ``mem_guard`` (default: the simulator's
``overload_threshold``, the hot-memory threshold, leaving the headroom the memory cycle and
noise need) ranks below every node that keeps it, and among such nodes the least expected
memory wins. Ties go to ``place``'s random tie-break. GPUs are chosen as every scheduler's
default (``select_gpus``).

**Limits.** It is greedy (one pod at a time, no look-ahead), it scores means (not the
daily cycle, which is shared by a QoS class, nor the noise), and it counts a best-effort
pod's mean CPU in full although the usage model squeezes best-effort use into the CPU its
node leaves idle. On the best-effort-heavy gpu and edge scenarios of the benchmark it does
not beat kube-default: its figures are a reference for what better predictions of use buy,
not a bound on what any scheduler can reach.

Arguments (:class:`OracleArgs`): ``fill`` (default 0.5) and ``mem_guard`` (default None:
the simulator's ``overload_threshold``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, SchedulerContext, check_float

if TYPE_CHECKING:
    from fedsched.common.sim.replay.simulator import ReplaySimulator

ORACLE = "oracle"
GUARD_OFFSET = 1000.0  # below every node that keeps the memory guard (cpu_after < 1000)


@dataclass(frozen=True)
class OracleArgs(SchedulerArgs):
    """The oracle's knobs (module docstring)."""

    fill: float = 0.5
    """weight of the projected fill of the node's free requests at the workload's mean use per request"""
    mem_guard: float | None = None
    """expected memory use / capacity a placement must keep (None: the simulator's overload_threshold)"""

    def __post_init__(self) -> None:
        check_float(self, "fill", 0.0, 1.0)
        if self.mem_guard is not None:
            check_float(self, "mem_guard", 0.0, None, lo_open=True)


class Oracle(Scheduler):
    """Least projected expected CPU use, from the hidden usage parameters (module docstring)."""

    name = ORACLE
    Args = OracleArgs
    args: OracleArgs

    def __init__(self, ctx: SchedulerContext | None = None, args: OracleArgs | None = None) -> None:
        super().__init__(ctx, args)
        self.sim: ReplaySimulator | None = None
        self.mem_guard = 0.85
        self.use_per_request = 1.0

    def attach_simulator(self, sim: ReplaySimulator) -> None:
        """Called by ``run_replay`` before the first decision: the simulator, the memory guard
        and the workload's mean CPU use per requested CPU (``L_cpu``). Attaching the attached
        simulator again does nothing (a teacher switching between environments re-attaches)."""
        if sim is self.sim:
            return
        self.sim = sim
        a = self.args
        self.mem_guard = float(sim.config.overload_threshold) if a.mem_guard is None else a.mem_guard
        rows = sim.workload.pod
        cpu, _ = sim.expected_use(rows)
        req = float(sim.pods.cpu[rows].sum())
        self.use_per_request = float(cpu.sum()) / req if req > 0 else 1.0

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        sim = self.sim
        if sim is None:
            raise RuntimeError("the oracle reads the replay simulator's hidden usage: run it through "
                               "run_replay (or call attach_simulator(sim) first)")
        e_cpu, e_mem = sim.expected_use(pod.index)
        load_cpu, load_mem = sim.expected_node_use()
        cap_cpu = state.nodes.cpu[nodes].astype(np.float64)
        cap_mem = state.nodes.mem[nodes].astype(np.float64)
        free_cpu = np.maximum(cap_cpu - state.cpu_req[nodes] - pod.cpu, 0.0)
        risk = (load_cpu[nodes] + e_cpu[0] + self.args.fill * self.use_per_request * free_cpu) / cap_cpu
        mem_after = (load_mem[nodes] + e_mem[0]) / cap_mem
        return np.where(mem_after <= self.mem_guard, -risk, -GUARD_OFFSET - mem_after)
