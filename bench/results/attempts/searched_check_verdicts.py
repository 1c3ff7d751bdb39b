"""Probe (issue 24, item 3): what the packing check decides with ``fedsched serve --search`` on,
per scenario: the check's own simulation (``packing_check._simulate``, 4 workloads) of the search
over the shipped ``learned``, kube-default and FGD, its pool the first ``--pool`` test pods of
the scenario in a seeded order (what an agent would have been asked for), and the choice
``PackingVerdict.choose`` makes among the search and FGD.

    python bench/results/attempts/searched_check_verdicts.py --scenarios cpubound/openb-1,cpubound/openb-7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from agent_quality import scenario_spec

from fedsched.agent.serving.model_store import ModelStore
from fedsched.agent.serving.packing_check import POLICY, PackingVerdict, _simulate
from fedsched.common.compute import single_threaded
from fedsched.common.schedulers import LookaheadArgs
from fedsched.common.sim.evaluate import split
from fedsched.common.sim.portfolio import proven_better


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="cpubound/openb-1")
    ap.add_argument("--pool", type=int, default=1024)
    a = ap.parse_args(argv)
    single_threaded()
    model = ModelStore("learned").current
    for name in a.scenarios.split(","):
        t0 = time.time()
        spec = scenario_spec(name)
        _, test = split(spec)
        pool = test.select(np.sort(np.random.default_rng(0).permutation(len(test))[:a.pool]))
        policy, kube, (fgd,) = _simulate(model, "kube-default", ("fgd",), spec.nodes, pool, 4,
                                         LookaheadArgs())
        v = PackingVerdict(model.version, tuple(policy), tuple(kube), len(pool), len(spec.nodes), False,
                           proven_better(policy, kube)[1], (("fgd", tuple(fgd)),), pool, None,
                           LookaheadArgs().spec())
        print(f"{name}: pool {len(pool)}: search {np.round(policy, 2).tolist()}, kube-default "
              f"{np.round(kube, 2).tolist()}, fgd {np.round(fgd, 2).tolist()}; chosen: "
              f"{v.choose((POLICY, 'fgd')) or 'kube-default (shadow)'}; search vs fgd proven "
              f"{proven_better(policy, list(fgd))}; ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
