"""A probe (issue 24, web's throttling): can *any* greedy rule that knows every pod's hidden use
throttle less than kube-default? The oracle (``common/sim/replay/oracle.py``) water-fills each
node's expected *mean* CPU; throttling happens at the daily peak, when a node's demand passes its
capacity. This variant (``oracle-peak``) water-fills the demand a node will have at the peak of the
online classes' cycle instead: per pod ``min(level + amplitude, limit)`` (the usage model's
``_BASE``, ``_AMP``, ``_MAX``; one cluster-wide phase for the online classes), a best-effort pod's
CPU as 0 (the usage model squeezes it into idle CPU: it never throttles another pod), plus ``Z``
standard deviations of the node's summed per-pod noise (``usage_noise_cpu`` x level, independent
per pod), so that a node holding a few large pods counts riskier than one holding many small ones.
Memory stays the oracle's guard on means; the fill term projects the free requests at the
workload's peak use per request. It reads the replay's usage model through private attributes:
a reference point, not a scheduler. Names: ``oracle-peak`` (Z = 0) and ``oracle-peak-zZ``
(e.g. ``oracle-peak-z2``). Run from the project root; it adds its names to
``bench/online_quality.py``::

    python bench/results/attempts/oracle_peak_probe.py --scenarios web --seeds 60 \\
        --policies kube-default,oracle,oracle-peak,oracle-peak-z2 --jobs 2 --json OUT.json
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers import RESOLVERS
from fedsched.common.schedulers.base import Scheduler, SchedulerContext
from fedsched.common.sim.replay import ReplaySimulator
from fedsched.common.sim.replay.oracle import BEST_EFFORT, GUARD_OFFSET, Oracle
from fedsched.common.sim.replay.usage import _AMP, _BASE, _MAX

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, for online_quality
import online_quality


class OraclePeak(Oracle):
    """The oracle's rule on each node's expected peak CPU demand plus ``z`` noise deviations."""

    name = "oracle-peak"

    def __init__(self, ctx: SchedulerContext | None = None, z: float = 0.0) -> None:
        super().__init__(ctx)
        self.z = z

    def attach_simulator(self, sim: ReplaySimulator) -> None:
        if sim is self.sim:
            return
        super().attach_simulator(sim)
        pf = sim.usage._pf
        be = np.asarray(sim.pods.qos) == BEST_EFFORT
        peak = np.minimum(pf[_BASE] + pf[_AMP], pf[_MAX])
        self.peak = np.where(be, 0.0, peak)
        sd = float(sim.config.usage_noise_cpu) * np.minimum(pf[_BASE], pf[_MAX])
        self.var = np.where(be, 0.0, sd ** 2)
        self.mean_mem = sim.expected_use(np.arange(len(sim.pods.cpu)))[1]
        rows = sim.workload.pod
        req = float(sim.pods.cpu[rows].sum())
        self.peak_per_request = float(self.peak[rows].sum()) / req if req > 0 else 1.0

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        sim = self.sim
        if sim is None:
            raise RuntimeError("attach_simulator first")
        peak, load_mem = sim.node_sums(self.peak, self.mean_mem)  # one pass over the bound pods
        p = pod.index
        cap_cpu = state.nodes.cpu[nodes].astype(np.float64)
        cap_mem = state.nodes.mem[nodes].astype(np.float64)
        free_cpu = np.maximum(cap_cpu - state.cpu_req[nodes] - pod.cpu, 0.0)
        demand = peak[nodes] + self.peak[p]
        if self.z:  # the noise term's own pass, only where it counts
            var, _ = sim.node_sums(self.var, self.var)
            demand = demand + self.z * np.sqrt(var[nodes] + self.var[p])
        risk = (demand + self.args.fill * self.peak_per_request * free_cpu) / cap_cpu
        mem_after = (load_mem[nodes] + self.mean_mem[p]) / cap_mem
        return np.where(mem_after <= self.mem_guard, -risk, -GUARD_OFFSET - mem_after)


def resolve(name: str, ctx: SchedulerContext) -> Scheduler | None:
    if name == "oracle-peak":
        return OraclePeak(ctx)
    m = re.fullmatch(r"oracle-peak-z([0-9]+(?:\.[0-9]+)?)", name)
    if m:
        s = OraclePeak(ctx, z=float(m.group(1)))
        s.name = name
        return s
    return None


if __name__ == "__main__":
    RESOLVERS.insert(0, resolve)
    sys.exit(online_quality.main(sys.argv[1:]))
