"""Attempt (issue 24, the edge guardrail): which pods fail in the online benchmark's edge scenario
(40 nodes, overloaded at its daily peak: about 14% of the test pods wait past the 600 s limit),
counted, by the CPU they requested and by requested core-hours, per policy and seed. Run from the
project root (seeds, policies, scenario)::

    python bench/results/attempts/edge_failed_sizes.py 42,43,44 \\
        kube-default,learned-online,least-allocated,best-fit

Output: ``edge_failed_sizes.txt``. The count and the requested cores disagree: BestFit fails the
most pods and the fewest cores; learned-online more pods than kube-default and fewer cores."""
import sys

import numpy as np

from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.schedulers.base import place
from fedsched.common.sim.evaluate import make_policy, scheduler_context, split
from fedsched.common.sim.replay import ReplayConfig, ReplaySimulator
from fedsched.common.sim.replay.config import FAILED
from fedsched.common.sim.scenarios import SCENARIOS, build

scen = sys.argv[3] if len(sys.argv) > 3 else "edge"
spec = build(SCENARIOS[scen])
train, work = split(spec)
typical = TypicalPods.from_pods(train)
cpu = np.asarray(work.cpu) / 1000.0
dur = np.nan_to_num(np.asarray(work.deletion) - np.asarray(work.creation), nan=0.0) / 3600.0
for seed in [int(s) for s in sys.argv[1].split(",")]:
    for pol in sys.argv[2].split(","):
        sched = make_policy(pol, scheduler_context(train, seed), "replay")
        sim = ReplaySimulator(spec.nodes, work, config=ReplayConfig(**spec.replay_options), seed=seed,
                              typical=typical)
        while (d := sim.next_pod()) is not None:
            pod, state = d
            sim.bind(place(sched, state, pod, sim.rng))
        res = sim.finish()
        f = np.asarray(sim.status) == FAILED
        print(f"{scen} seed {seed} {pol:16s} failed {int(f.sum()):5d} cores {cpu[f].sum():8.1f} "
              f"core-h {np.sum(cpu[f]*dur[f]):9.1f} hot {res.metrics['hot_cpu_node_s']:.0f}", flush=True)
