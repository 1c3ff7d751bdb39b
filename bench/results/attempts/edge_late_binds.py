"""Attempt (issue 24, the edge guardrail): which pods bind after a long wait in the online
benchmark's edge scenario, kube-default against learned-online: binds, the pending p99 over binds
(the guardrail's figure: failed pods are not in it), binds after more than 500 s and their mean CPU
request, binds of pods of 2 cores or more, failed pods, and the p99 over every arrived pod with a
failed one counted at the 600 s limit. Reads the simulator's private ``_latencies``: a probe, not a
metric. Run from the project root::

    python bench/results/attempts/edge_late_binds.py 42,43,44 kube-default,learned-online

Output: ``edge_late_binds.txt``."""
import sys

import numpy as np

from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.schedulers.base import place
from fedsched.common.sim.evaluate import make_policy, scheduler_context, split
from fedsched.common.sim.replay import ReplayConfig, ReplaySimulator
from fedsched.common.sim.replay.config import FAILED
from fedsched.common.sim.scenarios import SCENARIOS, build

spec = build(SCENARIOS["edge"])
train, work = split(spec)
typical = TypicalPods.from_pods(train)
for seed in [int(s) for s in sys.argv[1].split(",")]:
    for pol in sys.argv[2].split(","):
        sched = make_policy(pol, scheduler_context(train, seed), "replay")
        sim = ReplaySimulator(spec.nodes, work, config=ReplayConfig(**spec.replay_options), seed=seed,
                              typical=typical)
        rec = []
        while (d := sim.next_pod()) is not None:
            pod, state = d
            pl = place(sched, state, pod, sim.rng)
            n0 = len(sim._latencies)
            sim.bind(pl)
            if len(sim._latencies) > n0:
                rec.append((pod.cpu, sim._latencies[-1]))
        res = sim.finish()
        a = np.array(rec)
        late = a[:, 1] > 500
        nf = int((np.asarray(sim.status) == FAILED).sum())
        allw = np.concatenate([a[:, 1], np.full(nf, 600.0)])
        print(f"seed {seed} {pol:16s} binds {len(a)} p99 {np.percentile(a[:,1], 99):.1f} "
              f"late>500s {int(late.sum())} mean cpu late {a[late,0].mean():.0f} all {a[:,0].mean():.0f}; "
              f"binds >=2 cores {int((a[:,0]>=2000).sum())}; failed {nf}; "
              f"p99 all-arrived (failed at 600) {np.percentile(allw, 99):.1f}", flush=True)
