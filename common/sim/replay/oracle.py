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

**How much of its knowledge matters** (``knows``; the evaluation's names
:data:`ORACLE_VARIANTS`): ``"pod"`` (``oracle``) reads every pod's own true mean as above;
``"app"`` (``oracle-app``) replaces each pod's mean by its request times its application's true
mean use per request over all of the application's pods (a perfect per-application estimate,
which observing an application's running pods approaches: ``Telemetry.app_usage``);
``"workload"`` (``oracle-workload``) by its request times the workload's ratio ``L`` (requests
alone, the ranking of a CPU LeastAllocated with the oracle's fill and memory guard). The node
loads are the same sums over the bound pods of those per-pod values. Their gaps to ``oracle``
split its gain into what knowing each pod, knowing each application and its scoring rule alone
are worth. ``"prod"`` (``oracle-prod``) reads every pod's own true mean as ``"pod"`` does, but
counts a best-effort pod's CPU as 0 in every node's load and in ``L_cpu`` (the usage model
squeezes best-effort use into the CPU the node's other pods leave idle, so it never throttles
another pod): the CPU risk is then the expected use of the pods that can be throttled. Its gap
to ``oracle`` says what the best-effort squeeze, which ``oracle`` ignores, is worth.

Arguments (:class:`OracleArgs`): ``fill`` (default 0.5), ``mem_guard`` (default None:
the simulator's ``overload_threshold``) and ``knows`` (default ``"pod"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedsched.common.model.cluster import QOS_CLASSES, ClusterState, Pod
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, SchedulerContext, check_float

if TYPE_CHECKING:
    from fedsched.common.sim.replay.simulator import ReplaySimulator

ORACLE = "oracle"
KNOWS = ("pod", "app", "workload", "prod")
ORACLE_VARIANTS = {ORACLE: "pod", "oracle-app": "app", "oracle-workload": "workload", "oracle-prod": "prod"}
"""The evaluation's names of the oracle and of its variants, with what each knows (``OracleArgs.knows``)."""
BEST_EFFORT = QOS_CLASSES.index("BE")
GUARD_OFFSET = 1000.0  # below every node that keeps the memory guard (cpu_after < 1000)


@dataclass(frozen=True)
class OracleArgs(SchedulerArgs):
    """The oracle's knobs (module docstring)."""

    fill: float = 0.5
    """weight of the projected fill of the node's free requests at the workload's mean use per request"""
    mem_guard: float | None = None
    """expected memory use / capacity a placement must keep (None: the simulator's overload_threshold)"""
    knows: str = "pod"
    """whose true mean use it reads: each pod's (pod), its application's per request (app), the workload's
    (workload), each pod's with best-effort CPU counted as 0 (prod)"""

    def __post_init__(self) -> None:
        if self.knows not in KNOWS:
            raise ValueError(f"OracleArgs.knows = {self.knows!r}: expected one of {', '.join(KNOWS)}")
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
        self.estimate: tuple[np.ndarray, np.ndarray] | None = None  # per PodTable row, when knows != "pod"

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
        cpu, mem = sim.expected_use(rows)
        if a.knows == "prod":
            cpu = np.where(sim.pods.qos[rows] == BEST_EFFORT, 0.0, cpu)
        req = float(sim.pods.cpu[rows].sum())
        self.use_per_request = float(cpu.sum()) / req if req > 0 else 1.0
        self.estimate = None if a.knows == "pod" else self._estimates(sim, rows, cpu, mem)

    def _estimates(self, sim: ReplaySimulator, rows: np.ndarray, cpu: np.ndarray,
                   mem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every PodTable row's use as ``knows`` estimates it: its own true mean with a best-effort
        pod's CPU as 0 (``prod``), or request x the true mean use per
        request of its application (``app``; pods without one, code -1, form one group) or of the
        workload (``workload``), both over the replayed pods (requests of 0 count as 1)."""
        n = len(sim.pods.cpu)
        if self.args.knows == "prod":
            all_cpu, all_mem = sim.expected_use(np.arange(n))
            return np.where(sim.pods.qos == BEST_EFFORT, 0.0, all_cpu), all_mem
        req_cpu = np.maximum(sim.pods.cpu.astype(np.float64), 1.0)
        req_mem = np.maximum(sim.pods.mem.astype(np.float64), 1.0)
        if self.args.knows == "workload":
            groups, n_groups = np.zeros(n, dtype=np.int64), 1
        else:
            _, groups = np.unique(np.asarray(sim.pods.app), return_inverse=True)
            n_groups = int(groups.max()) + 1 if n else 0
        g = groups[rows]
        ratio_cpu = np.bincount(g, cpu, n_groups) / np.maximum(np.bincount(g, req_cpu[rows], n_groups), 1e-12)
        ratio_mem = np.bincount(g, mem, n_groups) / np.maximum(np.bincount(g, req_mem[rows], n_groups), 1e-12)
        return req_cpu * ratio_cpu[groups], req_mem * ratio_mem[groups]

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        sim = self.sim
        if sim is None:
            raise RuntimeError("the oracle reads the replay simulator's hidden usage: run it through "
                               "run_replay (or call attach_simulator(sim) first)")
        if self.estimate is None:
            e_cpu, e_mem = sim.expected_use(pod.index)
            load_cpu, load_mem = sim.expected_node_use()
        else:
            est_cpu, est_mem = self.estimate
            e_cpu, e_mem = est_cpu[[pod.index]], est_mem[[pod.index]]
            load_cpu, load_mem = sim.node_sums(est_cpu, est_mem)
        cap_cpu = state.nodes.cpu[nodes].astype(np.float64)
        cap_mem = state.nodes.mem[nodes].astype(np.float64)
        free_cpu = np.maximum(cap_cpu - state.cpu_req[nodes] - pod.cpu, 0.0)
        risk = (load_cpu[nodes] + e_cpu[0] + self.args.fill * self.use_per_request * free_cpu) / cap_cpu
        mem_after = (load_mem[nodes] + e_mem[0]) / cap_mem
        return np.where(mem_after <= self.mem_guard, -risk, -GUARD_OFFSET - mem_after)
