"""How often a memory hinge at h could act (chosen before ``pol-mem[1,0.7]`` ran): the share of the
shipped policy's decisions on the gate's web validation cluster (2 seeds, ``pol-mem[0]``: the policy
alone) with at least one candidate whose projected memory share (measured memory + the pod's
expected memory, over node memory: ``PolicyMem.term``) passes h. Run from the project root::

    python bench/results/attempts/hinge_reach_probe.py     # about 70 s
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import policy_mem_mix as pm

from fedsched.common.schedulers import RESOLVERS
from fedsched.common.sim.evidence import collect
from fedsched.common.sim.run_cache import RunCache

LEVELS = (0.5, 0.6, 0.7, 0.8)


def main() -> None:
    counts = dict.fromkeys(LEVELS, 0)
    decisions = 0
    term = pm.PolicyMem.term

    def counting(self, state, pod, nodes):
        nonlocal decisions
        t = term(self, state, pod, nodes)
        decisions += 1
        for h in LEVELS:
            counts[h] += bool((-t > h).any())
        return t

    pm.PolicyMem.term = counting
    RESOLVERS.insert(0, pm.resolve)
    t0 = time.time()
    collect("pol-mem[0]", ["web"], seeds=2, jobs=1, cache=RunCache())  # one process: the counts are here
    print(f"{decisions} decisions ({time.time() - t0:.0f} s); share with a candidate past h: "
          + ", ".join(f"{h:g} {counts[h] / decisions:.1%}" for h in LEVELS))


if __name__ == "__main__":
    main()
